"""A task that is replaying (its previous call through this guard was a replay, as when a resumed agent
replays its history) asks its next call's claim as a key likely taken: the store reads before it inserts. A
completed record with the same fingerprint is replayed; everything else is decided as any claim decides.

On Postgres the guard does this by itself (a plain read costs less than an insert that finds the key); on
SQLite, whose claim reads first anyway, it is switched on here so that the same rules are proved on both
backends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agentguard import Guard, InProgressError, KeyReuseError, StoreError, task
from agentguard.stores import SQLStore

from conftest import BACKEND, raw_exec, tid

pytestmark = pytest.mark.anyio


class CardDeclined(Exception):
    pass


def reading_guard(make_guard: Callable[..., Guard], **kw: Any) -> tuple[Guard, list[str]]:
    """A guard with no in-process cache (so replays read the store), its read-first path switched on (the
    default on Postgres), and the list of keys whose claim it asked as likely taken (read first)."""
    store = SQLStore(kw.pop("url", None) or make_guard().url)
    assert store.read_is_cheaper is (BACKEND == "postgres")
    store.read_is_cheaper = True  # (before the guard is made: its machine keeps replaying tasks only then)
    guard = make_guard(store=store, cache_size=0, **kw)
    reads: list[str] = []
    claim = store.claim

    async def logged_claim(params: dict[str, Any], likely_taken: bool = False) -> Any:
        if likely_taken:
            reads.append(params["key"])
        return await claim(params, likely_taken)

    store.claim = logged_claim  # type: ignore[method-assign]
    return guard, reads


def tools(
    guard: Guard, runs: list[tuple[str, int]], gate: asyncio.Event | None = None,
    started: asyncio.Event | None = None,
) -> Any:
    @guard.once(key=["order"])
    async def charge(order: str, amount: int, idempotency_key: str = "") -> dict[str, Any]:
        runs.append((order, amount))
        if started is not None:
            started.set()
        if gate is not None:
            await gate.wait()
        if amount < 0:
            raise CardDeclined(f"declined {order}")
        if amount == 0:
            raise ConnectionError("provider down")
        return {"order": order, "amount": amount, "key": idempotency_key}

    return charge


async def test_a_replaying_task_reads_its_history_and_a_new_call_still_runs_once(
    make_guard: Callable[..., Guard],
) -> None:
    writer_runs: list[tuple[str, int]] = []
    writer = tools(make_guard(), writer_runs)
    replayer_guard, reads = reading_guard(make_guard)
    runs: list[tuple[str, int]] = []
    replayer = tools(replayer_guard, runs)
    with task(tid()):
        done = [await writer(f"o-{i}", 100 + i) for i in range(5)]
        assert [await replayer(f"o-{i}", 100 + i) for i in range(5)] == done
        assert runs == [] and len(reads) == 4  # the first replay claims; the four after it read
        fresh = await replayer("o-new", 7)  # one read misses, then the claim runs it
        assert runs == [("o-new", 7)] and len(reads) == 5
        assert await replayer("o-new", 7) == fresh  # the task is not replaying any more: the claim replays
        assert len(reads) == 5
        assert await replayer("o-0", 100) == done[0]  # and now it is again
        assert len(reads) == 6
    assert len(writer_runs) == 5


async def test_reuse_with_other_arguments_is_refused_on_the_read(make_guard: Callable[..., Guard]) -> None:
    writer = tools(make_guard(), [])
    guard, reads = reading_guard(make_guard)
    runs: list[tuple[str, int]] = []
    replayer = tools(guard, runs)
    with task(tid()):
        await writer("o-1", 100)
        await writer("o-2", 200)
        await replayer("o-1", 100)
        with pytest.raises(KeyReuseError) as info:
            await replayer("o-2", 999)
    assert list(info.value.differing) == ["amount"] and "was not run" in str(info.value)
    assert runs == [] and len(reads) == 1


async def test_a_cached_error_replays_from_the_read(make_guard: Callable[..., Guard]) -> None:
    guard, reads = reading_guard(make_guard)
    runs: list[tuple[str, int]] = []

    @guard.once(key=["order"], cache_errors=(CardDeclined,))
    async def charge(order: str, amount: int) -> int:
        runs.append((order, amount))
        if amount < 0:
            raise CardDeclined(f"declined {order}")
        return amount

    with task(tid()):
        assert await charge("o-1", 1) == 1
        with pytest.raises(CardDeclined, match="declined o-2"):
            await charge("o-2", -1)
        assert await charge("o-1", 1) == 1  # a replay: the task is replaying
        with pytest.raises(CardDeclined, match="declined o-2"):
            await charge("o-2", -1)  # the stored error, from the read
    assert len(runs) == 2 and len(reads) == 1


async def test_a_running_record_on_the_read_goes_to_the_claim(make_guard: Callable[..., Guard]) -> None:
    gate, started = asyncio.Event(), asyncio.Event()
    holder_runs: list[tuple[str, int]] = []
    holder = tools(make_guard(), holder_runs, gate, started)
    guard, reads = reading_guard(make_guard, on_conflict="raise")
    runs: list[tuple[str, int]] = []
    replayer = tools(guard, runs)
    waiting_guard, _ = reading_guard(make_guard)
    waiter = tools(waiting_guard, runs)
    t = tid()
    with task(t):
        gate.set()
        await holder("o-1", 100)
        gate.clear()
        started.clear()
        running = asyncio.create_task(holder("o-2", 200))
        await started.wait()
        await replayer("o-1", 100)
        with pytest.raises(InProgressError, match="did not run it"):
            await replayer("o-2", 200)
        assert len(reads) == 1
        await waiter("o-1", 100)
        waited = asyncio.create_task(waiter("o-2", 200))
        await asyncio.sleep(0.2)
        assert not waited.done()  # waiting on the live claim, not running the body
        gate.set()
        assert await waited == await running
    assert runs == [] and len(holder_runs) == 2


async def test_a_released_record_on_the_read_is_taken_over_with_the_same_key(
    make_guard: Callable[..., Guard],
) -> None:
    writer_runs: list[tuple[str, int]] = []
    writer = tools(make_guard(), writer_runs)
    guard, reads = reading_guard(make_guard)
    keys: list[str] = []

    @guard.once(key=["order"])
    async def charge(order: str, amount: int, idempotency_key: str = "") -> dict[str, Any]:
        keys.append(idempotency_key)
        return {"order": order, "amount": amount, "key": idempotency_key}

    with task(tid()):
        await writer("o-1", 100)
        with pytest.raises(ConnectionError):
            await writer("o-2", 0)  # released: the provider was down
        await charge("o-1", 100)
        assert keys == []
        taken = await charge("o-2", 0)
    assert keys == [taken["key"]] and len(reads) == 1
    assert writer_runs == [("o-1", 100), ("o-2", 0)]


async def test_a_record_past_retention_or_deleted_is_claimed_anew(
    make_guard: Callable[..., Guard], store_url: str,
) -> None:
    writer = tools(make_guard(cache_size=0), [])
    guard, reads = reading_guard(make_guard)
    runs: list[tuple[str, int]] = []
    replayer = tools(guard, runs)
    t = tid()
    with task(t):
        await writer("o-1", 100)
        await writer("o-2", 200)
        await writer("o-3", 300)
        # Past retention by the database's clock, as a record gets by waiting: set, not waited for (a record
        # written below with a short retention could lapse before the test reads it on a slow machine).
        await raw_exec(store_url, f"UPDATE agentguard_calls SET expires_at = 0 WHERE task_id = '{t}'")
        await writer("o-1", 100)  # past retention: run anew, and completed again
        await replayer("o-1", 100)  # the replay that makes the task replaying
        await replayer("o-2", 200)  # read: past retention, so the claim restarts it as a new operation
        assert runs == [("o-2", 200)]
        await replayer("o-1", 100)
        await raw_exec(store_url, "DELETE FROM agentguard_calls WHERE operation LIKE '%o-3%'")
        await replayer("o-3", 300)  # read: nothing there (deleted behind the guard's back): claimed, run
    assert runs == [("o-2", 200), ("o-3", 300)] and len(reads) == 2  # o-2, o-3 (o-1 replayed by the claim)


async def test_concurrent_callers_in_a_replaying_task_run_a_new_call_once(
    make_guard: Callable[..., Guard],
) -> None:
    guard, _ = reading_guard(make_guard)
    gate = asyncio.Event()
    runs: list[tuple[str, int]] = []
    charge = tools(guard, runs, gate)
    with task(tid()):
        gate.set()
        await charge("o-1", 100)
        await charge("o-1", 100)  # replaying now
        gate.clear()
        calls = [asyncio.create_task(charge("o-2", 200)) for _ in range(20)]
        await asyncio.sleep(0.2)
        gate.set()
        results = await asyncio.gather(*calls)
    assert runs == [("o-1", 100), ("o-2", 200)]
    assert all(r == results[0] for r in results)


async def test_an_unreachable_store_on_the_read_refuses_to_run_the_tool(
    make_guard: Callable[..., Guard], store_url: str,
) -> None:
    guard, reads = reading_guard(make_guard)
    runs: list[tuple[str, int]] = []
    charge = tools(guard, runs)
    with task(tid()):
        await charge("o-1", 100)
        await charge("o-1", 100)  # replaying now: the next call reads first
        await raw_exec(store_url, "ALTER TABLE agentguard_calls RENAME TO agentguard_calls_away")
        with pytest.raises(StoreError) as info:
            await charge("o-2", 200)
    # (the plan's read, by the executor that met it: the lane's own read, or the plan in one hop on SQLite)
    said = str(info.value)
    assert not info.value.body_ran and ("reading the record" in said or "claiming the key" in said), said
    assert "not run" in said
    assert runs == [("o-1", 100)] and len(reads) == 1
