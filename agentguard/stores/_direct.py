"""SQLite without a hop: a sync tool's claim and completion in the caller's own thread, and an async tool's on
its event loop's thread when they can be made at once, each on a stdlib ``sqlite3`` connection of that thread
— no hop to the guard's portal loop, none to an aiosqlite thread.

A shortcut beside the general path it must equal: the same file, the same pragmas, the same statements
(compiled from the store's own ``Statements``), the same read-or-claim (``_aiosqlite.read_or_claim``, with the
unsynced claim at ``synchronous=FULL``), the same answers (``SQLStore.claim`` and ``SQLStore.complete``);
``tests/test_direct.py`` proves them equal. A failure is a ``StoreError`` as the store would raise it; the
engine then hands the call to the general path, which decides (retries, fails closed).

Every connection here is opened with a busy timeout of 0: a hot write waits for SQLite's write lock in
``_aiosqlite.written``'s short sleeps, never in the busy handler's (and sets no pragma around each statement).

- In a sync tool's thread, a statement blocks that thread only, as the tool itself does: it waits for the
  write lock there.
- On an event loop's thread (``*_now``), a statement must not block the loop: it is made only if it cannot
  wait. It takes the write lock at once or is refused (SQLITE_BUSY: the caller hops to aiosqlite's thread,
  which waits); it never syncs (the claim at ``FULL`` is unsynced; a completion is made here only at
  ``NORMAL`` or ``OFF``); it never checkpoints (``wal_autocheckpoint`` is 0 on these connections: every
  ``CHECKPOINT_EVERY`` commits made here, a checkpoint runs on a short-lived thread of its own, which the loop
  need not schedule, so a caller whose calls never suspend still gets its WAL checkpointed). Such a statement
  costs about what a read does, a few tens of µs, and as a synchronous call it cannot be split by a
  cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import os
import random
import sqlite3
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite
from sqlalchemy.engine import make_url

from .._errors import StoreError
from .._fork import abandon
from ._aiosqlite import HANDOFF_MAX, Waiters, busy, read_or_claim, written
from ._schema import Record, record_from_row
from ._statements import Statements

Compiled = tuple[str, Callable[[dict[str, Any]], Sequence[Any]]]
T = TypeVar("T")

CHECKPOINT_EVERY = 300  # commits made on event loops' threads between two checkpoints (about 1,000 WAL pages)
CHECKPOINT_WAIT = 2.0  # seconds a restarting checkpoint waits for the writer of the moment (and readers)
AT_ONCE_WAIT = 0.05  # seconds an event loop's write tries again for SQLite's write lock before it hops
WAL_RESTART_FRAMES = 4000  # WAL frames (pages written: about 16 MB) past which a checkpoint restarts the WAL


class NotNow:
    """A statement an event loop's thread could not make at once. ``busy``: for SQLite's write lock (held by
    another connection, or a write of this store waits for it): the caller may try again shortly, yielding
    the loop meanwhile (``DirectSQLite.at_once``); otherwise it hops (the general path), which decides."""

    __slots__ = ("busy",)

    def __init__(self, busy: bool) -> None:
        self.busy = busy


NOT_NOW, BUSY_NOW = NotNow(False), NotNow(True)


def _compiled(stmt: Any) -> Compiled:
    compiled = stmt.compile(dialect=SQLiteDialect_aiosqlite())
    names = tuple(compiled.positiontup or ())
    getter = operator.itemgetter(*names) if len(names) > 1 else (lambda p: tuple(p[n] for n in names))
    return compiled.string, getter


class Line:
    """An event loop's writers waiting for SQLite's write lock, in the order they came (``DirectSQLite.at_once``)."""

    __slots__ = ("hop_until", "lock", "waiting")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()  # (its waiters are woken first come first served)
        self.waiting = 0  # writers in line, the one trying included: a writer arriving now joins them
        self.hop_until = 0.0  # the loop's time until which the line hops instead (the lock was held long)


def _resolve(resumed: asyncio.Future[None]) -> None:
    if not resumed.done():
        resumed.set_result(None)


class DirectSQLite:
    """The hot statements of one SQLite store, each on the calling thread's own connection."""

    def __init__(self, url: str, synchronous: str, sql: Statements, claim_unsynced: bool,
                 error: Callable[[str, BaseException, bool | None], StoreError], waiters: Waiters) -> None:
        self._cargs, self._cparams = SQLiteDialect_aiosqlite().create_connect_args(make_url(url))
        self._synchronous = synchronous.upper()
        self._claim_unsynced = claim_unsynced
        self.completes_now = self._synchronous in ("OFF", "NORMAL")  # (a completion on a loop never syncs)
        self.claims_now = self.completes_now or claim_unsynced
        self._error = error
        self._read, self._claim, self._complete = _compiled(sql.read), _compiled(sql.claim), _compiled(sql.complete)
        self._local = threading.local()
        self._conns: dict[tuple[threading.Thread, str], sqlite3.Connection] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.commits_now = 0  # commits made on event loops' threads since the last checkpoint was started
        self._restarting = False  # a checkpoint holds writers off (see _checkpoint)
        self._lines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Line] = weakref.WeakKeyDictionary()
        self._paused: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []  # writers it holds off
        self.waiters = waiters  # (the dialect's: every write of the store that waits for the lock)
        self._checkpointing = False

    def _conn(self, role: str = "conn") -> sqlite3.Connection:
        """This thread's connection for ``role`` ("conn": a sync tool's; "loop": an event loop's, which never
        checkpoints), opened on first use."""
        held: sqlite3.Connection | None = getattr(self._local, role, None)
        if held is not None and self._pid == os.getpid():
            return held
        if self._pid != os.getpid():  # (forked by a way that ran no at-fork hook)
            self.after_fork()
        # check_same_thread off only so that close() may close them all; each is used by its own thread.
        connect: Any = sqlite3.connect  # (its typed overloads do not take the dialect's parameters as a dict)
        conn: sqlite3.Connection = connect(*self._cargs, **{**self._cparams, "isolation_level": None, "timeout": 0})
        try:
            # The engine's pragmas (``_dialects.SQLite.set_up``); the file is in WAL mode already (the schema).
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            if role == "loop":
                conn.execute("PRAGMA wal_autocheckpoint = 0")
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
        self._checkpointing, self._restarting, self._paused = False, False, []
        self._lock = threading.Lock()  # (a lock held by another thread at the fork stays held in the child)
        self._lines = weakref.WeakKeyDictionary()
        self.commits_now = 0

    def claim(self, params: dict[str, Any], likely_taken: bool = False) -> int | Record | None:
        """What ``SQLStore.claim`` answers: our fence, the record there, or None (it kept vanishing). (One way
        here, whatever is likely: a read first, then the claim.)"""
        (read_sql, read_args), (claim_sql, claim_args) = self._read, self._claim
        try:
            got = read_or_claim(self._conn(), read_sql, read_args(params), claim_sql, claim_args(params),
                                self._claim_unsynced, waits=False, waiting=self.waiters)
        except (sqlite3.Error, OSError) as exc:
            raise self._error("claiming the key", exc, False) from exc
        if got is None or isinstance(got, int):
            return got
        return record_from_row(params["scope"], params["key"], got)

    def read_now(self, params: dict[str, Any]) -> Record | None:
        """The record there, read on this thread without waiting (an event loop's: an async tool's replay then
        costs no hop), or None if there is none or it could not be read at once — a read in WAL mode does not
        wait for SQLite's writer, and this connection's busy handler never waits."""
        sql, args = self._read
        try:
            rows = self._conn("loop").execute(sql, args(params)).fetchall()
        except (sqlite3.Error, OSError):
            return None
        return record_from_row(params["scope"], params["key"], rows[0]) if rows else None

    def claim_now(self, params: dict[str, Any]) -> int | Record | NotNow:
        """What ``SQLStore.claim`` answers, on an event loop's thread, if it can be made at once (see the module
        docstring; only where ``claims_now``): our fence, or the record there; else ``NOT_NOW``."""
        (read_sql, read_args), (claim_sql, claim_args) = self._read, self._claim
        conn = self._conn("loop")
        unsynced = self._claim_unsynced
        try:
            rows = conn.execute(read_sql, read_args(params)).fetchall()
            if rows:
                return record_from_row(params["scope"], params["key"], rows[0])
            if self.waiters.count:
                return BUSY_NOW  # a write of this store waits for the lock: this one takes its turn (Waiters)
            if unsynced:
                conn.execute("PRAGMA synchronous = NORMAL")
            try:
                rows = conn.execute(claim_sql, claim_args(params)).fetchall()  # (all: it ends, it commits)
            finally:
                if unsynced:
                    conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.OperationalError as exc:
            return BUSY_NOW if busy(exc) else NOT_NOW  # (anything but the lock: the general path decides)
        except (sqlite3.Error, OSError):
            return NOT_NOW
        self._committed_now()
        return int(rows[0][0]) if rows else NOT_NOW  # (no row: inserted meanwhile, the general path reads it)

    def complete_now(self, scope: str, key: str, fence: int, state: str, result: str, retention: float,
                     audit: str | None = None) -> bool | NotNow:
        """What ``SQLStore.complete`` answers, on an event loop's thread, if it can be made at once (only where
        ``completes_now``): whether the outcome was recorded under our fence; else ``NOT_NOW``."""
        sql, args = self._complete
        if self.waiters.count:
            return BUSY_NOW
        params = {"scope": scope, "key": key, "fence": fence, "state": state, "result": result,
                  "retention": retention, "audit": audit}
        try:
            rows = self._conn("loop").execute(sql, args(params)).fetchall()
        except sqlite3.OperationalError as exc:
            return BUSY_NOW if busy(exc) else NOT_NOW
        except (sqlite3.Error, OSError):
            return NOT_NOW
        self._committed_now()
        return bool(rows)

    def _committed_now(self) -> None:
        self.commits_now += 1
        if self.commits_now >= CHECKPOINT_EVERY and not self._checkpointing:
            self.commits_now, self._checkpointing = 0, True
            threading.Thread(target=self._checkpoint, name="agentguard-checkpoint", daemon=True).start()

    def _checkpoint(self) -> None:
        """A passive checkpoint: it copies the WAL into the database while writers go on, and the next writer
        starts the WAL again from its beginning once all of it is copied. Under writes that never pause, all
        of it never is (2,000 back-to-back first calls left 47 MB of it); so past ``WAL_RESTART_FRAMES`` the
        checkpoint restarts the WAL itself: it waits (its busy handler, on this thread) for the writer of the
        moment and holds new writers off while it copies the rest and syncs — the loops' writers meanwhile try
        again shortly, yielding (``DirectSQLite.at_once``). A failure is left to the next checkpoint; one cut off
        by the process's exit is harmless, as any checkpoint is."""
        try:
            connect: Any = sqlite3.connect
            conn: sqlite3.Connection = connect(*self._cargs, **{**self._cparams, "isolation_level": None,
                                                                "timeout": CHECKPOINT_WAIT})
            try:
                _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                if frames > WAL_RESTART_FRAMES:
                    self._restarting = True
                    conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
            finally:
                conn.close()
        except (sqlite3.Error, OSError, TypeError, ValueError):
            pass
        finally:
            with self._lock:
                self._restarting, self._checkpointing = False, False
                paused, self._paused = self._paused, []
            for loop, resumed in paused:  # in the order they came
                with contextlib.suppress(RuntimeError):  # (a loop closed meanwhile)
                    loop.call_soon_threadsafe(_resolve, resumed)

    async def at_once(self, attempt: Callable[[], T | NotNow]) -> T | NotNow:
        """``attempt`` (a write on the loop's thread that never waits), made at once if it can be. If SQLite's write
        lock is busy, the writer joins the loop's line (``line``, first come first served, so that a
        writer arriving as the lock comes free never takes it ahead of those already waiting): the first in line
        tries again in short jittered sleeps (0.25 ms doubling to at most 4 ms, as ``_aiosqlite.written`` waits on a
        thread), the others wait their turn. While a checkpoint holds writers off, the first waits for its end
        (``paused``). If the lock stays busy for ``AT_ONCE_WAIT``, NOT_NOW: the caller hops and waits
        on aiosqlite's thread, and so does the rest of the line for a while. Cancelled while it waits, it has
        written nothing."""
        line = self.line()
        got: T | NotNow = BUSY_NOW
        if not line.waiting:
            got = attempt()
            if not isinstance(got, NotNow) or not got.busy:
                return got
        loop = asyncio.get_running_loop()
        line.waiting += 1
        try:
            async with line.lock:
                delay, deadline = 0.00025, loop.time() + AT_ONCE_WAIT
                while loop.time() >= line.hop_until:
                    got = attempt()
                    if not isinstance(got, NotNow) or not got.busy:
                        return got
                    if loop.time() >= deadline:  # held long (another process's long write): the line hops a while
                        line.hop_until = loop.time() + AT_ONCE_WAIT
                        break
                    paused = self.paused()
                    if paused is not None:
                        await paused
                        deadline = loop.time() + AT_ONCE_WAIT
                    else:
                        await asyncio.sleep(delay * (0.5 + random.random()))
                        delay = min(delay * 2, HANDOFF_MAX)
        finally:
            line.waiting -= 1
        return got

    def line(self) -> Line:
        """The running loop's line of writers (made on first use; only that loop's thread touches it)."""
        loop = asyncio.get_running_loop()
        line = self._lines.get(loop)
        if line is None:
            line = self._lines[loop] = Line()
        return line

    def paused(self) -> asyncio.Future[None] | None:
        """While a checkpoint holds writers off (restarting the WAL): a future of this loop, resolved when it
        ends, so that the loop's writers wait for it together and go on in the order they came, rather than
        each trying again in its own sleeps (and some falling back to the hop, behind the others)."""
        if not self._restarting:
            return None
        loop = asyncio.get_running_loop()
        resumed: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if not self._restarting:  # (it ended just now)
                return None
            self._paused.append((loop, resumed))
        return resumed

    def complete(self, scope: str, key: str, fence: int, state: str, result: str, retention: float,
                 audit: str | None = None) -> bool:
        """What ``SQLStore.complete`` answers: whether the outcome was recorded under our fence."""
        sql, args = self._complete
        params = {"scope": scope, "key": key, "fence": fence, "state": state, "result": result,
                  "retention": retention, "audit": audit}
        try:
            rows = written(self._conn(), sql, args(params), waits=False, waiting=self.waiters)
        except (sqlite3.Error, OSError) as exc:
            raise self._error("storing the result", exc, True) from exc
        return bool(rows)

    def close(self) -> None:
        """Close every connection opened here (each thread opens a new one on its next call)."""
        if self._pid != os.getpid():  # (forked by a way that ran no at-fork hook: the parent's, abandoned)
            self.after_fork()
        with self._lock:
            conns, self._conns = self._conns, {}
        self._local = threading.local()
        for conn in conns.values():
            conn.close()
