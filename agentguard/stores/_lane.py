"""The hot path's connections on one event loop: kept between statements while they are in use, and every
connection a statement is done with handed to the caller that has waited longest.

A shortcut beside SQLAlchemy's pool (``engine.raw_connection()`` and ``close()`` around every statement): a
statement on a connection from here must equal the same statement on one just checked out of the pool. What
it saves is the pool's checkout and check-in per statement, a large share of a one-statement step. It must not
cost fairness: a connection kept for whoever runs next would let a few busy callers take every freed connection
while others wait in the pool's queue until its timeout. So:

- a caller takes an idle connection if there is one; else, while the lane holds fewer connections than the pool
  allows, it checks one out of the pool; else it queues here, first come first served;
- a connection a statement is done with goes, in this order: back to the pool if a caller waits there (the
  general path's ``engine.connect()``, or a hot caller that found the pool exhausted); to the longest-waiting
  caller queued here; else to the idle list, the most recently used taken first;
- an idle connection goes back to the pool once it has been idle ``IDLE_KEEP`` seconds, beyond the
  ``IDLE_MIN`` most recently used: under a steady load none ages, so none is closed and reopened (the pool
  closes a connection beyond its size the moment it comes back, and a busy process that gave back every
  connection beyond a few reopened dozens a second, each costing the server a new backend: a tenth of a
  raw pool's throughput); after a burst the pool gets its connections back and closes its overflow;
- the general path, finding the pool exhausted, takes one idle connection back to the pool first, so the
  lane's idle connections never keep it waiting;
- callers whose statements are gathered into one (``Executor._gathered``) wait in one place in the line, taken
  when the first of them comes (so a connection a statement is done with goes to them, not to the idle list
  for whoever asks next), and a caller joins them only while nobody has lined up behind them;
- a statement that can be gathered (a first call's claim, its completion) is gathered once no connection is idle
  and the lane holds ``gather_at`` (the pool's own size), not only once it holds the pool's overflow too: a burst is
  served by fewer server sessions, and one commit for many (:meth:`Lane.gathers`). Gathered callers kept waiting
  ``patience`` in line while the lane may open another connection open one after all (the lane's connections held
  by statements that wait for a lock someone else holds);
- a connection that may be broken always goes back to the pool (which discards an invalidated one); the slot
  it held passes to the longest-waiting caller here, which checks out a connection of its own with it (so a
  caller that just gave one back cannot take the pool's connection ahead of those in line);
- within the worker's connection budget (``_budget``, Postgres): while the lane holds connections, a caller opens
  another only if the budget has a slot free now (else it waits here for one of the lane's, which come back
  within a statement); while callers elsewhere wait for a slot, a connection a statement is done with is closed,
  its slot theirs, rather than kept or handed on here.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

if TYPE_CHECKING:
    from ._budget import Budget

IDLE_MIN = 2  # connections kept idle between hot statements however long, per event loop
IDLE_KEEP = 1.0  # seconds an idle connection beyond those is kept for the next statement
# Seconds gathered callers wait in line for a connection, past the pool's own size, before they open one of its
# overflow after all (the lane's connections held long by statements that wait: a lock someone else holds).
GATHER_PATIENCE = 1.0

Conn = tuple[Any, Any]  # (pool connection, its driver connection): reaching the driver's costs SQLAlchemy three hops


class Lane:
    """One loop's hot-path connections (see the module docstring)."""

    __slots__ = ("_budget", "_tasks", "_trimming", "arrivals", "capacity", "gather_at", "gathering", "held", "idle",
                 "patience", "queue", "waiting")

    def __init__(self, capacity: int, budget: Budget | None = None, gather_at: int | None = None) -> None:
        self.capacity = capacity
        self.gather_at = capacity if gather_at is None else gather_at  # (see gathers)
        self.patience = GATHER_PATIENCE  # (gathered callers' wait in line past gather_at: see gathers)
        self._budget = budget  # connections the pool allows in all (its size and overflow)
        self.held = 0  # slots taken: connections the lane has checked out of the pool (in use or idle), or is opening
        self.idle: list[tuple[Conn, float]] = []  # (connection, idle since), the most recently used last
        self._trimming: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # connections being given back
        self.queue: collections.deque[asyncio.Future[Conn | None]] = collections.deque()
        self.waiting = 0  # callers blocked in the pool's own checkout (either path)
        self.gathering: dict[Any, Any] = {}  # statements gathered while every connection is in use (Executor)
        self.arrivals = 0  # places taken in the line, ever

    def free(self) -> bool:
        """Whether a caller here would have a connection without waiting for one: an idle one, or a slot to
        open one in."""
        return bool(self.idle) or (self.held < self.capacity and self._may_open())

    def gathers(self) -> bool:
        """Whether a statement that can be gathered joins the others waiting rather than take a connection: none
        is idle, and the lane holds ``gather_at`` (the pool's own size) or may open no other. (Those waiting past
        the pool's size open a connection of its overflow after all if none is handed on within
        ``patience``: :meth:`acquire`.)"""
        return not self.idle and (self.held >= self.gather_at or not self.free())

    def _may_open(self) -> bool:
        """Whether a caller may open a connection for the lane now: the budget has a slot free, or the lane has
        none (a caller with no connection to wait for waits for a slot, in the budget's line)."""
        return self._budget is None or self.held == 0 or self._budget.free()

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold a task of the lane's (a connection given back, a gathered statement) until it ends."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def acquire(self, engine: AsyncEngine, lined: asyncio.Future[Conn | None] | None = None,
                      patience: float | None = None) -> Conn:
        """A connection for one statement. ``lined``: the caller's place in the line, taken before
        (:meth:`line_up`); ``patience``: how long it waits there while the lane may open another connection."""
        if lined is not None:
            return await self._after(engine, lined, patience)
        if self.idle:
            return self.idle.pop()[0]
        if self.held < self.capacity and self._may_open():
            self.held += 1
            return await self._open(engine)
        return await self._after(engine, self.line_up())

    def line_up(self) -> asyncio.Future[Conn | None]:
        """A place at the end of the line (when :meth:`free` is False), for :meth:`acquire`: handed a connection,
        or (None) the slot of one that went back to the pool."""
        waiter: asyncio.Future[Conn | None] = asyncio.get_running_loop().create_future()
        self.queue.append(waiter)
        self.arrivals += 1
        return waiter

    async def _after(self, engine: AsyncEngine, waiter: asyncio.Future[Conn | None],
                     patience: float | None = None) -> Conn:
        if patience is not None and not waiter.done():
            try:
                await asyncio.wait((waiter,), timeout=patience)
            except asyncio.CancelledError:
                self.leave(waiter)
                raise
            if not waiter.done() and self.held < self.capacity and self._may_open():  # (no await since the check)
                self.leave(waiter)
                self.held += 1
                return await self._open(engine)
        handed = await self._queued(waiter)
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

    async def _queued(self, waiter: asyncio.Future[Conn | None]) -> Conn | None:
        """Wait in line: for a connection handed on, or (None) for the slot of one that went back to the pool."""
        try:
            return await waiter
        except asyncio.CancelledError:
            self.leave(waiter)
            raise

    def leave(self, waiter: asyncio.Future[Conn | None]) -> None:
        """A place in the line that nobody will take: out of the line, or what it was handed passed on."""
        if not waiter.done():
            self.queue.remove(waiter)
            waiter.cancel()
        elif not waiter.cancelled():  # handed something just as its caller went: pass it on
            handed = waiter.result()
            if handed is None:
                self._let_go()
            else:
                self.release_now(handed)

    async def _checkout(self, engine: AsyncEngine) -> Any:
        """A connection from the pool, opened to the end even if the caller is cancelled meanwhile: a connect
        cut off halfway (asyncpg's TLS negotiation, say) leaves a half-open socket and a failed future behind.
        A connection nobody waits for any more is kept (or goes back to the pool)."""
        blocked = self.exhausted(engine)  # (decided before the checkout takes a slot: no await between)
        opening = asyncio.ensure_future(engine.raw_connection())
        self.waiting += blocked
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(self._adopt)  # (run soon if it is done already)
            raise
        finally:
            self.waiting -= blocked

    def exhausted(self, engine: AsyncEngine) -> bool:
        """Whether a checkout from ``engine``'s pool now would wait in its queue: every connection it allows is
        checked out (by the lane, idle or in use, or by the general path). Only such a caller counts as
        waiting there; one that opens a connection does not (its connections given back meanwhile would be
        closed by the pool beyond its size, and opened again moments later)."""
        checkedout = getattr(engine.pool, "checkedout", None)  # (a queue pool's; SQLite in memory has one)
        return checkedout is not None and checkedout() >= self.capacity

    def _adopt(self, opening: asyncio.Future[Any]) -> None:
        if opening.cancelled() or opening.exception() is not None:
            self._let_go()  # (retrieved: nothing is left unreported)
            return
        raw = opening.result()
        self.release_now((raw, raw.driver_connection))

    def release_now(self, conn: Conn) -> None:
        """Release a sound connection without awaiting (it is handed on, kept idle, or given back in a task)."""
        if not self._hand_on(conn):
            self._give_back_soon(conn)

    def _give_back_soon(self, conn: Conn) -> None:
        self._shed_one(conn)
        self.keep(asyncio.get_running_loop().create_task(self._give_back(conn[0])))

    async def release(self, conn: Conn, *, sound: bool) -> None:
        """A statement is done with ``conn``; ``sound``: it ended normally (else it may be broken)."""
        if sound:
            if self._hand_on(conn):
                return
            self._shed_one(conn)
        await self._give_back(conn[0])

    def _shed_one(self, conn: Conn) -> None:
        """While callers wait for a slot of the budget, a sound connection going back to the pool is closed there
        (invalidated: the pool discards it), its slot theirs."""
        if self._budget is not None and self._budget.shedding:
            conn[0].invalidate()

    def _hand_on(self, conn: Conn) -> bool:
        if self.waiting:
            return False  # a caller waits in the pool's queue: the pool serves it, in its order
        if self._budget is not None and self._budget.shedding:
            return False  # callers wait for a slot of the budget: closed (``_shed_one``), its slot theirs
        while self.queue:
            waiter = self.queue.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        loop = asyncio.get_running_loop()
        self.idle.append((conn, loop.time()))
        if len(self.idle) > IDLE_MIN and self._trimming is None:
            self._trimming = loop.call_later(IDLE_KEEP, self._trim)
        return True

    def _trim(self) -> None:
        """Give back the connections idle for ``IDLE_KEEP`` beyond the ``IDLE_MIN`` most recently used."""
        self._trimming = None
        loop = asyncio.get_running_loop()
        aged = loop.time() - IDLE_KEEP
        while len(self.idle) > IDLE_MIN and self.idle[0][1] <= aged:
            self._give_back_soon(self.idle.pop(0)[0])
        if len(self.idle) > IDLE_MIN:
            self._trimming = loop.call_at(self.idle[0][1] + IDLE_KEEP, self._trim)

    async def give_back_idle(self) -> None:
        """Give one idle connection (the least recently used) back to the pool."""
        await self._give_back(self.idle.pop(0)[0][0])

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
            raw = self.idle.pop()[0][0]
            raw.invalidate()
            await self._give_back(raw)

    async def close_idle(self) -> None:
        if self._trimming is not None:
            self._trimming.cancel()
            self._trimming = None
        while self.idle:
            await self._give_back(self.idle.pop()[0][0])
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
