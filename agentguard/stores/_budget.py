"""One worker's connections to Postgres, of every kind, bounded by one number: ``max_connections``.

Every connection the store opens takes a slot first: each event loop's pool (the hot path's lane, the general path,
the ledger's COPY), the sync tools' own connections (``_direct_pg``, one per thread), each loop's listener, the
check made at start. A connection closed gives its slot back, to the caller that has waited longest (first come,
first served, across threads and loops). A connection waits for a slot at most ``wait`` seconds (the store's
``connect_timeout``), then fails with a ``StoreError`` (before the body, on a claim; the listener's waiters poll
instead); a sync tool's own connection never waits: without a slot free now, its statement goes to its guard's
pool, which waits its turn.

So many connections are never open at once, and while callers wait for a slot the holders give theirs back as
soon as they can (``shedding``): an idle connection is closed rather than kept, and each holder of idle
connections is told (``on_pressure``) to close them now. Without that, connections kept idle on one loop (or by
threads that sit idle) would starve a caller on another until its wait ran out.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import weakref
from typing import Any


class BudgetExhausted(TimeoutError):
    """No slot of the connection budget came free in time (a ``TimeoutError``: transient, as an outage is)."""


class _Waiter:
    __slots__ = ("event", "future", "granted", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] | None = loop.create_future() if loop is not None else None
        self.event = threading.Event() if loop is None else None
        self.granted = False

    def grant(self) -> None:  # (under the budget's lock)
        self.granted = True
        if self.event is not None:
            self.event.set()
        elif self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(_settle, self.future)


def _settle(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


class Budget:
    """``limit`` connection slots, shared by every thread and event loop of one store in one process."""

    def __init__(self, limit: int, wait: float) -> None:
        self.limit = limit
        self.wait = wait
        self.used = 0
        self._lock = threading.Lock()
        self._queue: collections.deque[_Waiter] = collections.deque()
        self._held: dict[int, bool] = {}  # id of each driver connection holding a slot
        self._pressure: weakref.WeakSet[Any] = weakref.WeakSet()  # holders told to give idle connections back

    def after_fork(self) -> None:
        """In a forked child: the parent's connections are abandoned (``_fork``), none counted here."""
        self._lock = threading.Lock()
        self.used, self._queue, self._held = 0, collections.deque(), {}

    @property
    def shedding(self) -> bool:
        """Whether callers wait for a slot: an idle connection is then closed rather than kept."""
        return bool(self._queue)

    def on_pressure(self, holder: Any) -> None:
        """``holder.shed()`` is called (from any thread) when a caller starts waiting for a slot."""
        self._pressure.add(holder)

    def free(self) -> bool:
        """Whether a slot is free now and nobody waits for one."""
        return self.used < self.limit and not self._queue

    def try_take(self) -> bool:
        """A slot now, if one is free and nobody waits for one (never ahead of those who wait)."""
        with self._lock:
            if self.used < self.limit and not self._queue:
                self.used += 1
                return True
        return False

    async def take(self) -> None:
        """A slot, waiting for one in line at most ``wait`` seconds; ``BudgetExhausted`` after that."""
        with self._lock:
            if self.used < self.limit and not self._queue:
                self.used += 1
                return
            waiter = _Waiter(asyncio.get_running_loop())
            self._queue.append(waiter)
        self._press()
        assert waiter.future is not None
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), self.wait)
        except (TimeoutError, asyncio.CancelledError) as exc:
            with self._lock:
                if not waiter.granted:
                    self._queue.remove(waiter)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    raise self.exhausted() from None
            if isinstance(exc, asyncio.CancelledError):  # granted just as it was cancelled: pass it on
                self.give()
                raise

    def exhausted(self) -> BudgetExhausted:
        return BudgetExhausted(
            f"all {self.limit} connections of this worker's budget (max_connections) were in use and none came free "
            f"within {self.wait:g}s; raise max_connections (and the pooler's pool or the server's max_connections "
            "with it), or run fewer calls at once")

    def give(self) -> None:
        """A slot back: to the longest-waiting caller, else free."""
        with self._lock:
            while self._queue:
                waiter = self._queue.popleft()
                waiter.grant()
                return
            self.used -= 1

    def hold(self, conn: Any) -> None:
        """``conn`` holds the slot taken for it, until :meth:`let_go`."""
        with self._lock:
            self._held[id(conn)] = True

    def let_go(self, conn: Any) -> None:
        """``conn`` is closed: its slot back (once, however many paths report it)."""
        with self._lock:
            held = self._held.pop(id(conn), False)
        if held:
            self.give()

    def _press(self) -> None:
        for holder in list(self._pressure):
            with contextlib.suppress(Exception):  # (a holder on a closing loop): the others still give theirs back
                holder.shed()

