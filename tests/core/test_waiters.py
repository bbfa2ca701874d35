"""Many callers waiting on one key while its body runs: coalesced within a process (one of them reads the
store on the backoff, the others wait for news), and woken the moment the outcome is recorded here — so the
statements a wait costs do not grow with the number of waiters. Counted through a store wrapper passed with
``Guard(store=...)``: real coroutines, real threads, the real store underneath."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from agentguard import Guard, task
from agentguard.stores import SQLStore

from conftest import tid

pytestmark = pytest.mark.anyio


class Counting:
    """The real store, counting the claims and reads it is asked for (after ``start()``)."""

    def __init__(self, url: str) -> None:
        self.inner = SQLStore(url)
        self.asked: list[str] = []
        self.counting = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, params: dict[str, Any], likely_taken: bool = False) -> Any:
        if self.counting:
            self.asked.append("claim")
        return await self.inner.claim(params, likely_taken)

    async def read(self, scope: str, key: str) -> Any:
        if self.counting:
            self.asked.append("read")
        return await self.inner.read(scope, key)


async def wait_on_one_key(store_url: str, waiters: int, *, cache_size: int = 1024) -> tuple[list[str], list[str]]:
    """``waiters`` callers arrive while the first runs a body held open; returns what they asked of the store
    while the body ran, and after it was recorded."""
    store = Counting(store_url)
    runs: list[int] = []
    started, finish = asyncio.Event(), asyncio.Event()
    async with Guard(store=store, cache_size=cache_size) as guard:  # type: ignore[arg-type]

        @guard.once
        async def charge(amount: int) -> dict[str, int]:
            runs.append(amount)
            started.set()
            await finish.wait()
            return {"amount": amount}

        with task(tid()):
            first = asyncio.create_task(charge(5))
            await started.wait()
            store.counting = True
            others = [asyncio.create_task(charge(5)) for _ in range(waiters)]
            await asyncio.sleep(0.6)  # they wait: each has claimed once; one of them polls
            during, store.asked = store.asked, []
            finish.set()
            results = await asyncio.gather(first, *others)
    assert results == [{"amount": 5}] * (waiters + 1) and runs == [5]
    return during, store.asked


async def test_waiters_share_one_poller_and_replay_from_the_outcome_recorded_here(store_url: str) -> None:
    few_during, few_after = await wait_on_one_key(store_url, 4)
    many_during, many_after = await wait_on_one_key(store_url, 64)
    # Each waiter claimed once on arrival; beyond that, one poller reads on the backoff (about 9 reads in 0.6 s),
    # whatever their number (each on its own backoff, 64 waiters would read about 600 times).
    assert len(few_during) - 4 <= 20 and len(many_during) - 64 <= 20, (len(few_during), len(many_during))
    # The outcome was recorded in this process: every waiter was told, and replayed it without a round trip
    # (but for the poller's read that may have been under way).
    assert len(few_after) <= 1 and len(many_after) <= 1, (few_after, many_after)


async def test_without_the_cache_each_waiter_looks_once_after_the_news(store_url: str) -> None:
    during, after = await wait_on_one_key(store_url, 16, cache_size=0)
    assert len(during) - 16 <= 20
    # One look each (not a poll each on its own backoff), and the poller's read that was already under way.
    assert len(after) <= 16 + 1


async def test_sync_callers_are_woken_across_loops(make_guard: Callable[..., Guard]) -> None:
    """A sync tool waits on the guard's portal loop; the holder completes on the test's loop."""
    guard = make_guard()
    started, finish = threading.Event(), threading.Event()
    runs: list[int] = []

    def body(amount: int) -> int:
        runs.append(amount)
        started.set()
        assert finish.wait(30)
        return amount

    holder = guard.once(operation="charge")(body)
    sync_caller = guard.once(operation="charge")(lambda amount: amount * 100)  # never runs: a replay
    t = tid()

    def call_sync() -> int:
        with task(t):
            return sync_caller(7)  # type: ignore[no-any-return]

    with task(t):
        first = asyncio.create_task(asyncio.to_thread(_in_task, t, holder, 7))
        assert await asyncio.to_thread(started.wait, 30)
        waiters = [asyncio.create_task(asyncio.to_thread(call_sync)) for _ in range(4)]
        await asyncio.sleep(0.3)
        finish.set()
        assert await first == 7 and await asyncio.gather(*waiters) == [7] * 4
    assert runs == [7]


def _in_task(task_id: str, tool: Callable[[int], int], amount: int) -> int:
    with task(task_id):
        return tool(amount)
