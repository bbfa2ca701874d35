"""On SQLite a step hops to aiosqlite's thread only if it could block the event loop: a statement that would sync, or
wait for the write lock. A first call's claim is made on the loop's own thread (``_direct.DirectSQLite.now``:
unsynced at FULL), and so is its completion where it does not sync (NORMAL, OFF); at FULL the completion hops, and
at EXTRA both do (the claim plan's read is made on the loop, its insert in one hop; the completion). A replay that
misses the in-process cache reads the record on the loop's thread (a read in WAL mode never waits for the writer),
so none, as a cached replay. Counted on the queue every aiosqlite call goes through."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiosqlite
import pytest

from agentguard import Guard, task

from conftest import BACKEND, tid

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(BACKEND != "sqlite", reason="SQLite's thread hops")]



@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    seen: list[str] = []
    real = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(getattr(fn, "__name__", type(fn).__name__))
        return await real(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    yield seen


@pytest.mark.parametrize(("synchronous", "first_call_hops"), [
    ("FULL", ["statement"]),  # the synced completion
    ("NORMAL", []),
    ("OFF", []),
    ("EXTRA", ["_advance", "statement"]),  # every commit syncs: the rest of the claim plan, the completion
])
async def test_a_step_hops_only_if_it_could_block_the_loop(store_url: str, hops: list[str], synchronous: str,
                                                          first_call_hops: list[str]) -> None:
    async with Guard(store_url, cache_size=0, sqlite_synchronous=synchronous) as guard, \
            Guard(store_url, sqlite_synchronous=synchronous) as cached:
        runs = 0

        async def body(amount: int) -> int:
            nonlocal runs
            runs += 1
            return amount

        charge = guard.once(operation="charge")(body)
        charge_cached = cached.once(operation="charge")(body)
        with task(tid()):
            await charge(0)  # schema made, connections opened
            await charge_cached(0)
        with task(tid()):
            hops.clear()
            assert await charge(1) == 1
            first, hops[:] = list(hops), []
            assert await charge(1) == 1
            replay, hops[:] = list(hops), []
        with task(tid()):
            assert await charge_cached(2) == 2
            hops.clear()
            assert await charge_cached(2) == 2
            cached_replay = list(hops)
    assert first == first_call_hops
    assert replay == []  # the read on the loop's thread finds the completed record; no hop, no insert
    assert cached_replay == []
    assert runs == 3  # 0, 1 and 2
