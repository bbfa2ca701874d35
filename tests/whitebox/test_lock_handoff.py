"""SQLite's write lock handed over within the process (``_aiosqlite.Waiters``): a long write of the store's own
(a batch of the ledger's entries, a checkpoint restarting the WAL) says it holds the lock, and a write of the store
that finds it busy meanwhile is told when it is let go, rather than trying again in sleeps that mostly wake while the
batch still holds it and then sleep past its end. Under sustained first calls of a sync tool at ``NORMAL`` (6,000 a
run, the writer's batches meeting them), the sleeps went from 50–67 a run to 3–7 (docs/benchmarks.md).

Real threads, a real SQLite file, the real ledger writer: its batch is kept holding the lock (its entries' placing,
inside the transaction, waits for the test) until the write it keeps waiting is seen waiting; the test then lets it
go and checks how that write waited. Each case also runs with the batch not announcing itself, as the tree before
did: the write then sleeps (a thread) or never joins the pause (a loop), so the test tells the two apart."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentguard import Guard, task
from agentguard.stores import _aiosqlite, _chain
from agentguard.stores._aiosqlite import Waiters

from conftest import BACKEND

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(BACKEND != "sqlite", reason="SQLite's write lock: runs in the SQLite pass")]

WAIT = 30.0  # seconds any step may take at most (a bound against a hang, never a measure)


def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.001)


class HeldBatch:
    """The ledger writer's next batch kept inside its transaction (the write lock held) until ``let_go()``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, announced: bool) -> None:
        self.holding, self.release = threading.Event(), threading.Event()
        place = _chain.place

        def held_place(entries: Any, heads: Any) -> Any:
            self.holding.set()
            assert self.release.wait(WAIT), "the test never let the batch go"
            return place(entries, heads)

        monkeypatch.setattr(_chain, "place", held_place)
        if not announced:  # (the tree before: the batch holds the lock unannounced)
            monkeypatch.setattr(Waiters, "holding", lambda self: contextlib.nullcontext())

    def let_go(self) -> None:
        self.release.set()


def _counting_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The sleeps a write on a thread takes waiting for the lock (``_aiosqlite``'s own ``time.sleep``)."""
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(_aiosqlite, "time", types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    return slept


@contextlib.contextmanager
def _guard(tmp_path: Path) -> Iterator[Guard]:
    guard = Guard(f"sqlite+aiosqlite:///{tmp_path / 'h.db'}", sqlite_synchronous="NORMAL", cache_size=0)
    try:
        yield guard
    finally:
        guard.close()


@pytest.mark.parametrize("announced", [True, False])
def test_a_sync_tools_write_kept_waiting_by_a_ledger_batch_goes_on_as_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, announced: bool) -> None:
    runs: list[str] = []
    with _guard(tmp_path) as guard:

        @guard.once(key=["order_id"])
        def charge(order_id: str) -> str:
            runs.append(order_id)
            return f"ch-{order_id}"

        batch = HeldBatch(monkeypatch, announced)
        with task("t-warm"):
            charge("warm")  # (the schema made; its entry is the batch held)
        waiters: Waiters = guard._store.dialect.waiters  # type: ignore[attr-defined]
        assert batch.holding.wait(WAIT), "the ledger's batch never began"  # (written within its interval)
        assert waiters.held == (1 if announced else 0)
        slept = _counting_sleeps(monkeypatch)
        got: list[str] = []

        def call() -> None:
            with task("t-1"):
                got.append(charge("o-1"))

        caller = threading.Thread(target=call)
        caller.start()
        try:
            _until(lambda: waiters.count == 1, "the call's claim to wait for the lock")
            if not announced:
                _until(lambda: bool(slept), "the call's claim to sleep")
            assert not got and runs == ["warm"]  # (its claim is not made while the batch holds the lock)
        finally:
            batch.let_go()
            caller.join(WAIT)
        assert got == ["ch-o-1"] and runs == ["warm", "o-1"]
        assert waiters.held == 0 and waiters.count == 0
        if announced:
            assert slept == []  # woken as the batch ended: no sleep at all
        else:
            assert slept  # the control: unannounced, the write slept


@pytest.mark.parametrize("announced", [True, False])
async def test_a_loops_writer_kept_waiting_by_a_ledger_batch_waits_for_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, announced: bool) -> None:
    """An async tool's claim, made at once on the loop's thread, finds the lock held by the batch: the first in
    the loop's line waits on a future resolved as the batch ends (``Waiters.released``), the loop running on."""
    runs: list[str] = []
    with _guard(tmp_path) as guard:

        @guard.once(key=["order_id"])
        async def charge(order_id: str) -> str:
            runs.append(order_id)
            return f"ch-{order_id}"

        batch = HeldBatch(monkeypatch, announced)
        with task("t-warm"):
            await charge("warm")  # (the schema made; its entry is the batch held)
        waiters: Waiters = guard._store.dialect.waiters  # type: ignore[attr-defined]
        line = guard._store.direct().line()  # type: ignore[attr-defined]
        assert await asyncio.to_thread(batch.holding.wait, WAIT), "the ledger's batch never began"
        with task("t-1"):
            call = asyncio.ensure_future(charge("o-1"))
        try:
            for _ in range(100_000):  # (the loop runs on meanwhile: this test's own coroutine among others)
                if line.waiting and (waiters._paused or not announced):
                    break
                await asyncio.sleep(0)
            assert line.waiting == 1 and not call.done() and runs == ["warm"]
            assert len(waiters._paused) == (1 if announced else 0)
        finally:
            batch.let_go()
        assert await asyncio.wait_for(call, WAIT) == "ch-o-1" and runs == ["warm", "o-1"]
        assert waiters._paused == [] and waiters.held == 0 and line.waiting == 0


def test_a_restarting_checkpoint_announces_that_it_holds_the_lock(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint that restarts the WAL holds new writers off while it copies the rest and syncs: it says so
    for as long as it restarts, and not during its passive pass before, which holds nobody off."""
    from agentguard.stores import _direct

    with _guard(tmp_path) as guard:

        @guard.once(key=["order_id"])
        def charge(order_id: str) -> str:
            return order_id

        with task("t-warm"):
            charge("warm")
        direct = guard._store.direct()  # type: ignore[attr-defined]
        held_during: list[tuple[str, int]] = []

        class Recording(Waiters):
            @contextlib.contextmanager
            def holding(self) -> Iterator[None]:
                with super().holding():
                    held_during.append(("restart", self.held))
                    yield

        monkeypatch.setattr(direct, "waiters", Recording())
        for frames, expected in ((10**9, []), (-1, [("restart", 1)])):
            held_during.clear()
            monkeypatch.setattr(_direct, "WAL_RESTART_FRAMES", frames)
            direct._checkpointing = True
            direct._checkpoint()
            assert held_during == expected and direct.waiters.held == 0 and not direct._checkpointing


async def test_a_long_write_that_fails_lets_every_paused_writer_go() -> None:
    """However a long write ends (here it raises), the loops' writers it paused are resumed — one that stopped
    waiting (cancelled) is left as it is, and nothing is raised on the loop."""
    waiters = Waiters()
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        with pytest.raises(RuntimeError, match="the batch failed"), waiters.holding():
            waiting, gone = waiters.released(), waiters.released()
            assert waiting is not None and gone is not None
            gone.cancel()
            raise RuntimeError("the batch failed")
        await asyncio.wait_for(waiting, WAIT)
        assert gone.cancelled() and waiters.held == 0 and waiters._paused == []
        assert waiters.released() is None and waiters.wait_released(time.monotonic() + WAIT) is False
        await asyncio.sleep(0)  # (the resolutions ran)
        assert errors == []
    finally:
        loop.set_exception_handler(None)


async def test_a_writer_pausing_just_as_the_long_write_ends_goes_on() -> None:
    """The long write ends between a writer's look at it and the writer taking the lock to wait for it: the writer
    is not paused (nobody would resume it)."""
    waiters = Waiters()
    lock = waiters._lock

    class EndsAsTaken:
        def __enter__(self) -> None:
            waiters.held = 0  # (the batch ended just now, on its thread)
            lock.__enter__()

        def __exit__(self, *exc: object) -> None:
            lock.__exit__(*exc)

    waiters.held = 1
    waiters._lock = EndsAsTaken()  # type: ignore[assignment]
    assert waiters.released() is None and waiters._paused == []


def test_a_forked_childs_waiters_are_its_own() -> None:
    """In a forked child the writes that held the lock, and those that waited, were the parent's threads': the
    child's writes never wait for a release that only the parent would announce."""
    waiters = Waiters()
    waiters.held, waiters.count = 1, 2  # (the parent's batch and two of its writes, at the fork)
    waiters._lock.acquire()  # (held by another of the parent's threads: stays held in the child)
    waiters.after_fork()
    assert waiters.held == 0 and waiters.count == 0 and waiters._paused == []
    assert waiters.wait_released(time.monotonic() + WAIT) is False  # (at once, on a lock of its own)
    with waiters.holding():
        assert waiters.held == 1
    assert waiters.held == 0
