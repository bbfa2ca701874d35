"""SQLite without a hop: the store's statements on a stdlib ``sqlite3`` connection of the calling thread — a sync
tool's own thread (the ``Direct`` verbs), or an event loop's thread for a statement that can be made at once
(``SQLStore``'s claim and completion) — no hop to the guard's portal loop, none to an aiosqlite thread.

Two executors of the same statements, each with its waiting policy, never a decision of its own: they run the
store's statements (compiled from its ``Statements``, as aiosqlite's are), its claim plans (``_claims``) and
verbs (``_verbs``), with the unsynced claim at ``synchronous=FULL`` (``_aiosqlite.statement``), and answer what
the general path answers; ``tests/whitebox/test_executors.py`` proves them equal, statement by statement and plan by
plan. A failure in a sync tool's thread is a ``StoreError`` as the store would raise it; the caller then asks
the store the same verb (the same statements, the same parameters), which decides (retries, fails closed).

Every connection here is opened with a busy timeout of 0: a hot write waits for SQLite's write lock in
``_aiosqlite.written``'s short sleeps, never in the busy handler's (and sets no pragma around each statement).

- In a sync tool's thread (:meth:`DirectSQLite._fetch`), a statement blocks that thread only, as the tool
  itself does: it waits for the write lock there.
- On an event loop's thread (:meth:`DirectSQLite.now`), a statement must not block the loop: it is made only if
  it cannot wait. It takes the write lock at once or is refused (SQLITE_BUSY: the caller waits in the loop's
  line, or hops to aiosqlite's thread, which waits); it never syncs (a claim's insert is made here only where it
  commits unsynced, or at ``NORMAL``/``OFF``; another write only at ``NORMAL``/``OFF``). Such a statement costs
  about what a read does, a few tens of µs, and as a synchronous call it cannot be split by a cancellation.
  What is refused goes on where it stopped: the plan, at the statement refused, to aiosqlite's thread
  (``Executor.claim``).

Neither kind of caller checkpoints (a checkpoint copies pages into the database and, at ``NORMAL`` or ``FULL``,
syncs it: a stall of the call that happened to cross SQLite's threshold). ``wal_autocheckpoint`` is 0 on every
connection here; every ``CHECKPOINT_EVERY`` commits made here, a checkpoint runs on a short-lived thread of its
own, which no loop need schedule, so a caller whose calls never suspend still gets its WAL checkpointed. The
engine's connections (the ledger writer's batches among them) leave checkpoints to that thread too: theirs start
only past ``ENGINE_CHECKPOINT_FRAMES``, twice the size at which the thread restarts the WAL, so they checkpoint only
a file whose thread has had no commits to count.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite
from sqlalchemy.engine import make_url

from .._errors import StoreError
from .._fork import abandon
from ._aiosqlite import HANDOFF_MAX, Unsynced, Waiters, busy, patiently
from ._claims import Ask, Plan
from ._statements import Compiled, Statements
from ._verbs import Plans, SyncVerbs

T = TypeVar("T")

CHECKPOINT_EVERY = 300  # commits made here (any thread) between two checkpoints (about 1,000 WAL pages)
CHECKPOINT_WAIT = 2.0  # seconds a restarting checkpoint waits for the writer of the moment (and readers)
AT_ONCE_WAIT = 0.05  # seconds an event loop's write tries again for SQLite's write lock before it hops
# WAL frames (pages written: about 64 MB) past which a checkpoint restarts the WAL, holding writers off while it
# copies the rest and syncs (milliseconds, more as the file grows). Below it a WAL starts again by itself whenever
# the writes pause as a checkpoint ends, as an agent's calls do between its model's turns; at 4,000 frames bursts of
# first calls with short pauses still met a restart every few hundred calls (docs/benchmarks.md, "The WAL restarted
# past 16,000 frames").
WAL_RESTART_FRAMES = 16000
# The engine's connections (aiosqlite's: the ledger's batches, hops, sweeps, steps) checkpoint only past this many
# WAL frames: a net for a file whose checkpoint thread has no commits to count, never the cadence (see ``_dialects``)
ENGINE_CHECKPOINT_FRAMES = 2 * WAL_RESTART_FRAMES


class NotNow:
    """A statement an event loop's thread could not make at once. ``busy``: for SQLite's write lock (held by
    another connection, or a write of this store waits for it): the caller may try again shortly, yielding
    the loop meanwhile (``DirectSQLite.at_once``); otherwise it hops (the general path), which decides."""

    __slots__ = ("busy",)

    def __init__(self, busy: bool) -> None:
        self.busy = busy


NOT_NOW, BUSY_NOW = NotNow(False), NotNow(True)


class Line:
    """An event loop's writers waiting for SQLite's write lock, in the order they came (``DirectSQLite.at_once``),
    and those of them it sent to the general path, still there (``DirectSQLite.hop``)."""

    __slots__ = ("back", "hop_until", "hopped", "lock", "waiting")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()  # (its waiters are woken first come first served)
        self.waiting = 0  # writers in line, the one trying included: a writer arriving now joins them
        self.hop_until = 0.0  # the loop's time until which the line hops instead (the lock was held long)
        self.hopped = 0  # writers the line sent to the general path, not back yet: a writer arriving now waits
        self.back = asyncio.Event()  # set while none is (the first in line waits for it before it tries)
        self.back.set()


def _at_once(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> None:
    conn.execute(sql, args)


class DirectSQLite(SyncVerbs):
    """The store's statements of one SQLite file, each on the calling thread's own connection: the ``Direct`` verbs
    in a sync tool's thread, and a statement made at once on an event loop's (:meth:`now`)."""

    def __init__(self, url: str, synchronous: str, sql: Statements, plans: Plans, compiled: Callable[[Any], Compiled],
                 claim_unsynced: bool, error: Callable[[str, BaseException, bool | None], StoreError],
                 waiters: Waiters) -> None:
        super().__init__(sql, plans)
        self._cargs, self._cparams = SQLiteDialect_aiosqlite().create_connect_args(make_url(url))
        self._synchronous = synchronous.upper()
        self._claim_unsynced = claim_unsynced
        self.completes_now = self._synchronous in ("OFF", "NORMAL")  # (a write on a loop never syncs)
        self.claims_now = self.completes_now or claim_unsynced
        self._error = error
        self._compiled = compiled
        self._local = threading.local()
        self._conns: dict[tuple[threading.Thread, str], sqlite3.Connection] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.commits = 0  # commits made here (any thread) since the last checkpoint was started
        self._lines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Line] = weakref.WeakKeyDictionary()
        self.waiters = waiters  # (the dialect's: every write of the store that waits for the lock)
        self._checkpointing = False

    def _conn(self, role: str = "conn") -> sqlite3.Connection:
        """This thread's connection for ``role`` ("conn": a sync tool's; "loop": an event loop's), opened on first
        use. Neither checkpoints: its commits are counted (:meth:`_committed`) and checkpointed off its thread."""
        held: sqlite3.Connection | None = getattr(self._local, role, None)
        if held is not None and self._pid == os.getpid():
            return held
        if self._pid != os.getpid():  # (forked by a way that ran no at-fork hook)
            self.after_fork()
        # check_same_thread off only so that close() may close them all; each is used by its own thread.
        connect: Any = sqlite3.connect  # (its typed overloads do not take the dialect's parameters as a dict)
        conn: sqlite3.Connection = connect(*self._cargs, **{**self._cparams, "isolation_level": None, "timeout": 0})
        try:
            # The engine's pragmas (``_dialects.SQLite.set_up``); the file is in WAL mode already (the schema). A
            # new connection's first statement reads the schema, and may find the lock busy for a moment (another
            # connection recovering the WAL index, a checkpoint restarting the WAL): waited out in a sync tool's
            # thread as a write is; on a loop's thread never (``now`` leaves the statement to another executor).
            run = patiently if role == "conn" else _at_once
            run(conn, "PRAGMA busy_timeout = 0", ())
            run(conn, f"PRAGMA synchronous = {self._synchronous}", ())
            run(conn, "PRAGMA wal_autocheckpoint = 0", ())  # (checkpoints run on a thread of their own)
        except BaseException:
            conn.close()
            raise
        setattr(self._local, role, conn)
        with self._lock:
            for key in [k for k in self._conns if not k[0].is_alive()]:  # left by threads that ended
                self._conns.pop(key).close()
            self._conns[(threading.current_thread(), role)] = conn
        return conn

    def connected(self) -> bool:
        """Whether any thread has a connection open here."""
        return bool(self._conns)

    def after_fork(self) -> None:
        """In a forked child: the connections opened before the fork are neither used nor closed (SQLite's rule:
        closing one here may clean up under the parent), only abandoned (``_fork``); each thread opens its own."""
        abandon(self._conns, self._local)
        self._pid, self._local, self._conns = os.getpid(), threading.local(), {}
        self._checkpointing = False
        self._lock = threading.Lock()  # (a lock held by another thread at the fork stays held in the child)
        self._lines = weakref.WeakKeyDictionary()
        self.commits = 0

    def _fetch(self, ask: Ask, params: dict[str, Any]) -> Any:
        """``ask`` in a sync tool's thread: its first row, or None. The write lock is waited for here, in short
        sleeps (``_aiosqlite.patiently``: the connection's busy handler never waits); a read is retried so too (a
        WAL read may find the lock busy for a moment, while another connection recovers it)."""
        sql, args = self._compiled(ask.stmt)
        conn = self._conn()
        try:
            if ask.claims and self._claim_unsynced:
                with Unsynced(conn):
                    rows = patiently(conn, sql, args(params), self.waiters)
            else:
                rows = patiently(conn, sql, args(params), self.waiters)
        except (sqlite3.Error, OSError) as exc:
            raise self._error(ask.what, exc, ask.body_ran) from exc
        if ask.writes:
            self._committed()
        return rows[0] if rows else None

    def now(self, ask: Ask, params: dict[str, Any]) -> Any:
        """``ask`` on an event loop's thread, if it can be made at once (see the module docstring): its first row,
        None, or ``NOT_NOW``/``BUSY_NOW``. A read is always made; a write only where it never syncs (a claim's
        insert where ``claims_now``, any other where ``completes_now``) and while no write of this store waits
        for the lock on a thread (``Waiters``: it takes its turn)."""
        if ask.writes:
            if not (self.claims_now if ask.claims else self.completes_now):
                return NOT_NOW
            if self.waiters.count:
                return BUSY_NOW
        sql, args = self._compiled(ask.stmt)
        try:
            conn = self._conn("loop")
            if ask.claims and self._claim_unsynced:
                with Unsynced(conn):
                    rows = conn.execute(sql, args(params)).fetchall()  # (all: it ends, it commits)
            else:
                rows = conn.execute(sql, args(params)).fetchall()
        except sqlite3.OperationalError as exc:
            return BUSY_NOW if busy(exc) else NOT_NOW  # (anything but the lock: the general path decides)
        except (sqlite3.Error, OSError):
            return NOT_NOW
        if ask.writes:
            self._committed()
        return rows[0] if rows else None

    def advance_now(self, plan: Plan, *, reads: bool = False) -> Plan | NotNow:
        """As much of a claim plan as can be made at once on an event loop's thread (:meth:`now`, statement by
        statement): ``plan`` once it ended (``reads``: or once its next statement is a write); else
        ``NOT_NOW``/``BUSY_NOW``, the plan waiting at the statement refused (made again later, or by another
        executor)."""
        params = plan.params
        while (ask := plan.ask) is not None and not (reads and ask.writes):
            row = self.now(ask, params)
            if row is NOT_NOW or row is BUSY_NOW:
                return row
            plan.answered(row)
        return plan

    def _committed(self) -> None:
        """A commit made here (on any thread): every ``CHECKPOINT_EVERY`` of them, one checkpoint on a thread of
        its own (one at a time: the count is taken under the lock; an increment lost to a race between threads
        only delays the next checkpoint by a commit)."""
        self.commits += 1
        if self.commits >= CHECKPOINT_EVERY and not self._checkpointing:
            with self._lock:
                if self._checkpointing or self.commits < CHECKPOINT_EVERY:
                    return
                self.commits, self._checkpointing = 0, True
            threading.Thread(target=self._checkpoint, name="agentguard-checkpoint", daemon=True).start()

    def _checkpoint(self) -> None:
        """A passive checkpoint: it copies the WAL into the database while writers go on, and the next writer
        starts the WAL again from its beginning once all of it is copied. Under writes that never pause, all
        of it never is (2,000 back-to-back first calls left 47 MB of it); so past ``WAL_RESTART_FRAMES`` the
        checkpoint restarts the WAL itself: it waits (its busy handler, on this thread) for the writer of the
        moment and holds new writers off while it copies the rest and syncs, and says so (``Waiters.holding``):
        this store's writes that find the lock busy meanwhile wait for its end, told as it ends (on a loop
        yielding: ``DirectSQLite.at_once``). A failure is left to the next checkpoint; one cut off by the process's
        exit is harmless, as any checkpoint is."""
        try:
            connect: Any = sqlite3.connect
            conn: sqlite3.Connection = connect(*self._cargs, **{**self._cparams, "isolation_level": None,
                                                                "timeout": CHECKPOINT_WAIT})
            try:
                _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                if frames > WAL_RESTART_FRAMES:
                    with self.waiters.holding():
                        conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
            finally:
                conn.close()
        except (sqlite3.Error, OSError, TypeError, ValueError):
            pass
        finally:
            with self._lock:
                self._checkpointing = False

    async def at_once(self, attempt: Callable[[], T | NotNow]) -> T | NotNow:
        """``attempt`` (a write on the loop's thread that never waits), made at once if it can be. If SQLite's write
        lock is busy, the writer joins the loop's line (``line``, first come first served, so that a
        writer arriving as the lock comes free never takes it ahead of those already waiting): the first in line
        tries again in short jittered sleeps (0.25 ms doubling to at most 4 ms, as ``_aiosqlite.written`` waits on a
        thread), the others wait their turn. While a long write of this store's holds the lock (a ledger batch, a
        checkpoint restarting the WAL), the first waits for its end (``Waiters.released``). If the lock stays busy
        for ``AT_ONCE_WAIT`` otherwise, BUSY_NOW: the caller hops (:meth:`hop`) and waits on aiosqlite's thread,
        and so does the rest of the line for a while. The line keeps its place
        there: until those it sent are back, a writer arriving joins the line, and its first waits for them
        (else a caller whose writes are made at once would go round after round while callers sent to the
        general path wait for its connections). Cancelled while it waits, it has written nothing."""
        line = self.line()
        got: T | NotNow = BUSY_NOW
        if not line.waiting and not line.hopped:
            got = attempt()
            if not isinstance(got, NotNow) or not got.busy:
                return got
        loop = asyncio.get_running_loop()
        line.waiting += 1
        try:
            async with line.lock:
                delay, deadline = 0.00025, loop.time() + AT_ONCE_WAIT
                while loop.time() >= line.hop_until:
                    if line.hopped:  # (those the line sent ahead to the general path are not overtaken)
                        await line.back.wait()
                        deadline = loop.time() + AT_ONCE_WAIT
                        continue
                    got = attempt()
                    if not isinstance(got, NotNow) or not got.busy:
                        return got
                    if loop.time() >= deadline:  # held long (another process's long write): the line hops a while
                        line.hop_until = loop.time() + AT_ONCE_WAIT
                        break
                    paused = self.waiters.released()
                    if paused is not None:
                        await paused
                        deadline = loop.time() + AT_ONCE_WAIT
                    else:
                        await asyncio.sleep(delay * (0.5 + random.random()))
                        delay = min(delay * 2, HANDOFF_MAX)
        finally:
            line.waiting -= 1
        return got

    async def hop(self, why: NotNow, general: Callable[[], Awaitable[T]]) -> T:
        """``general()``: the rest of a write :meth:`at_once` could not make, on the general path. One the line
        sent there (``why.busy``) holds its place in the line until it is back (``Line.hopped``)."""
        if not why.busy:
            return await general()
        line = self.line()
        line.hopped += 1
        line.back.clear()
        try:
            return await general()
        finally:
            line.hopped -= 1
            if not line.hopped:
                line.back.set()

    def line(self) -> Line:
        """The running loop's line of writers (made on first use; only that loop's thread touches it)."""
        loop = asyncio.get_running_loop()
        line = self._lines.get(loop)
        if line is None:
            line = self._lines[loop] = Line()
        return line

    def close(self) -> None:
        """Close every connection opened here (each thread opens a new one on its next call)."""
        if self._pid != os.getpid():  # (forked by a way that ran no at-fork hook: the parent's, abandoned)
            self.after_fork()
        with self._lock:
            conns, self._conns = self._conns, {}
        self._local = threading.local()
        for conn in conns.values():
            conn.close()
