"""Fail closed: an unreachable store, a broken schema, a result that cannot be stored, a store that dies
while the body runs, the sweeper racing a loser — real databases, real failures."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentguard import (
    Guard,
    KeyReuseError,
    OutcomeUnknownError,
    ResultNotStoredError,
    StoreError,
    current_audit,
    task,
)
from agentguard.stores import Record, SQLStore

from conftest import BACKEND, raw_exec, tid

pytestmark = pytest.mark.anyio



async def test_unreachable_store_refuses_before_the_body(tmp_path: Path) -> None:
    if BACKEND == "sqlite":
        (tmp_path / "a-file").write_text("not a folder")
        url = f"sqlite+aiosqlite:///{tmp_path / 'a-file' / 'dir' / 'a.db'}"  # its folder cannot be made
    else:
        url = "postgresql+asyncpg://agentguard@127.0.0.1:1/postgres"  # nothing listens on port 1
    runs = 0
    async with Guard(url, connect_timeout=3) as guard:

        @guard.once
        async def charge(amount: int) -> int:
            nonlocal runs
            runs += 1
            return amount

        with task(tid()), pytest.raises(StoreError) as info:
            await charge(1)
    assert runs == 0 and not info.value.body_ran and "not run" in str(info.value)
    assert info.value.status == 503
    if BACKEND == "sqlite":
        assert "cannot create the SQLite file's folder" in str(info.value) and "Not a directory" in str(info.value)
        assert not info.value.transient
    else:
        assert info.value.transient  # connection refused: an outage, not a misconfiguration


async def test_a_sqlite_file_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    """Not "unable to open database file": which file, and why (a folder in its place; a file this process may
    not read and write, checked where the test does not run as root)."""
    (tmp_path / "claims.db").mkdir()
    cases = [(tmp_path / "claims.db", "is a folder, not a database file")]
    locked = tmp_path / "locked.db"
    locked.write_bytes(b"")
    locked.chmod(0o400)
    if not os.access(locked, os.W_OK):  # root may write anything: the check cannot fail there
        cases.append((locked, "not permitted to read and write"))
    for path, why in cases:
        runs = 0
        async with Guard(f"sqlite+aiosqlite:///{path}") as guard:

            @guard.once
            async def charge(amount: int) -> int:
                nonlocal runs
                runs += 1
                return amount

            with task(tid()), pytest.raises(StoreError) as info:
                await charge(1)
        assert why in str(info.value) and str(path) in str(info.value) and "not run" in str(info.value)
        assert runs == 0 and not info.value.transient


async def test_a_sqlite_store_makes_its_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's `sqlite+aiosqlite:///.agentguard/claims.db` works from an empty folder."""
    monkeypatch.chdir(tmp_path)
    runs = 0
    async with Guard("sqlite+aiosqlite:///.agentguard/claims.db") as guard:

        @guard.once
        async def charge(amount: int) -> int:
            nonlocal runs
            runs += 1
            return amount

        with task(tid()):
            assert await charge(1) == 1
            assert await charge(1) == 1
    assert runs == 1 and (tmp_path / ".agentguard" / "claims.db").is_file()


async def test_broken_schema_refuses_before_the_body(store_url: str) -> None:
    await raw_exec(store_url, "CREATE TABLE agentguard_calls (scope TEXT, key TEXT, PRIMARY KEY (scope, key))")
    runs = 0
    async with Guard(store_url) as guard:

        @guard.once
        async def charge(amount: int) -> int:
            nonlocal runs
            runs += 1
            return amount

        with task(tid()), pytest.raises(StoreError, match="not run"):
            await charge(1)
    assert runs == 0


async def test_store_dying_while_the_body_runs_keeps_the_claim_held(store_url: str) -> None:
    keys: list[str] = []
    async with Guard(store_url, lease=1.0) as guard:

        @guard.once
        async def charge(amount: int, idempotency_key: str = "") -> int:
            keys.append(idempotency_key)
            if len(keys) == 1:  # the store goes away after the provider charged
                await raw_exec(store_url, "ALTER TABLE agentguard_calls RENAME TO agentguard_calls_away")
            return amount

        t = tid()
        with task(t):
            with pytest.raises(StoreError) as info:
                await charge(5)
            assert info.value.body_ran and "already ran" in str(info.value) and "held" in str(info.value)
            await raw_exec(store_url, "ALTER TABLE agentguard_calls_away RENAME TO agentguard_calls")
            # Held, not released: a retry waits out the lease, then takes over with the same key.
            assert await charge(5) == 5
            assert await charge(5) == 5
    assert len(keys) == 2 and keys[0] == keys[1]


async def test_a_result_that_cannot_be_stored_is_recorded_and_never_run_again(
    make_guard: Callable[..., Guard], kind: Any
) -> None:
    """Issue 29, item 2. It used to leave the claim held, and after the lease the next call ran the body again.
    Now the outcome "ran, result not storable" is recorded: the first caller and every later one (in this
    process, after the lease, in another guard) get ResultNotStoredError without the body running again, until a
    person settles it; then the settled result is what every call receives."""
    guard = make_guard(lease=0.5)
    other = make_guard(cache_size=0)  # another worker: no in-process cache shared with the first
    keys: list[str] = []

    def charge_impl(amount: int, idempotency_key: str = "") -> int:
        keys.append(idempotency_key)
        return "not an int"  # type: ignore[return-value]  # -> int refuses it

    charge = kind.once(guard, operation="charge")(charge_impl)
    charge_elsewhere = kind.once(other, operation="charge")(charge_impl)
    t = tid()
    with task(t):
        with pytest.raises(ResultNotStoredError, match="could not be stored") as info:
            await charge(5)
        first = info.value
        assert first.body_ran and first.task_id == t and first.key and "never run again" in str(first)
        assert "agentguard resolve" in str(first)
        await asyncio.sleep(0.8)  # past the lease: once, a takeover ran the body again here
        for call in (charge, charge_elsewhere, charge):
            with pytest.raises(ResultNotStoredError) as again:
                await call(5)
            assert again.value.body_ran and again.value.key == first.key and again.value.task_id == t
    assert len(keys) == 1

    held = [u for u in await guard.unknown() if u["key"] == first.key]
    assert [(u["held"], u["step"], u["task_id"]) for u in held] == [("not_stored", None, t)]
    assert await guard.resolve(first.key, result=42) == "its result recorded"
    with task(t):
        assert await charge(5) == 42 and await charge_elsewhere(5) == 42  # settled: every call receives it
    assert len(keys) == 1 and not [u for u in await guard.unknown() if u["key"] == first.key]

    # The other ways to settle: run it again (released: the next call runs the body), or give it up.
    for how in ("retry", "abandon"):
        t2 = tid()
        with task(t2), pytest.raises(ResultNotStoredError) as info:
            await charge(6)
        await guard.resolve(info.value.key, **{how: True})
        with task(t2):
            if how == "retry":
                with pytest.raises(ResultNotStoredError):  # it ran again (and again could not be stored)
                    await charge(6)
            else:
                with pytest.raises(OutcomeUnknownError, match="abandoned"):
                    await charge_elsewhere(6)
    assert len(keys) == 4


class Unequal(dict):  # type: ignore[type-arg]
    """A dict whose comparison with a plain dict raises, as some user types' ``__eq__`` do."""

    def __eq__(self, other: object) -> bool:
        raise AttributeError("no comparing me")

    __hash__ = None  # type: ignore[assignment]


class Unreadable(dict):  # type: ignore[type-arg]
    """A dict whose items cannot be read: both the fingerprint and the codec walk them."""

    def items(self) -> Any:
        raise RuntimeError("items() is broken")


async def test_user_code_raising_inside_the_guards_own_checks_never_strands_a_claim(
    make_guard: Callable[..., Guard], kind: Any
) -> None:
    """Issue 29, item 8. A result whose ``__eq__`` raises kept a sync tool's claim on its heartbeat for as long as
    the process lived (every retry: InProgressError) and let the raw AttributeError out of an async tool; an
    argument whose ``items()`` raises let a raw RuntimeError out. Now each is a documented outcome and the claim
    is recorded, never left renewing."""
    guard = make_guard(lease=0.5)
    runs: list[str] = []

    def tool_impl(what: str, value: Any = None) -> Any:
        runs.append(what)
        if what == "unequal":
            return Unequal(a=1)
        if what == "unreadable":
            return Unreadable(a=1)
        if what == "notes":
            current_audit()["who"] = object()  # a note with no stored form: the outcome is kept without it
        return what

    tool = kind.once(guard, operation="tool", key="what")(tool_impl)
    with task(tid()):
        # Compared by the codec's shortcut, which could not tell: stored through the general path, as a dict.
        assert await tool("unequal") == {"a": 1}
        assert await tool("unequal") == {"a": 1}  # replayed, not InProgressError
        with pytest.raises(ResultNotStoredError, match="items"):
            await tool("unreadable")
        with pytest.raises(ResultNotStoredError):
            await tool("unreadable")  # recorded: not InProgressError, not run again
        assert await tool("notes") == "notes"
        assert await tool("notes") == "notes"
        with pytest.raises(TypeError, match=r"argument 'value' cannot be fingerprinted: .*RuntimeError.*items"):
            await tool("argument", Unreadable(a=1))
    assert runs == ["unequal", "unreadable", "notes"]
    record = [r for r in await guard.records() if r.operation.startswith("tool")]
    assert {r.state for r in record} == {"succeeded", "failed"}  # nothing left running
    (notes,) = [r for r in record if r.audit and "agentguard" in r.audit]
    assert "could not be stored" in notes.audit["agentguard"]


class SweptAfterAMiss(SQLStore):
    """A store whose claim, when it meets an existing record, lets a sweeper delete it before the caller acts
    on it, then reads it again (as the general claim does after a conflict): the record has vanished."""

    def __init__(self, url: str, sweeper: Guard) -> None:
        super().__init__(url)
        self.sweeper = sweeper
        self.swept: list[int] = []

    async def claim(self, params: dict[str, Any], likely_taken: bool = False) -> int | Record | None:
        got = await super().claim(params, likely_taken)
        if isinstance(got, int) or self.swept:
            return got
        self.swept.append(await self.sweeper.sweep())
        return await self.read(params["scope"], params["key"])


async def test_sweeper_deleting_the_winners_row_before_the_losers_read(
    store_url: str, make_guard: Callable[..., Guard]
) -> None:
    runs = 0

    async def charge(amount: int) -> int:
        nonlocal runs
        runs += 1
        return runs

    t = tid()
    with task(t):
        assert await make_guard(retention=0.3).once(operation="charge")(charge)(1) == 1
    await asyncio.sleep(0.5)  # the record is past retention; the loser's insert still conflicts
    store = SweptAfterAMiss(store_url, make_guard())
    async with Guard(store=store, retention=0.3) as guard:
        with task(t):
            assert await guard.once(operation="charge")(charge)(1) == 2  # vanished before the read: claim again
    assert store.swept == [1] and runs == 2


async def test_replays_in_this_process_come_from_the_cache(store_url: str) -> None:
    async with Guard(store_url) as cached, Guard(store_url, cache_size=0) as uncached:
        runs = 0

        async def body(amount: int) -> int:
            nonlocal runs
            runs += 1
            return amount

        a = cached.once(operation="charge")(body)
        b = uncached.once(operation="charge")(body)
        with task(tid()):
            assert await a(5) == 5
            await raw_exec(store_url, "ALTER TABLE agentguard_calls RENAME TO agentguard_calls_away")
            try:
                assert await a(5) == 5  # served in-process: the store is not even consulted
                with pytest.raises(KeyReuseError):
                    await a(6)  # the cache checks the fingerprint too
                with pytest.raises(StoreError):
                    await b(5)
            finally:
                await raw_exec(store_url, "ALTER TABLE agentguard_calls_away RENAME TO agentguard_calls")
            assert await b(5) == 5
    assert runs == 1


SCHEMA_CHANGES = {
    "result column dropped": ("ALTER TABLE agentguard_calls DROP COLUMN result", None),
    "table renamed": ("ALTER TABLE agentguard_calls RENAME TO agentguard_calls_away",
                      "ALTER TABLE agentguard_calls_away RENAME TO agentguard_calls"),
    "table dropped": ("DROP TABLE agentguard_calls", None),
}


@pytest.mark.parametrize("change", list(SCHEMA_CHANGES))
async def test_a_schema_changed_under_a_running_guard_fails_before_the_body(
    store_url: str, kind: Any, change: str
) -> None:
    """A migration or a rollback gone wrong after the guard's first call: the next first call must find out that
    the store cannot hold its result before its body runs (it claimed, ran the body and only then failed to
    store it, leaving the claim held), and a dropped table is never silently made again (its records, and with
    them every replay, would be gone)."""
    runs: list[int] = []
    async with Guard(store_url, lease=5.0) as guard:

        @kind.once(guard)
        def charge(amount: int) -> int:
            runs.append(amount)
            return amount

        with task(tid()):
            assert await charge(1) == 1
        sql, undo = SCHEMA_CHANGES[change]
        await raw_exec(store_url, sql)
        for amount in (2, 3):  # (the second: nothing learnt from the first made it through)
            with task(tid()), pytest.raises(StoreError) as info:
                await charge(amount)
            assert not info.value.body_ran and "not run" in str(info.value)
        if undo is not None:
            await raw_exec(store_url, undo)
            with task(tid()):
                assert await charge(4) == 4
    assert runs == [1] + ([4] if undo is not None else [])
