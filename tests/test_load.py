"""Steady under load: many callers on a small pool are all served, in turn — none starves while a few busy
callers take every freed connection, and none fails with the pool's timeout. Real concurrency (coroutines on
one loop sharing one pool), counts not times."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import uuid
from collections.abc import Callable

import pytest

from agentguard import Guard, task

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("callers", [64, 256])
async def test_callers_on_a_small_pool_are_served_in_turn(make_guard: Callable[..., Guard], callers: int) -> None:
    guard = make_guard(pool_size=2, sqlite_synchronous="OFF")  # 2 + 4 overflow connections for all of them
    runs: list[str] = []

    @guard.once(key=["order_id"])
    async def charge(order_id: str) -> str:
        runs.append(order_id)
        return order_id

    total = callers * 12
    made = [0] * callers
    errors: list[BaseException] = []
    ids = iter(range(10**9))
    tag = uuid.uuid4().hex[:8]

    async def caller(j: int) -> None:
        while sum(made) < total:
            i = next(ids)
            try:
                with task(f"{tag}-{i // 4}"):
                    assert await charge(f"o-{i}") == f"o-{i}"
            except Exception as exc:  # a StoreError from the pool's timeout would be starvation
                errors.append(exc)
                return
            made[j] += 1

    await asyncio.gather(*(caller(j) for j in range(callers)))
    assert errors == []
    assert len(runs) == len(set(runs)) == sum(made)  # every call ran once
    fair = total / callers  # each caller's share
    # In turn: nobody waited while others ran (before, a few callers made hundreds of calls and most made one).
    assert fair / 3 <= min(made) and max(made) <= fair * 3, (min(made), statistics.median(made), max(made))


async def test_callers_cancelled_while_waiting_for_a_connection_leak_none(make_guard: Callable[..., Guard]) -> None:
    """Client timeouts land everywhere — queued for a connection, checking one out, mid-statement: afterwards
    the pool still serves every caller (a leaked connection or a lost wake-up would leave callers waiting)."""
    guard = make_guard(pool_size=1, sqlite_synchronous="OFF")  # 1 + 2 overflow connections
    runs: list[str] = []

    @guard.once(key=["order_id"])
    async def charge(order_id: str) -> str:
        runs.append(order_id)
        return order_id

    tag = uuid.uuid4().hex[:8]

    async def impatient(i: int) -> None:
        with task(f"{tag}-{i}"), contextlib.suppress(TimeoutError):
            await asyncio.wait_for(charge(f"o-{i}"), timeout=0.0005 * (i % 9))

    for _ in range(3):
        await asyncio.gather(*(impatient(i) for i in range(64)))
    # Every operation still completes, exactly once, with every caller served.
    results = await asyncio.gather(*(_call(charge, f"{tag}-{i}", f"o-{i}") for i in range(64)))
    assert results == [f"o-{i}" for i in range(64)]
    assert sorted(set(runs)) == sorted(runs) and len(runs) == 64


async def _call(tool: Callable[[str], object], task_id: str, order_id: str) -> object:
    with task(task_id):
        return await tool(order_id)  # type: ignore[misc]
