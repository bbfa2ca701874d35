"""Waiting for a key's outcome while another caller holds its claim: coalesced per key within a process, and
woken the moment the outcome is recorded here.

Callers of one process that wait on the same key share one poller: it alone reads the store on the backoff
(a holder in another process is seen that way); the others wait for news. News comes when a waiter sees the
record change, or at once when the holder is in this process and records its outcome or releases its claim.
So the statements a wait costs do not grow with the number of waiters, and a waiter in the holder's process
looks again as soon as the outcome is recorded. Where the store announces outcomes to other processes
(Postgres: ``stores/_listen.py``), the poller marks the record watched once its loop listens, then reads only
on a slow fallback cadence: the announcement wakes it (``heard``), it looks, and its replay wakes the others.
The claim still decides everything: news only means "look again".

Waiters may be on different event loops (a sync tool's calls run on the guard's portal loop), so each waits
on a future of its own loop, and news is delivered with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import threading

Key = tuple[str, str]  # (scope, key)

FALLBACK = 5.0  # seconds a waiter that is not the poller waits for news before it looks for itself


class Watcher:
    """One caller waiting on a key (from its first wait until it stops waiting: :meth:`leave`)."""

    __slots__ = ("_news", "_pending", "_waiting", "_watches", "key", "listened")

    def __init__(self, watches: Watches, key: Key, waiting: _Waiting) -> None:
        self._watches, self.key, self._waiting = watches, key, waiting
        self.listened = 0  # the store's listener generation this caller marked the record under (0: none)
        self._news: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._pending = False  # news that came while this caller was not waiting (it was looking)

    @property
    def polls(self) -> bool:
        """Whether this caller is the key's poller in this process (the others wait for news)."""
        return self._waiting.poller is self

    async def wait(self, poll: float, limit: float) -> None:
        """Until there is news: at most ``poll`` seconds for the poller, ``FALLBACK`` for the others; never
        past ``limit`` seconds."""
        loop = asyncio.get_running_loop()
        news: asyncio.Future[None] = loop.create_future()
        with self._watches.lock:
            if self._pending:  # the record changed while we were looking: look again at once
                self._pending = False
                return
            self._news = (loop, news)
        try:
            await asyncio.wait({news}, timeout=max(min(poll if self.polls else FALLBACK, limit), 0.0))
        finally:
            with self._watches.lock:
                if self._news is not None and self._news[1] is news:
                    self._news = None  # (timed out: news from now on is kept for the next wait)

    def wake(self) -> None:
        """(Under the watches' lock.) News for this caller: delivered to its wait, or kept for the next one."""
        if self._news is not None:
            loop, news = self._news
            self._news = None
            if not news.done():
                try:
                    loop.call_soon_threadsafe(_set, news)
                    return
                except RuntimeError:  # its loop closed: nobody waits there any more
                    return
        self._pending = True

    def leave(self) -> None:
        """Stop waiting; a poller hands the polling to the next waiter, which looks at once."""
        self._watches.leave(self)


class _Waiting:
    __slots__ = ("poller", "watchers")

    def __init__(self) -> None:
        self.poller: Watcher | None = None
        self.watchers: list[Watcher] = []


class Watches:
    """The keys some caller of this process waits on."""

    __slots__ = ("_keys", "lock")

    def __init__(self) -> None:
        self._keys: dict[Key, _Waiting] = {}
        self.lock = threading.Lock()

    def join(self, key: Key) -> Watcher:
        with self.lock:
            waiting = self._keys.get(key)
            if waiting is None:
                waiting = self._keys[key] = _Waiting()
            watcher = Watcher(self, key, waiting)
            waiting.watchers.append(watcher)
            if waiting.poller is None:
                waiting.poller = watcher
            return watcher

    def leave(self, watcher: Watcher) -> None:
        with self.lock:
            waiting = watcher._waiting
            waiting.watchers.remove(watcher)
            if waiting.poller is watcher:
                waiting.poller = waiting.watchers[0] if waiting.watchers else None
                if waiting.poller is not None:
                    waiting.poller.wake()
            if not waiting.watchers and self._keys.get(watcher.key) is waiting:
                del self._keys[watcher.key]

    def news(self, key: Key) -> None:
        """The record of ``key`` changed (recorded, released, taken over): every waiter looks again."""
        if not self._keys:  # (nobody waits on anything: the common case, without a lock)
            return
        with self.lock:
            waiting = self._keys.get(key)
            if waiting is not None:
                for watcher in waiting.watchers:
                    watcher.wake()


    def heard(self, key: Key | None) -> None:
        """News from the store's listener: ``key``'s outcome was recorded in some process (its poller looks,
        and its replay tells the others), or None: announcements may have been missed (every poller looks)."""
        if not self._keys:
            return
        with self.lock:
            for waiting in self._keys.values() if key is None else filter(None, [self._keys.get(key)]):
                if waiting.poller is not None:
                    waiting.poller.wake()


def _set(news: asyncio.Future[None]) -> None:
    if not news.done():
        news.set_result(None)
