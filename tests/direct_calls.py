"""The whole-calls scenario both sync-thread executors are held to (``tests/whitebox/test_direct.py``: SQLite;
``tests/whitebox/test_direct_pg.py``: Postgres): the same sequence of sync calls through a store that takes the
shortcut and through one that does not (:class:`General`) must give the same results, runs, events and
records."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentguard import Guard, GuardEvent, KeyReuseError, task
from agentguard.stores import SQLStore


class General(SQLStore):
    """The store without its shortcuts: every call takes the general path (no statement in a sync tool's thread,
    none on an event loop's own)."""

    def direct(self) -> None:  # type: ignore[override]
        return None


# The records' columns compared (times aside): key, state, fence - origin, attempts, result, lease_until IS NULL.
CALL_ROWS = ("SELECT key, state, fence - origin, attempts, result, lease_until IS NULL FROM agentguard_calls"
        " ORDER BY key")


def whole_sync_calls(store: SQLStore, rows: Callable[[], list[tuple[Any, ...]]],
                     took_shortcut: Callable[[Any], bool]) -> tuple[Any, ...]:
    """The sequence's results, the body's runs, the events, whether the task was replaying after a replay from
    the store and after a claim won, the records (``rows()``, after the guard closed); and whether the store's
    shortcut was taken (``took_shortcut(store.direct())``, before it closed)."""
    events: list[GuardEvent] = []
    guard = Guard(store=store, on_event=events.append)
    runs: list[str] = []

    @guard.once(key=["order_id"])
    def charge(order_id: str, amount: int, idempotency_key: str = "") -> dict[str, Any]:
        runs.append(order_id)
        if order_id == "o-flaky" and runs.count(order_id) == 1:
            raise ConnectionError("provider down")  # released; the retry takes it over
        return {"order_id": order_id, "amount": amount, "key": idempotency_key, "t": (1, 2)}

    seen: list[Any] = []
    try:
        with task("t-1"):
            charge("o-warm", 1)  # (the schema is made on the general path: the shortcut needs it made)
            seen.append(charge("o-1", 5))  # claimed and completed (in this thread, where it can be)
            seen.append(charge("o-1", 5))  # replayed from the in-process cache
            guard._cache.clear()
            seen.append(charge("o-1", 5))  # replayed from the store: the task is replaying (Postgres)
            replaying = [bool(guard._machine.replaying._tasks)]
            with pytest.raises(KeyReuseError):
                charge("o-1", 6)  # (asked as a replay: read first, on either path)
            with pytest.raises(ConnectionError):
                charge("o-flaky", 1)  # a claim won: the task is not replaying any more
            replaying.append(bool(guard._machine.replaying._tasks))
            seen.append(charge("o-flaky", 1))  # taken over, the same downstream key
        shortcut = took_shortcut(store.direct())
    finally:
        guard.close()
    return seen, runs, [(e.kind, e.operation, e.attempt) for e in events], replaying, rows(), shortcut


def check_whole_sync_calls(direct: tuple[Any, ...], general: tuple[Any, ...]) -> list[bool]:
    """Both paths' answers are the same, and what they are; returns the replaying flags."""
    *same_direct, shortcut_direct = direct
    *same_general, shortcut_general = general
    assert same_direct == same_general
    assert shortcut_direct and not shortcut_general
    seen, runs, _, replaying, _ = same_direct
    assert runs == ["o-warm", "o-1", "o-flaky", "o-flaky"] and seen[0] == seen[1] == seen[2]
    assert seen[3]["key"] and seen[0]["t"] == (1, 2)  # decoded as stored: a tuple stays a tuple
    return replaying  # type: ignore[no-any-return]
