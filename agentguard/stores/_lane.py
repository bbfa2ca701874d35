"""The hot path's connections on one event loop: a few kept idle between statements, and every connection a
statement is done with handed to the caller that has waited longest.

A shortcut beside SQLAlchemy's pool (``engine.raw_connection()`` and ``close()`` around every statement): a
statement on a connection from here must equal the same statement on one just checked out of the pool. What
it saves is the pool's checkout and check-in per statement, a large share of a one-statement step. It must not
cost fairness: a connection kept for whoever runs next would let a few busy callers take every freed connection
while others wait in the pool's queue until its timeout. So:

- a caller takes an idle connection if there is one; else, while the lane holds fewer connections than the pool
  allows, it checks one out of the pool; else it queues here, first come first served;
- a connection a statement is done with goes, in this order: back to the pool if a caller waits there (the
  general path's ``engine.connect()``, or a hot caller that found the pool exhausted); to the longest-waiting
  caller queued here; to the idle list, up to ``IDLE_MAX``; else back to the pool;
- a connection that may be broken always goes back to the pool (which discards an invalidated one); the slot
  it held passes to the longest-waiting caller here, which checks out a connection of its own with it (so a
  caller that just gave one back cannot take the pool's connection ahead of those in line).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

IDLE_MAX = 2  # connections kept idle between hot statements, per event loop

Conn = tuple[Any, Any]  # (pool connection, its driver connection): reaching the driver's costs SQLAlchemy three hops


class Lane:
    """One loop's hot-path connections (see the module docstring)."""

    __slots__ = ("capacity", "held", "idle", "queue", "waiting")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # connections the pool allows in all (its size and overflow)
        self.held = 0  # slots taken: connections the lane has checked out of the pool (in use or idle), or is opening
        self.idle: list[Conn] = []
        self.queue: collections.deque[asyncio.Future[Conn | None]] = collections.deque()
        self.waiting = 0  # callers blocked in the pool's own checkout (either path)

    async def acquire(self, engine: AsyncEngine) -> Conn:
        if self.idle:
            return self.idle.pop()
        if self.held < self.capacity:
            self.held += 1
            return await self._open(engine)
        handed = await self._queued()
        if handed is not None:
            return handed
        return await self._open(engine)  # a connection went back to the pool and its slot passed to us

    async def _open(self, engine: AsyncEngine) -> Conn:
        """A connection from the pool, for a slot the caller holds."""
        try:
            raw = await self._checkout(engine)
        except asyncio.CancelledError:
            raise  # (the slot stays with the connection still opening, until it is adopted or fails)
        except BaseException:
            self._let_go()
            raise
        return raw, raw.driver_connection

    async def _queued(self) -> Conn | None:
        """Wait in line: for a connection handed on, or (None) for the slot of one that went back to the pool."""
        waiter: asyncio.Future[Conn | None] = asyncio.get_running_loop().create_future()
        self.queue.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if not waiter.done():
                self.queue.remove(waiter)
            elif not waiter.cancelled():  # handed something just as we were cancelled: pass it on
                handed = waiter.result()
                if handed is None:
                    self._let_go()
                else:
                    self.release_now(handed)
            raise

    async def _checkout(self, engine: AsyncEngine) -> Any:
        """A connection from the pool, opened to the end even if the caller is cancelled meanwhile: a connect
        cut off halfway (asyncpg's TLS negotiation, say) leaves a half-open socket and a failed future behind.
        A connection nobody waits for any more is kept (or goes back to the pool)."""
        opening = asyncio.ensure_future(engine.raw_connection())
        self.waiting += 1
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(self._adopt)  # (run soon if it is done already)
            raise
        finally:
            self.waiting -= 1

    def _adopt(self, opening: asyncio.Future[Any]) -> None:
        if opening.cancelled() or opening.exception() is not None:
            self._let_go()  # (retrieved: nothing is left unreported)
            return
        raw = opening.result()
        self.release_now((raw, raw.driver_connection))

    def release_now(self, conn: Conn) -> None:
        """Release a sound connection without awaiting (it is handed on, kept idle, or given back in a task)."""
        if self._hand_on(conn):
            return
        asyncio.get_running_loop().create_task(self._give_back(conn[0]))

    async def release(self, conn: Conn, *, sound: bool) -> None:
        """A statement is done with ``conn``; ``sound``: it ended normally (else it may be broken)."""
        if sound and self._hand_on(conn):
            return
        await self._give_back(conn[0])

    def _hand_on(self, conn: Conn) -> bool:
        if self.waiting:
            return False  # a caller waits in the pool's queue: the pool serves it, in its order
        while self.queue:
            waiter = self.queue.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        if len(self.idle) < IDLE_MAX:
            self.idle.append(conn)
            return True
        return False

    async def _give_back(self, raw: Any) -> None:
        # Checked in inside SQLAlchemy's greenlet, so a connection the pool discards (overflow, invalidated) is
        # closed with an await rather than dropped.
        try:
            await greenlet_spawn(raw.close)
        finally:
            self._let_go()

    def _let_go(self) -> None:
        """A connection went back to the pool: its slot passes to the longest-waiting caller here (which checks a
        connection out of the pool with it), or is free."""
        while self.queue:
            waiter = self.queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.held -= 1

    async def drop_idle(self) -> None:
        """Invalidate the idle connections (after one was found dead, the others likely are)."""
        while self.idle:
            raw = self.idle.pop()[0]
            raw.invalidate()
            await self._give_back(raw)

    async def close_idle(self) -> None:
        while self.idle:
            await self._give_back(self.idle.pop()[0])
