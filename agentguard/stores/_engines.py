"""One SQLAlchemy engine per event loop, the connections kept idle between hot statements, and letting go.

asyncpg and aiosqlite connections are bound to the loop that opened them, so each loop gets its own engine,
made on first use and disposed when that loop shuts down (``asyncio.run`` closes its async generators before
closing the loop): a Guard used across several ``asyncio.run`` calls or per-test loops leaves nothing open
on dead loops. aiosqlite's connection threads are joined before their loop is let go. In a forked child the
parent's engines are abandoned, never disposed (``_fork``), and each of the child's loops makes its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from .._errors import StoreError
from .._fork import abandon
from .._redact import redact_text
from ._aiosqlite import join_threads
from ._budget import Budget
from ._dialects import Dialect
from ._lane import Lane
from ._listen import Listener

log = logging.getLogger("agentguard.store")


class Engines:
    """The store's engines, one per event loop, and each loop's idle connections.

    Each loop's hot-path connections are a :class:`~._lane.Lane`: kept between statements while in use, every
    one a statement is done with handed to the caller that has waited longest.
    """

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncEngine] = (
            weakref.WeakKeyDictionary()
        )
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Lane] = weakref.WeakKeyDictionary()
        # The last loop's (loop, engine, lane): the hot path's one lookup, not two weak ones.
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], AsyncEngine, Lane] | None = None
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        # The driver connections with threads of their own (aiosqlite) opened on each loop, to join at dispose.
        self._opened: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Any]] = weakref.WeakKeyDictionary()
        # Each loop's listening connection (Postgres), made when a caller there first waits on a key.
        self._listeners: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Listener] = weakref.WeakKeyDictionary()
        # The worker's connection budget (Postgres: ``_budget``), which every connection opened here is within.
        self._budget: Budget | None = getattr(dialect, "budget", None)
        # Each loop's holder of idle connections, told to close them when a caller waits for a slot of the budget.
        self._shedders: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Shedder] = weakref.WeakKeyDictionary()
        # Each loop's dispose under way (``dispose``), which a second one waits for.
        self._disposing: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Future[None]] = (
            weakref.WeakKeyDictionary())
        # Why this process may not use the store at all (a forked child whose parent's store it cannot share), or
        # None: every statement is refused with it, before any body runs.
        self._refusal: str | None = None

    def connected(self) -> bool:
        """Whether a driver connection with a thread of its own (aiosqlite) is open on any loop."""
        return any(getattr(drv, "_connection", None) is not None for drvs in self._opened.values() for drv in drvs)

    def after_fork(self, refusal: str | None = None) -> None:
        """In a forked child: every engine, lane, listener and driver connection so far is the parent's (bound to
        its loops, on its sockets and files): abandoned, never closed; the child's loops make their own. An
        in-memory database cannot follow: it is the parent's, and the child's would start empty. ``refusal``:
        why this child may not use the store at all (every statement is refused with it)."""
        held = (self._engines, self._lanes, self._closers, self._opened, self._listeners, self._shedders)
        abandon(*(dict(d) for d in held))  # (strong references: none of them is collected, and finalised, here)
        self._engines, self._lanes, self._closers, self._opened, self._listeners, self._shedders = (
            weakref.WeakKeyDictionary() for _ in held)
        self._disposing = weakref.WeakKeyDictionary()  # (the parent's loops' disposes run nowhere here)
        if self._budget is not None:
            self._budget.after_fork()
        self._last = None
        if self._refusal is None and self._dialect.memory:
            refusal = (f"this process was forked from process {os.getppid()}, whose in-memory store "
                       "(sqlite+aiosqlite://) it cannot use: a forked process's store must be a SQLite file or "
                       "Postgres, shared by both")
        if self._refusal is None:
            self._refusal = refusal

    def __len__(self) -> int:
        """How many loops have an engine."""
        return len(self._engines)

    def engine(self) -> AsyncEngine:
        """The running loop's engine."""
        loop = asyncio.get_running_loop()
        engine = self._engines.get(loop)
        if engine is None:
            if self._refusal is not None:
                raise StoreError(f"the store failed ({self._refusal})")
            engine = self._engines[loop] = self._make()
            self._close_with(loop)
            if self._budget is not None:
                shedder = self._shedders[loop] = _Shedder(self, loop)
                self._budget.on_pressure(shedder)
        return engine

    def here(self) -> tuple[AsyncEngine, Lane]:
        """The running loop's engine and hot-path lane."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            return last[1], last[2]
        engine = self.engine()
        lane = self._lanes.get(loop)
        if lane is None:
            lane = self._lanes[loop] = Lane(self._dialect.capacity, self._budget, self._dialect.gather_at)
        self._last = (weakref.ref(loop), engine, lane)
        return engine, lane

    def listener(self) -> Listener:
        """The running loop's listener (not yet connected: see :meth:`Listener.up`)."""
        loop = asyncio.get_running_loop()
        listener = self._listeners.get(loop)
        if listener is None:
            self.engine()  # (registers the loop's disposal, which closes the listener too)
            listener = self._listeners[loop] = Listener(self._dialect.channel, self._dialect.listen_connection)
        return listener

    def listening(self) -> int:
        """The running loop's listener generation: > 0 while it listens."""
        listener = self._listeners.get(asyncio.get_running_loop())
        return 0 if listener is None else listener.generation

    def _make(self) -> AsyncEngine:
        d = self._dialect
        try:
            engine = create_async_engine(d.url, **d.engine_kwargs(self._opened))
        except Exception as exc:  # missing driver, bad URL parts
            raise StoreError(f"the store failed (creating the {d.name} engine: {redact_text(str(exc))})") from exc
        d.set_up(engine)
        return engine

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """``engine.connect()`` for the general path. If the pool is exhausted, one of the lane's idle connections
        goes back to it first, and if it is still exhausted, the caller is counted among the pool's waiters
        until it has its connection (the lane's next connection goes to the pool, not to its own queue)."""
        engine, lane = self.here()
        blocked = lane.exhausted(engine)
        if blocked and lane.idle:  # exhausted in part by the lane's idle connections: one goes back to the pool
            await lane.give_back_idle()
            blocked = lane.exhausted(engine)
        conn = engine.connect()
        lane.waiting += blocked  # (decided just before the checkout takes its slot: no await between)
        try:
            await conn.start()
        finally:
            lane.waiting -= blocked
        try:
            yield conn
        finally:
            if self._budget is not None and self._budget.shedding and not conn.invalidated:
                with contextlib.suppress(Exception):  # (callers wait for a slot: closed, not kept in the pool)
                    await conn.invalidate()
            await conn.__aexit__(None, None, None)  # (closes it to completion, as ``async with`` does)

    async def drop_idle(self) -> None:
        """Invalidate the running loop's idle connections (after one was found dead, the others likely are)."""
        lane = self._lanes.get(asyncio.get_running_loop())
        if lane is not None:
            await lane.drop_idle()

    async def shed(self) -> None:
        """Close the running loop's idle connections (the lane's, and those its pool keeps checked in): a caller
        waits for a slot of the budget."""
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(loop)
        if lane is not None:
            await lane.drop_idle()
        engine = self._engines.get(loop)
        if engine is not None:
            await greenlet_spawn(_close_checked_in, engine.sync_engine.pool)

    def _close_with(self, loop: asyncio.AbstractEventLoop) -> None:
        """Dispose this loop's engine when the loop shuts down."""
        if loop in self._closers:
            # (one closer per loop, which disposes whatever engine the loop has then: a second one, made after a
            # dispose mid-loop, would drop the first, whose finalisation disposed the new engine under its callers)
            return

        async def closer() -> AsyncIterator[None]:
            try:
                yield
            finally:
                with contextlib.suppress(Exception):
                    await self.dispose()

        agen = closer()
        self._closers[loop] = agen
        loop.create_task(agen.__anext__())  # type: ignore[arg-type]  # registers it with the loop

    def dispose_soon(self, skip: asyncio.AbstractEventLoop | None = None) -> None:
        """From any thread, waiting for nothing (a finaliser's call): every loop not closed that has an engine here,
        but ``skip``, disposes it (:meth:`dispose`) as soon as it runs."""
        for _ in range(3):
            try:
                loops = list(self._engines)
                break
            except RuntimeError:  # (changed meanwhile by another thread)
                continue
        else:
            return
        for loop in loops:
            if loop is not skip and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # (closed meanwhile)
                    loop.call_soon_threadsafe(_in_background, self.dispose)

    async def dispose(self) -> None:
        """Dispose the engine of the running loop, its idle connections, and join its driver threads. A dispose
        already under way on the loop (a dropped guard's, and then the loop's end) is waited for, not overtaken:
        the loop is let go only once it has joined every thread."""
        loop = asyncio.get_running_loop()
        under_way = self._disposing.get(loop)
        if under_way is not None:
            await asyncio.shield(under_way)
            return
        done = self._disposing[loop] = loop.create_future()
        try:
            self._last = None
            listener = self._listeners.pop(loop, None)
            if listener is not None:
                await listener.close()
            lane = self._lanes.pop(loop, None)
            if lane is not None:
                await lane.close_idle()
            engine = self._engines.pop(loop, None)
            if engine is not None:
                await engine.dispose()
            await join_threads(self._opened.pop(loop, []))
        finally:
            del self._disposing[loop]
            done.set_result(None)


class _Shedder:
    """One loop's holder of idle connections, for the budget: ``shed`` (from any thread) closes them on the loop."""

    def __init__(self, engines: Engines, loop: asyncio.AbstractEventLoop) -> None:
        self._engines = weakref.ref(engines)
        self._loop = weakref.ref(loop)
        self._pending = False

    def shed(self) -> None:
        loop = self._loop()
        if loop is None or loop.is_closed() or self._pending:
            return
        self._pending = True
        loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        self._pending = False
        engines = self._engines()
        if engines is not None:
            _in_background(engines.shed)


_BACKGROUND: set[asyncio.Task[None]] = set()  # (kept until done: a loop holds its tasks only weakly)


def _in_background(closing: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """On the running loop, a task of ``closing()`` (closing connections), whose failure is only logged."""
    task = asyncio.get_running_loop().create_task(closing())
    _BACKGROUND.add(task)
    task.add_done_callback(_done)


def _done(task: asyncio.Task[None]) -> None:
    _BACKGROUND.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.debug("closing connections failed: %r", task.exception())


def _close_checked_in(pool: Any) -> None:
    """Close the connections ``pool`` keeps checked in, leaving it as if each had been closed on its return (as
    ``QueuePool.dispose`` closes them, without resetting its count of those checked out)."""
    queue, dec = getattr(pool, "_pool", None), getattr(pool, "_dec_overflow", None)
    if queue is None or dec is None:  # (not a queue pool: nothing kept)
        return
    while True:
        try:
            record = queue.get(False)
        except Exception:  # (sqlalchemy.util.queue.Empty)
            return
        with contextlib.suppress(Exception):
            record.close()
        dec()
