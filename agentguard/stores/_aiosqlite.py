"""What the store needs of aiosqlite beyond SQLAlchemy's own use of it.

aiosqlite runs each connection on a thread of its own and hands every call to it through one queue
(``Connection._execute``): one *thread hop* per call. So:

- :func:`connector` opens connections as SQLAlchemy would, but registers each, so that its thread can be
  joined (:func:`join_threads`) before the event loop it reports to is let go;
- :func:`fetch_row` is one statement in one hop (a function run on the connection's thread through that queue);
- :func:`fetch_plan` runs the rest of a claim plan (``_claims``) there: its statements, one hop;
- :func:`on_thread` runs any function there, one hop (the ledger's chained batches: ``_chain.sqlite_append``).

Each statement runs through :func:`statement`: a write waits for SQLite's write lock in short sleeps of its own
(:func:`written`, as on a sync tool's own connection: ``_direct``), or, while a long write of the store's own holds
it (a ledger batch, a restarting checkpoint: :class:`Waiters`), until told it ended; a claim's insert commits
unsynced where the store's claims do (:class:`Unsynced`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping, Sequence
from typing import Any, TypeVar

from sqlalchemy.engine import make_url

from ._claims import Plan
from ._statements import Compiled

T = TypeVar("T")

log = logging.getLogger("agentguard.store")

Opened = MutableMapping[asyncio.AbstractEventLoop, list[Any]]  # the driver connections opened on each loop


def connector(url: str, opened: Opened) -> Callable[[], Any]:
    """An ``async_creator`` for SQLAlchemy: the same arguments SQLAlchemy's aiosqlite dialect would pass, and
    every connection recorded in ``opened`` under the loop that opens it."""
    import aiosqlite
    from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite

    cargs, cparams = SQLiteDialect_aiosqlite().create_connect_args(make_url(url))
    cparams.setdefault("timeout", 30.0)

    def connect() -> Any:
        conn = aiosqlite.connect(*cargs, **cparams)
        _worker(conn).daemon = True  # as SQLAlchemy's own connect does: never keeps the process alive
        here = opened.setdefault(asyncio.get_running_loop(), [])
        here[:] = [d for d in here if _thread_alive(d) or not _thread_started(d)]
        here.append(conn)
        return conn  # awaited by SQLAlchemy, which starts the thread and connects

    return connect


async def join_threads(drivers: Sequence[Any]) -> None:
    """Close every one of ``drivers`` (aiosqlite connections opened on one loop) and wait for its thread to end.

    Each thread reports back with ``loop.call_soon_threadsafe``. A connect or statement abandoned by a
    cancelled caller (aiosqlite then stops the connection without waiting) still reports when it finishes: if
    the loop has closed by then, the thread dies with "Event loop is closed". So the loop is let go only once
    every thread opened on it has ended.
    """
    for _ in range(2000):  # ~10 s at most; each pass takes no time unless a thread is still busy
        busy = False
        for drv in drivers:
            if not _thread_alive(drv):
                continue
            if getattr(drv, "_connection", None) is not None and getattr(drv, "_running", False):
                with contextlib.suppress(Exception):
                    await drv.close()  # queued behind whatever it still runs; ends its thread
            busy = busy or _thread_alive(drv)
        if not busy:
            return
        await asyncio.sleep(0.005)  # a connect still opening: its thread stops by itself once done
    log.warning("aiosqlite threads still running while their event loop is let go")


def _worker(drv: Any) -> threading.Thread:
    """An aiosqlite connection's worker thread: ``Connection._thread`` from 0.22, the connection itself (a
    ``Thread`` subclass) before."""
    thread = getattr(drv, "_thread", drv)
    assert isinstance(thread, threading.Thread), type(drv)
    return thread


def _thread_alive(drv: Any) -> bool:
    """Whether an aiosqlite connection's worker thread still runs (it ends after the connection stops)."""
    return _worker(drv).is_alive()


def _thread_started(drv: Any) -> bool:
    return _worker(drv).ident is not None


BUSY_MS = 30000  # how long a statement waits for SQLite's write lock before "database is locked"
HANDOFF_MAX = 0.004  # seconds: the longest sleep of a hot write waiting for the write lock (see written)


class Waiters:
    """How many writes of one store in this process wait for SQLite's write lock (in :func:`written`, on
    aiosqlite's thread or a sync tool's own). While any does, an event loop's thread makes no write at once
    (``_direct.DirectSQLite.now``): its writes would take the lock every time it came free — the loop's
    thread holds the GIL between them, and a waiting thread mostly wakes while the lock is held — and starve
    the waiting ones; they hop and wait in turn instead.

    And whether a long write of this store's own holds the lock now (:meth:`holding`: a batch of the ledger's
    entries, a checkpoint restarting the WAL). A write that finds the lock busy meanwhile is told when it is let
    go — a thread waits in :meth:`wait_released`, a loop's writer on :meth:`released` — rather than trying again
    in sleeps, which mostly wake while the batch still holds it, and then sleep longer, past its end (another
    process's write, which nothing here can announce, is still waited out in sleeps)."""

    __slots__ = ("_let_go", "_lock", "_paused", "count", "held")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._let_go = threading.Condition(self._lock)
        self.count = 0
        self.held = 0  # long writes of this store holding the lock now
        self._paused: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []  # loops' writers told

    def after_fork(self) -> None:
        """In a forked child: the writes that waited, and those that held the lock, were the parent's threads'."""
        self._lock = threading.Lock()
        self._let_go = threading.Condition(self._lock)
        self.count = self.held = 0
        self._paused = []

    def __enter__(self) -> Waiters:
        with self._lock:
            self.count += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.count -= 1

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Around a long write of this store's that holds the write lock (entered once it has it, or once it is
        about to wait for it ahead of every other writer, as a restarting checkpoint does): the writes kept
        waiting meanwhile are told when it ends, however it ends."""
        with self._lock:
            self.held += 1
        try:
            yield
        finally:
            with self._lock:
                self.held -= 1
                paused: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
                if not self.held:
                    self._let_go.notify_all()
                    paused, self._paused = self._paused, []
            for loop, resumed in paused:  # in the order they came
                with contextlib.suppress(RuntimeError):  # (a loop closed meanwhile)
                    loop.call_soon_threadsafe(_resolve, resumed)

    def wait_released(self, deadline: float) -> bool:
        """On a thread whose write found the lock busy: if a long write of this store holds it, wait until it lets
        go (or ``deadline``, ``time.monotonic()``), and say so; False at once if none does."""
        with self._lock:
            if not self.held:
                return False
            self._let_go.wait_for(lambda: not self.held, max(deadline - time.monotonic(), 0.0))
            return True

    def released(self) -> asyncio.Future[None] | None:
        """On an event loop whose writer found the lock busy: while a long write of this store holds it, a future
        of this loop resolved when it lets go, so that the loop's writers wait for it together and go on in the
        order they came (``_direct.DirectSQLite.at_once``); None if none does."""
        if not self.held:
            return None
        loop = asyncio.get_running_loop()
        resumed: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if not self.held:  # (it ended just now)
                return None
            self._paused.append((loop, resumed))
        return resumed


def _resolve(resumed: asyncio.Future[None]) -> None:
    if not resumed.done():
        resumed.set_result(None)


def written(conn: Any, sql: str, args: Sequence[Any], *, waits: bool = True, waiting: Waiters | None = None
            ) -> list[Any]:
    """One hot statement (autocommit), waiting for SQLite's write lock in short jittered sleeps (0.25 ms,
    doubling to at most 4 ms) instead of the busy handler's own backoff, which sleeps 25 to 100 ms once a
    writer has lost a few rounds while other processes' writers take the lock in between: the tail of
    several writer processes. Gives up after ``BUSY_MS`` as the busy handler would. A statement refused with
    SQLITE_BUSY did nothing, so running it again is safe.

    ``waits``: ``conn``'s own busy handler waits (an aiosqlite connection, shared with SQLAlchemy), so it is
    turned off around the statement; False: ``conn`` never waits by itself (a direct connection, opened with
    a busy timeout of 0), two statements fewer. ``waiting``: told while the write waits, if it does."""
    if not waits:
        return patiently(conn, sql, args, waiting)
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        return patiently(conn, sql, args, waiting)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")


def patiently(conn: Any, sql: str, args: Sequence[Any], waiting: Waiters | None = None) -> list[Any]:
    """``sql`` on ``conn``, whose busy handler never waits: SQLITE_BUSY waited out in :func:`written`'s sleeps, or,
    while a long write of ``waiting``'s store holds the lock, until it lets go (``Waiters.wait_released``)."""
    try:
        return list(conn.execute(sql, args).fetchall())  # fetch all: the statement ends, it commits
    except sqlite3.OperationalError as exc:
        if not busy(exc):
            raise
    with waiting if waiting is not None else contextlib.nullcontext():
        delay, deadline = 0.00025, time.monotonic() + BUSY_MS / 1000
        while True:
            if waiting is None or not waiting.wait_released(deadline):
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, HANDOFF_MAX)
            try:
                return list(conn.execute(sql, args).fetchall())
            except sqlite3.OperationalError as exc:
                if not busy(exc) or time.monotonic() > deadline:
                    raise


def busy(exc: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY (another connection holds the lock), by its code, or by its message where it has none."""
    code = getattr(exc, "sqlite_errorcode", None)
    return (code & 0xFF) == 5 if isinstance(code, int) else ("locked" in str(exc) or "busy" in str(exc))


class Unsynced:
    """Around a claim's commit on ``conn`` at ``synchronous=FULL``: not synced. The completion's commit, synced,
    covers its WAL frames too; a power loss between the two loses the claim, and the retry runs again with the
    same downstream key — what a takeover after a crash does anyway — so the contract holds while a first call
    costs one sync instead of two. (The ledger's batches commit so too: ``_chain.sqlite_append``.)"""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("PRAGMA synchronous = NORMAL")

    def __exit__(self, *exc: object) -> None:
        self.conn.execute("PRAGMA synchronous = FULL")


def statement(conn: Any, sql: str, args: Sequence[Any], writes: bool, claim_unsynced: bool,
              waiting: Waiters | None) -> Any:
    """One hot statement on an aiosqlite connection's thread (autocommit): its first row, or None. ``writes``: it
    takes the write lock, waited for as :func:`written` waits; a read waits for nothing but the connection's
    busy handler (WAL: never for the writer). ``claim_unsynced``: a claim's insert, not synced (:class:`Unsynced`).
    ``waiting``: as for :func:`written`."""
    if not writes:
        rows = conn.execute(sql, args).fetchall()
    elif claim_unsynced:
        with Unsynced(conn):
            rows = written(conn, sql, args, waiting=waiting)
    else:
        rows = written(conn, sql, args, waiting=waiting)
    return rows[0] if rows else None


def fetch_row(drv: Any, sql: str, args: Sequence[Any], writes: bool, waiting: Waiters | None = None) -> Any:
    """:func:`statement` in one hop (awaitable)."""
    return drv._execute(statement, drv._conn, sql, args, writes, False, waiting)


def fetch_plan(drv: Any, plan: Plan, compiled: Callable[[Any], Compiled], *, claim_unsynced: bool,
               waiting: Waiters | None = None) -> Any:
    """The rest of a claim plan in one hop (awaitable): each statement it asks, on the connection's thread."""
    return drv._execute(_advance, drv._conn, plan, compiled, claim_unsynced, waiting)


def _advance(conn: Any, plan: Plan, compiled: Callable[[Any], Compiled], claim_unsynced: bool,
             waiting: Waiters | None) -> None:
    while (ask := plan.ask) is not None:
        sql, args = compiled(ask.stmt)
        plan.answered(statement(conn, sql, args(plan.params), ask.writes, claim_unsynced and ask.claims, waiting))


def on_thread(drv: Any, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
    """``fn(conn, *args)`` on an aiosqlite connection's thread, in one hop (``conn``: its sqlite3 connection)."""
    return drv._execute(fn, drv._conn, *args)  # type: ignore[no-any-return]
