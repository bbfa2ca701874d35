"""The in-process replay cache: bounded, least recently used first out, and never serving an entry past its
deadline (one stored already past it is dropped by the next read)."""

from __future__ import annotations

import time

import pytest

from agentguard._cache import ReplayCache
from agentguard.stores import Record

pytestmark = pytest.mark.storeless  # independent of the store's backend


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


def test_threads_reading_and_evicting_at_once_get_a_right_record_or_none() -> None:
    import threading

    cache = ReplayCache(16)  # far fewer slots than keys: puts evict what other threads are reading
    keys = [f"k{i}" for i in range(64)]
    records = {k: _rec(k) for k in keys}
    later = time.monotonic() + 60
    errors: list[BaseException] = []
    served = 0
    start = threading.Barrier(6)

    def work(seed: int) -> None:
        nonlocal served
        start.wait()
        try:
            for i in range(20_000):
                k = keys[(i * 7 + seed) % len(keys)]
                if i % 3 == 0:
                    cache.put(records[k], later)
                got = cache.get("default", k)
                if got is not None:
                    assert got is records[k]
                    served += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and served > 0
    assert len(cache._entries) <= 16
