"""The in-process replay cache: bounded, least recently used first out, and never serving an entry past its
deadline (one stored already past it is dropped by the next read)."""

from __future__ import annotations

import time

from agentguard._cache import ReplayCache
from agentguard.stores import Record


def _rec(key: str) -> Record:
    return Record("default", key, "succeeded", 1, "f", "{}", '"ok"', 1, None, "t", "op", False, False, 60.0, 1)


def test_bounded_and_least_recently_used_goes_first() -> None:
    cache = ReplayCache(2)
    later = time.monotonic() + 60
    cache.put(_rec("a"), later)
    cache.put(_rec("b"), later)
    assert cache.get("default", "a") is not None  # a is now the most recently used
    cache.put(_rec("c"), later)
    assert cache.get("default", "b") is None
    assert cache.get("default", "a") is not None and cache.get("default", "c") is not None


def test_an_entry_past_its_deadline_is_never_served() -> None:
    cache = ReplayCache(8)
    cache.put(_rec("past"), time.monotonic() - 1)
    assert cache.get("default", "past") is None
    assert ("default", "past") not in cache._entries  # dropped, not kept
    off = ReplayCache(0)
    off.put(_rec("x"), time.monotonic() + 60)
    assert off.get("default", "x") is None
