"""SQLite's executors on a stdlib ``sqlite3`` connection of the calling thread (``stores/_direct.py``): a sync
tool's own thread, and an async tool's event loop where a write can be made at once. Their statements and
plans are proved equal to the general path's in tests/whitebox/test_executors.py (and under the state machine,
tests/whitebox/test_stateful_store.py); here, whole guarded calls leave the same records and report the same events
either way, real threads racing on one key run its body once, a claim made in a thread is renewed, and the
waiting policies: a hot write waits for the lock in short sleeps on a thread, never on a loop's thread, whose
commits are checkpointed."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from direct_calls import CALL_ROWS, General, check_whole_sync_calls, whole_sync_calls
from sqlalchemy.engine import make_url

from agentguard import Guard, task
from agentguard.stores import SQLStore
from agentguard.stores._direct import DirectSQLite

from conftest import BACKEND

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(BACKEND != "sqlite", reason="SQLite's shortcut: runs in the SQLite pass")]


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_whole_sync_calls_equal_the_general_path(tmp_path: Path, synchronous: str) -> None:
    def run(name: str, kind: type[SQLStore]) -> tuple[Any, ...]:
        url = f"sqlite+aiosqlite:///{tmp_path / name}.db"
        return whole_sync_calls(kind(url, sqlite_synchronous=synchronous),
                                lambda: sqlite3.connect(make_url(url).database or "").execute(CALL_ROWS).fetchall(),
                                lambda direct: direct is not None and bool(direct._conns))

    assert check_whole_sync_calls(run("direct", SQLStore), run("general", General)) == [False, False]


def test_threads_racing_on_one_key_run_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    guard = Guard(f"sqlite+aiosqlite:///{tmp_path / 'race.db'}", cache_size=0)
    claimed_in: set[str] = set()  # the threads that claimed on a connection of their own
    real_claim = DirectSQLite.claim

    def claim(self: DirectSQLite, params: dict[str, Any], likely_taken: bool = False) -> Any:
        claimed_in.add(threading.current_thread().name)
        return real_claim(self, params, likely_taken)

    monkeypatch.setattr(DirectSQLite, "claim", claim)
    runs: list[int] = []
    barrier = threading.Barrier(16)
    results: list[Any] = []

    @guard.once(key=["order_id"])
    def charge(order_id: str, idempotency_key: str = "") -> str:
        runs.append(1)
        return idempotency_key

    def worker() -> None:
        barrier.wait()
        with task("t-race"):
            results.append(charge("o-1"))

    try:
        with task("t-warm"):
            charge("o-warm")  # (the schema is made on the general path: the shortcut needs it made)
        runs.clear()
        threads = [threading.Thread(target=worker) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(claimed_in - {threading.current_thread().name}) >= 2  # the racers claimed in their own threads
    finally:
        guard.close()
    assert len(runs) == 1 and len(results) == 16 and len(set(results)) == 1


def test_a_long_body_completes_through_the_general_path(tmp_path: Path) -> None:
    """A body longer than a sixth of the lease may have its lease renewed meanwhile: its completion goes
    through the portal, which stops the heartbeat first. The outcome is the same."""
    guard = Guard(f"sqlite+aiosqlite:///{tmp_path / 'long.db'}", lease=0.3)
    done = threading.Event()

    @guard.once(key=["n"])
    def slow(n: int) -> int:
        done.wait(0.2)  # past lease/6 (0.05 s), before lease/3 renewals matter for the outcome
        return n

    try:
        with task("t-long"):
            slow(1)  # (the schema is made on the general path)
            guard._cache.clear()
            assert slow(3) == 3
            guard._cache.clear()
            assert slow(3) == 3  # replayed from the store: the outcome was recorded
    finally:
        guard.close()


def test_a_claim_made_in_its_own_thread_is_renewed_while_its_body_runs(tmp_path: Path) -> None:
    """Handed to the heartbeat at its next tick: the record's lease moves forward while the body still runs."""
    path = tmp_path / "renew.db"
    guard = Guard(f"sqlite+aiosqlite:///{path}", lease=0.6)
    running, finish = threading.Event(), threading.Event()

    @guard.once(key=["n"])
    def held(n: int) -> int:
        if n:
            running.set()
            assert finish.wait(60)
        return n

    def lease_until() -> float:
        row = sqlite3.connect(path).execute("SELECT lease_until FROM agentguard_calls WHERE state = 'running'")
        return float(row.fetchone()[0])

    try:
        with task("t-renew"):
            held(0)  # (the schema is made on the general path)
            caller = threading.Thread(target=lambda: _in_task("t-renew", held, 1))
            caller.start()
            assert running.wait(60)
            first = lease_until()
            for _ in range(3000):  # until a renewal lands (every lease/3 of the body's run)
                if lease_until() > first:
                    break
                threading.Event().wait(0.01)
            assert lease_until() > first
            finish.set()
            caller.join(60)
            assert held(1) == 1
            direct = guard._store.direct()
            assert direct is not None and (caller, "conn") in direct._conns  # claimed in the caller's own thread
    finally:
        finish.set()
        guard.close()


def _in_task(task_id: str, tool: Any, n: int) -> Any:
    with task(task_id):
        return tool(n)


def test_a_hot_write_waits_for_the_write_lock_and_other_errors_pass_at_once(tmp_path: Path) -> None:
    """``_aiosqlite.written`` (every hot write on SQLite): a write lock held by another connection is waited
    for in short sleeps and the write lands once it is released; any other error is raised at once, and the
    connection's own busy timeout is restored either way."""
    from agentguard.stores._aiosqlite import BUSY_MS, written

    path = tmp_path / "w.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode = WAL")
    holder.execute("CREATE TABLE t (x INTEGER)")
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(written(writer, "INSERT INTO t VALUES (2) RETURNING x", ())))
    thread.start()
    thread.join(0.2)  # (it waits for the lock meanwhile)
    holder.execute("COMMIT")
    thread.join(60)
    assert done == [[(2,)]]
    assert sorted(r[0] for r in holder.execute("SELECT x FROM t")) == [1, 2]
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        written(writer, "INSERT INTO missing VALUES (1)", ())
    assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == BUSY_MS
    holder.close()
    writer.close()


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
async def test_an_async_call_never_blocks_its_loop_on_the_write_lock(tmp_path: Path, synchronous: str) -> None:
    """Another connection holds SQLite's write lock: an async tool's claim (and, at NORMAL, its completion)
    cannot be made at once on the loop's thread, so it hops to aiosqlite's thread and waits there while the
    loop runs on. The holder lets go only after the loop has ticked 20 times while the call waited: a
    statement that blocked the loop would hold it until its 30 s give-up, and fail."""
    path = tmp_path / "l.db"
    guard = Guard(f"sqlite+aiosqlite:///{path}", sqlite_synchronous=synchronous, ledger=False)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    runs: list[str] = []
    ticks: list[int] = []
    letting_go: list[asyncio.Task[None]] = []

    def hold() -> None:
        """Take the write lock now; let it go after 20 ticks of the loop."""
        holder.execute("BEGIN IMMEDIATE")

        async def tick_then_let_go() -> None:
            for _ in range(20):
                await asyncio.sleep(0.002)
                ticks.append(1)
            holder.execute("COMMIT")

        letting_go.append(asyncio.ensure_future(tick_then_let_go()))

    @guard.once(key=["order_id"])
    async def charge(order_id: str) -> str:
        runs.append(order_id)
        if order_id != "o-warm":
            hold()  # the completion meets the lock
        return order_id

    try:
        with task("t-warm"):
            await charge("o-warm")  # (the schema made)
        hold()  # the claim meets the lock
        with task("t-1"):
            assert await charge("o-1") == "o-1"
        await asyncio.gather(*letting_go)
        assert len(letting_go) == 2 and len(ticks) == 40 and runs == ["o-warm", "o-1"]
        guard._cache.clear()
        with task("t-1"):
            assert await charge("o-1") == "o-1" and runs == ["o-warm", "o-1"]  # replayed from the store
    finally:
        holder.close()
        await guard.aclose()


def _charging(guard: Guard, runs: list[str]) -> Callable[[str], Awaitable[str]]:
    """A guarded async tool that notes each run in ``runs``, called in a task of its own per order."""

    @guard.once(key=["order_id"])
    async def charge(order_id: str) -> str:
        runs.append(order_id)
        return order_id

    async def call(order_id: str) -> str:
        with task(f"t-{order_id}"):
            return await charge(order_id)

    return call


@pytest.mark.parametrize("sent", ["comes back", "is cancelled"])
async def test_a_writer_the_line_sent_to_the_general_path_is_not_overtaken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sent: str) -> None:
    """The lock held past ``AT_ONCE_WAIT``, the loop's line sends its writer (A's claim) to the general path, held
    there. The lock free again, a writer arriving (B's claim) could be made at once; it waits in line until A's
    is back, so that callers whose writes are made at once do not go round after round while those sent away wait
    for a connection (under CPU load, 256 callers on a small pool: one made 46 calls where the median was 13).
    A cancelled there leaves the line as well."""
    path = tmp_path / "h.db"
    guard = Guard(f"sqlite+aiosqlite:///{path}", sqlite_synchronous="NORMAL", ledger=False)
    store: Any = guard._store
    runs: list[str] = []
    sent_away, go = asyncio.Event(), asyncio.Event()
    claim = store._executor.claim

    async def held_there(plan: Any) -> Any:
        sent_away.set()
        await go.wait()
        return await claim(plan)

    call = _charging(guard, runs)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        await call("warm")  # (the schema made)
        line = store.direct().line()
        monkeypatch.setattr(store._executor, "claim", held_there)
        holder.execute("BEGIN IMMEDIATE")
        a = asyncio.ensure_future(call("a"))
        await asyncio.wait_for(sent_away.wait(), 30)
        holder.execute("COMMIT")
        # (a writer coming while the line hops is sent too, behind A: B comes after)
        await asyncio.sleep(line.hop_until - asyncio.get_running_loop().time() + 0.01)
        b = asyncio.ensure_future(call("b"))
        for _ in range(1000):  # until B's claim is made at once (its body runs next) or B waits in line
            if runs[1:] or line.waiting:
                break
            await asyncio.sleep(0)
        assert runs == ["warm"] and line.waiting == 1 and line.hopped == 1
        if sent == "comes back":
            go.set()
            assert await asyncio.gather(a, b) == ["a", "b"] and runs == ["warm", "a", "b"]
        else:
            a.cancel()
            assert await b == "b" and runs == ["warm", "b"]
            with pytest.raises(asyncio.CancelledError):
                await a
        assert line.hopped == 0 and line.back.is_set() and line.waiting == 0
    finally:
        holder.close()
        await guard.aclose()


async def test_a_replay_is_read_at_once_while_writers_wait_in_line(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim's reads are made on the loop's thread outside its line of writers (a read never waits for the
    writer): with the write lock held elsewhere and a first call waiting in line for it, a replay is answered at
    once, without waiting behind that writer; the writer goes on once the lock comes free. (Before, the replay
    queued in the line and was answered only once the writer left it.)"""
    path = tmp_path / "r.db"
    monkeypatch.setattr("agentguard.stores._direct.AT_ONCE_WAIT", 600.0)  # (the writer stays in line)
    guard = Guard(f"sqlite+aiosqlite:///{path}", sqlite_synchronous="NORMAL", ledger=False, cache_size=0)
    runs: list[str] = []

    call = _charging(guard, runs)
    holder = sqlite3.connect(path, isolation_level=None)
    writer = replay = None
    try:
        assert await call("done") == "done"
        line = guard._store.direct().line()  # type: ignore[attr-defined]
        holder.execute("BEGIN IMMEDIATE")
        writer = asyncio.ensure_future(call("new"))
        for _ in range(10_000):
            if line.waiting:
                break
            await asyncio.sleep(0)
        assert line.waiting == 1 and not writer.done()
        replay = asyncio.ensure_future(call("done"))
        for _ in range(100):
            if replay.done():
                break
            await asyncio.sleep(0)
        assert replay.done() and replay.result() == "done", "the replay waited in line behind the writer"
        assert not writer.done() and line.waiting == 1 and runs == ["done"]
        holder.execute("COMMIT")
        assert await asyncio.wait_for(writer, 60) == "new" and runs == ["done", "new"]
    finally:
        for t in (writer, replay):
            if t is not None and not t.done():
                t.cancel()
        holder.close()
        await guard.aclose()


@pytest.mark.parametrize("tool", ["async", "sync"])
async def test_commits_made_at_once_or_in_a_sync_tools_thread_are_checkpointed(tmp_path: Path, tool: str) -> None:
    """Neither an event loop's connection nor a sync tool's thread's checkpoints (a checkpoint syncs the database
    file: a stall of whichever call crossed the threshold); one runs on a thread of its own every
    ``CHECKPOINT_EVERY`` of their commits, even for a caller that never suspends, and past ``WAL_RESTART_FRAMES``
    it starts the WAL again from its beginning: without, 6,000 back-to-back first calls leave about 170 MB of
    it, with, about 70 MB (a bound of twice the restart size: the WAL grows on until a checkpoint sees it past)."""
    from agentguard.stores._direct import WAL_RESTART_FRAMES

    path = tmp_path / "c.db"
    guard = Guard(f"sqlite+aiosqlite:///{path}", sqlite_synchronous="NORMAL", ledger=False, cache_size=0)

    @guard.once(key=["order_id"])
    async def charge(order_id: str) -> str:
        return order_id * 20

    @guard.once(key=["order_id"])
    def charge_sync(order_id: str) -> str:
        return order_id * 20

    def calls() -> None:
        for i in range(6000):
            with task(f"t-{i}"):
                charge_sync(f"o-{i}")

    try:
        if tool == "sync":
            await asyncio.to_thread(calls)
        else:
            for i in range(6000):
                with task(f"t-{i}"):
                    await charge(f"o-{i}")
        wal = path.with_name(path.name + "-wal").stat().st_size
        assert wal < 2 * WAL_RESTART_FRAMES * 4096, wal
        direct = guard._store.direct()
        assert isinstance(direct, DirectSQLite)
        assert ("conn" if tool == "sync" else "loop") in {role for (_, role) in direct._conns}
        for conn in direct._conns.values():
            assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    finally:
        await guard.aclose()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM agentguard_calls WHERE state = 'succeeded'").fetchone()[0] == 6000


async def test_the_ledgers_batches_leave_checkpoints_to_the_checkpoint_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger writer's batches commit on the engine's connections, which checkpoint only past
    ``ENGINE_CHECKPOINT_FRAMES``: at SQLite's default of 1,000 frames the batch whose commit crossed it copied the WAL
    into the database and synced it, on top of the checkpoint thread's work (a caller's time, on one CPU). Past that
    size an engine's commit does checkpoint: the net for a file whose checkpoint thread has no commits to count."""
    from agentguard.stores import _direct

    monkeypatch.setattr(_direct, "CHECKPOINT_EVERY", 10**9)  # the thread never runs: only the engine could checkpoint
    path = tmp_path / "l.db"
    wal = path.with_name(path.name + "-wal")
    guard = Guard(f"sqlite+aiosqlite:///{path}", sqlite_synchronous="NORMAL", cache_size=0)
    calls = 0

    @guard.once(key=["order_id"])
    async def charge(order_id: str) -> str:
        return order_id * 20

    def frames() -> int:  # (no checkpoint: the WAL only grows)
        data = wal.read_bytes() if wal.exists() else b""
        return (len(data) - 32) // (int.from_bytes(data[8:12], "big") + 24) if len(data) > 32 else 0

    async def until(past: int) -> None:
        nonlocal calls
        while frames() <= past:
            with task(f"t-{calls // 100}"):
                for _ in range(50):
                    await charge(f"o-{calls}")
                    calls += 1

    try:
        await until(1500)  # past SQLite's default (1,000), short of the net
        before = path.read_bytes()
        await guard.flush_ledger()
        assert path.read_bytes() == before  # the batch's commit copied nothing into the database
        await until(_direct.ENGINE_CHECKPOINT_FRAMES)
        await guard.flush_ledger()
        assert path.read_bytes() != before  # ... and past the net it did
        assert guard.ledger_dropped == 0
    finally:
        await guard.aclose()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM agentguard_attempts").fetchone()[0] == calls


# -- the edges the suite's timing reaches only sometimes, made to happen ----------------------------------------


async def _direct_of(path: Path) -> tuple[SQLStore, DirectSQLite]:
    store = SQLStore(f"sqlite+aiosqlite:///{path}", sqlite_synchronous="NORMAL")
    await store.ensure_schema()
    direct = store.direct()
    assert isinstance(direct, DirectSQLite)
    return store, direct


async def test_a_loops_new_connection_that_meets_the_lock_is_closed_and_the_statement_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new connection's opening pragmas read the schema: on a loop's thread, a lock held there (another
    connection's exclusive one here; a WAL recovery in production) never waits. The connection is closed, never
    kept half set up, and the statement is refused as busy (another executor makes it); once the lock is gone,
    the next statement opens the loop's connection and is made at once."""
    from agentguard.stores._direct import BUSY_NOW
    from agentguard.stores._verbs import asks, key_params

    path = tmp_path / "o.db"
    store, direct = await _direct_of(path)
    await store._engines.dispose()  # (a connection open elsewhere keeps the exclusive lock from being taken)
    opened: list[sqlite3.Connection] = []
    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: opened.append(connect(*a, **k)) or opened[-1])
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("SELECT count(*) FROM agentguard_calls").fetchall()
        read = asks(store.sql).read
        assert direct.now(read, key_params("default", "k")) is BUSY_NOW
        assert getattr(direct._local, "loop", None) is None and not direct._conns  # nothing kept
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            opened[-1].execute("SELECT 1")
        holder.execute("ROLLBACK")
        holder.execute("PRAGMA locking_mode = NORMAL")
        holder.execute("SELECT 1 FROM agentguard_calls").fetchall()  # (the exclusive lock is let go on a read)
        holder.close()
        assert direct.now(read, key_params("default", "k")) is None  # made at once: no such record
        assert list(direct._conns) == [(threading.current_thread(), "loop")]
    finally:
        holder.close()
        direct.close()
        await store.dispose()


async def test_a_loop_statement_failing_otherwise_than_busy_is_left_to_the_general_path(tmp_path: Path) -> None:
    """Anything but SQLite's lock on a loop's connection (here the connection unusable: closed under it) is
    not decided there: NOT_NOW, and the general path makes the statement, with its own errors."""
    from agentguard.stores._direct import NOT_NOW
    from agentguard.stores._verbs import asks, key_params

    store, direct = await _direct_of(tmp_path / "e.db")
    try:
        read = asks(store.sql).read
        assert direct.now(read, key_params("default", "k")) is None
        direct._local.loop.close()
        assert direct.now(read, key_params("default", "k")) is NOT_NOW
    finally:
        direct.close()
        await store.dispose()


async def test_a_checkpoint_that_fails_is_left_to_the_next(tmp_path: Path) -> None:
    """A checkpoint that fails (here: its database cannot be opened) raises nothing on its thread and leaves the
    next to be started (the writers a restarting one paused are let go however it ends:
    tests/whitebox/test_lock_handoff.py)."""
    store, direct = await _direct_of(tmp_path / "k.db")
    try:
        direct._checkpointing = True
        direct._cargs = (str(tmp_path / "no-such-folder" / "k.db"),)  # (the checkpoint's connection fails)
        await asyncio.to_thread(direct._checkpoint)
        assert not direct._checkpointing and direct.waiters.held == 0
    finally:
        direct.close()
        await store.dispose()
