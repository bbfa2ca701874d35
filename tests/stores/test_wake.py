"""Waiters in another process woken by the outcome's announcement (Postgres ``LISTEN/NOTIFY``), not by polling:
real separate processes, the real server. The waiters' process makes its fallbacks slow (a minute), so the
statements it sends are counted, not timed: its waiters' first claims, one mark, and the look the
announcement caused — however many waiters there are. If the listening connection is lost, the waiters look
again and listen anew; if none can be made, they poll."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentguard import Guard, task
from agentguard.stores import SQLStore

from conftest import raw_exec, tid

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

WORKER = str(Path(__file__).resolve().parents[1] / "wait_worker.py")


async def _line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout=120)
    assert line, "the waiters' process ended early"
    return line.decode().strip()


async def hold_while_another_process_waits(
    make_guard: Callable[..., Guard], store_url: str, waiters: int, *, drop_listener: bool = False
) -> dict[str, Any]:
    guard = make_guard()
    runs: list[str] = []
    started, finish = asyncio.Event(), asyncio.Event()

    @guard.once(key=["order_id"])
    async def charge(order_id: str) -> dict[str, Any]:
        runs.append(order_id)
        started.set()
        await finish.wait()
        return {"order_id": order_id, "charge": "ch_1"}

    t = tid()
    with task(t):
        holder = asyncio.create_task(charge("o-1"))
        await started.wait()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, WORKER, store_url, t, str(waiters), stdout=subprocess.PIPE
    )
    try:
        assert await _line(proc) == "listening 1"  # its waiters wait, and the record is marked watched
        if drop_listener:
            await raw_exec(store_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                      " WHERE application_name = 'agentguard-listen'")
            assert await _line(proc) == "listening 2"  # looked again, listening anew, marked again
        finish.set()
        assert await holder == {"order_id": "o-1", "charge": "ch_1"}
        report: dict[str, Any] = json.loads(await _line(proc))
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert runs == ["o-1"]
    assert report["results"] == [{"order_id": "o-1", "charge": "ch_1"}] * waiters  # the stored result, each
    return report


@pytest.mark.parametrize("waiters", [4, 32])
async def test_waiters_in_another_process_are_woken_by_the_announcement(
    make_guard: Callable[..., Guard], store_url: str, waiters: int
) -> None:
    report = await hold_while_another_process_waits(make_guard, store_url, waiters)
    asked = report["asked"]
    assert report["heard"] >= 1  # the completion was announced to it
    # Each waiter claimed once on arrival; then one mark, and one look when the announcement came (its replay
    # told the others): the same few statements for 4 waiters as for 32.
    assert asked.count("watch") == 1 and asked.count("read") == 0, asked
    assert asked.count("claim") - waiters <= 1, asked


async def test_a_lost_listener_is_replaced_and_the_waiters_still_get_the_outcome(
    make_guard: Callable[..., Guard], store_url: str
) -> None:
    report = await hold_while_another_process_waits(make_guard, store_url, 8, drop_listener=True)
    asked = report["asked"]
    assert report["heard"] >= 1
    # The loss made the poller look once more and mark again under the new listener.
    assert asked.count("watch") == 2 and asked.count("claim") - 8 <= 2, asked


async def test_without_a_listener_the_waiters_poll(make_guard: Callable[..., Guard], store_url: str) -> None:
    """A second store (as another process has) whose listening connection cannot be made: its waiters poll,
    and still get the stored result."""
    holder_guard = make_guard()
    waiting_store = SQLStore(store_url)

    async def refused() -> Any:
        raise OSError("connection refused")

    waiting_store.dialect.listen_connection = refused  # type: ignore[method-assign]
    runs: list[int] = []
    started, finish = asyncio.Event(), asyncio.Event()

    @holder_guard.once(operation="charge")
    async def holder(amount: int) -> int:
        runs.append(amount)
        started.set()
        await finish.wait()
        return amount

    async with Guard(store=waiting_store) as waiting_guard:

        @waiting_guard.once(operation="charge")
        async def waiter(amount: int) -> int:
            raise AssertionError("a waiter ran the body")

        with task(tid()):
            first = asyncio.create_task(holder(3))
            await started.wait()
            others = [asyncio.create_task(waiter(3)) for _ in range(4)]
            await asyncio.sleep(0.3)  # (they wait; the listener was refused)
            finish.set()
            assert await first == 3 and await asyncio.gather(*others) == [3] * 4
        assert waiting_store._engines.listening() == 0
    assert runs == [3]
