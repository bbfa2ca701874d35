"""One SQLAlchemy engine per event loop, the connections kept idle between hot statements, and letting go.

asyncpg and aiosqlite connections are bound to the loop that opened them, so each loop gets its own engine,
made on first use and disposed when that loop shuts down (``asyncio.run`` closes its async generators before
closing the loop): a Guard used across several ``asyncio.run`` calls or per-test loops leaves nothing open
on dead loops. aiosqlite's connection threads are joined before their loop is let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from .._errors import StoreError
from .._redact import redact_text
from ._aiosqlite import join_threads
from ._dialects import Dialect

IDLE_MAX = 2  # driver connections kept between hot statements, per event loop

Idle = list[tuple[Any, Any]]  # (pool connection, its driver connection): reaching the driver's costs three hops


class Engines:
    """The store's engines, one per event loop, and each loop's idle connections.

    **The idle connections** are a shortcut for the hot path (``Executor.one``): up to ``IDLE_MAX`` pool
    connections per loop stay checked out between statements, so a statement skips SQLAlchemy's pool
    checkout and check-in, a large share of a one-statement step. They are the pool's own connections:
    a statement on one must equal the same statement on a connection just checked out of the pool
    (``engine.raw_connection()``), and any connection that may be broken goes back to the pool instead.
    """

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncEngine] = (
            weakref.WeakKeyDictionary()
        )
        self._idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Idle] = weakref.WeakKeyDictionary()
        # The last loop's (loop, engine, idle connections): the hot path's one lookup, not two weak ones.
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], AsyncEngine, Idle] | None = None
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        # The driver connections with threads of their own (aiosqlite) opened on each loop, to join at dispose.
        self._opened: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Any]] = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        """How many loops have an engine."""
        return len(self._engines)

    def engine(self) -> AsyncEngine:
        """The running loop's engine."""
        loop = asyncio.get_running_loop()
        engine = self._engines.get(loop)
        if engine is None:
            engine = self._engines[loop] = self._make()
            self._close_with(loop)
        return engine

    def here(self) -> tuple[AsyncEngine, Idle]:
        """The running loop's engine and idle connections."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            return last[1], last[2]
        engine = self.engine()
        idle = self._idle.get(loop)
        if idle is None:
            idle = self._idle[loop] = []
        self._last = (weakref.ref(loop), engine, idle)
        return engine, idle

    def _make(self) -> AsyncEngine:
        d = self._dialect
        try:
            engine = create_async_engine(d.url, **d.engine_kwargs(self._opened))
        except Exception as exc:  # missing driver, bad URL parts
            raise StoreError(f"the store failed (creating the {d.name} engine: {redact_text(str(exc))})") from exc
        d.set_up(engine)
        return engine

    async def connect(self, engine: AsyncEngine, idle: Idle) -> Any:
        """A connection from the pool, opened to the end even if the caller is cancelled meanwhile: a connect
        cut off halfway (asyncpg's TLS negotiation, say) leaves a half-open socket and a failed future behind.
        A connection nobody waits for any more joins the idle ones (or goes back to the pool)."""
        opening = asyncio.ensure_future(engine.raw_connection())
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            if not opening.done():
                opening.add_done_callback(functools.partial(_adopt, idle))
            raise

    @staticmethod
    async def give_back(raw: Any) -> None:
        """Return a connection to the pool, inside SQLAlchemy's greenlet, so a connection the pool discards
        (overflow, invalidated) is closed with an await rather than dropped."""
        await greenlet_spawn(raw.close)

    async def drop_idle(self) -> None:
        """Invalidate the running loop's idle connections (after one was found dead, the others likely are)."""
        idle = self._idle.get(asyncio.get_running_loop())
        while idle:
            stale = idle.pop()[0]
            stale.invalidate()
            await greenlet_spawn(stale.close)

    def _close_with(self, loop: asyncio.AbstractEventLoop) -> None:
        """Dispose this loop's engine when the loop shuts down."""

        async def closer() -> AsyncIterator[None]:
            try:
                yield
            finally:
                with contextlib.suppress(Exception):
                    await self.dispose()

        agen = closer()
        self._closers[loop] = agen
        loop.create_task(agen.__anext__())  # type: ignore[arg-type]  # registers it with the loop

    async def dispose(self) -> None:
        """Dispose the engine of the running loop, its idle connections, and join its driver threads."""
        loop = asyncio.get_running_loop()
        self._last = None
        idle = self._idle.pop(loop, None)
        while idle:
            await greenlet_spawn(idle.pop()[0].close)
        engine = self._engines.pop(loop, None)
        if engine is not None:
            await engine.dispose()
        await join_threads(self._opened.pop(loop, []))


def _adopt(idle: Idle, opening: asyncio.Future[Any]) -> None:
    if opening.cancelled() or opening.exception() is not None:
        return  # retrieved: nothing is left unreported
    raw = opening.result()
    if len(idle) < IDLE_MAX:
        idle.append((raw, raw.driver_connection))
    else:
        asyncio.get_running_loop().create_task(greenlet_spawn(raw.close))
