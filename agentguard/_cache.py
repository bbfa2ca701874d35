"""An in-process LRU of completed records, so a replay in the same process needs no round trip.

Only terminal records (succeeded or failed) are cached: they never change until their retention ends, and
an entry's deadline is taken before the record's expiry was computed by the database, so it always dies
first. Values are kept encoded and decoded per hit, so callers never share a mutable object.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from .stores import Record


class ReplayCache:
    __slots__ = ("_entries", "_lock", "maxsize")

    def __init__(self, maxsize: int) -> None:
        if maxsize < 0:
            raise ValueError("cache_size must be zero (off) or positive")
        self.maxsize = maxsize
        self._entries: OrderedDict[tuple[str, str], tuple[float, Record]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, scope: str, key: str) -> Record | None:
        if not self.maxsize:
            return None
        # No lock on a hit: each dict operation is atomic, and an entry evicted meanwhile by another
        # thread's put was a valid terminal record when it was read.
        k = (scope, key)
        entry = self._entries.get(k)
        if entry is None:  # a miss (every first call)
            return None
        if entry[0] <= time.monotonic():
            with self._lock:
                if self._entries.get(k) is entry:
                    del self._entries[k]
            return None
        try:  # noqa: SIM105 - a bare try costs nothing; contextlib.suppress costs a context manager per hit
            self._entries.move_to_end(k)
        except KeyError:
            pass
        return entry[1]

    def put(self, record: Record, deadline: float) -> None:
        """``deadline``: a ``time.monotonic()`` instant no later than the record's expiry (one already past
        is stored and dropped by the next ``get``)."""
        if not self.maxsize:
            return
        k = (record.scope, record.key)
        entries = self._entries
        with self._lock:
            if k in entries:
                entries.move_to_end(k)
            entries[k] = (deadline, record)
            while len(entries) > self.maxsize:
                entries.popitem(last=False)

    def after_fork(self) -> None:
        """In a forked child: the records stay valid; the lock may have been held by a thread not forked."""
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
