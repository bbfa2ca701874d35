"""Steady under load: many callers on a small pool are all served, in turn — none starves while a few busy
callers take every freed connection, and none fails with the pool's timeout. Real concurrency (coroutines on
one loop sharing one pool), counts not times."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import event

from agentguard import Guard, task
from agentguard.stores import _lane

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


def _lane_and_pool(guard: Guard) -> tuple[Any, Any]:
    """The running loop's hot-path lane and its engine's pool."""
    engines = guard._store._engines  # type: ignore[attr-defined]
    engine, lane = engines.here()
    return lane, engine.sync_engine.pool


async def _burst(charge: Callable[[str], Awaitable[str]], tag: str, callers: int, calls: int) -> None:
    ids = iter(range(10**9))

    async def caller() -> None:
        for _ in range(calls):
            i = next(ids)
            with task(f"{tag}-{i}"):
                assert await charge(f"o-{i}") == f"o-{i}"

    await asyncio.gather(*(caller() for _ in range(callers)))


async def test_a_busy_lane_keeps_its_connections(make_guard: Callable[..., Guard],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a steady load no connection is closed and opened again: the lane keeps what it checked out while
    it is used (before, every connection beyond two idle went back to the pool between statements, which
    closed it beyond its size, and a busy process reopened dozens a second, each a new server backend)."""
    monkeypatch.setattr(_lane, "IDLE_KEEP", 3600.0)  # none ages during the test, however slow the machine
    # The default pool: 10 + 20 overflow (SQLite: 5 + 10, its synced completions hop through the lane). A budget
    # beyond it: a connection closed for a caller waiting for a slot (the budget's shedding,
    # tests/whitebox/test_pgbouncer.py) is not what this test is about.
    guard = make_guard(max_connections=100)

    @guard.once(key=["order_id"])
    async def charge(order_id: str) -> str:
        return order_id

    tag = uuid.uuid4().hex[:8]
    await _burst(charge, tag + "w", 1, 1)  # the store made, the loop's engine open
    lane, pool = _lane_and_pool(guard)
    opened: list[object] = []

    def on_connect(*_: object) -> None:
        opened.append(None)

    event.listen(pool, "connect", on_connect)
    try:
        await _burst(charge, tag, 64, 20)
    finally:
        event.remove(pool, "connect", on_connect)
    assert len(opened) <= lane.capacity, (len(opened), lane.capacity)


async def test_idle_connections_go_back_to_the_pool_after_a_burst(make_guard: Callable[..., Guard],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """After a burst, the connections idle beyond the few most recently used go back to the pool (which closes
    its overflow): a quiet process does not hold the pool's every connection."""
    monkeypatch.setattr(_lane, "IDLE_KEEP", 0.05)
    guard = make_guard(pool_size=2, sqlite_synchronous="OFF")

    @guard.once(key=["order_id"])
    async def charge(order_id: str) -> str:
        return order_id

    await _burst(charge, uuid.uuid4().hex[:8], 64, 5)
    lane, pool = _lane_and_pool(guard)
    for _ in range(400):  # each pass waits for the trim timer, whenever the loop runs it
        if len(lane.idle) <= _lane.IDLE_MIN and lane.held <= _lane.IDLE_MIN:
            break
        await asyncio.sleep(0.05)
    assert len(lane.idle) <= _lane.IDLE_MIN and lane.held <= _lane.IDLE_MIN, (len(lane.idle), lane.held)
    assert pool.checkedout() == lane.held  # the rest were given back to the pool


async def test_the_lane_idle_connections_never_keep_the_general_path_waiting(
        make_guard: Callable[..., Guard], monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane holding every connection the pool allows, all idle: a statement of the general path (a sweep)
    gets a connection at once — one idle connection goes back to the pool first — instead of waiting for the
    pool's timeout."""
    monkeypatch.setattr(_lane, "IDLE_KEEP", 3600.0)
    guard = make_guard(pool_size=1)  # 1 + 2 overflow (SQLite: its synced completions hop through the lane)

    @guard.once(key=["order_id"])
    async def charge(order_id: str) -> str:
        return order_id

    tag = uuid.uuid4().hex[:8]
    await _burst(charge, tag, 64, 2)
    lane, pool = _lane_and_pool(guard)
    # Every connection the pool allows taken by the lane's statements, then given back to it (a burst of
    # statements that are not gathered does this; claims and completions gather past the pool's own size).
    engine = guard._store._engines.here()[0]  # type: ignore[attr-defined]
    for conn in [await lane.acquire(engine) for _ in range(lane.capacity - lane.held + len(lane.idle))]:
        await lane.release(conn, sound=True)
    assert lane.held == lane.capacity == len(lane.idle), (lane.held, len(lane.idle))
    assert pool.checkedout() == lane.capacity  # the pool has nothing left to hand out
    # Well within the pool's own 30 s timeout: a sweep that waited for it would fail here.
    assert await asyncio.wait_for(guard._store.sweep(), timeout=20) >= 0
    assert len(lane.idle) == lane.capacity - 1
