"""The store's inside, proved against its own general paths: the one row layout, the Record shortcut, the step
verbs, the one retry policy, and store errors that say what failed. On the test run's backend (SQLite or a real
Postgres). Every executor of the hot statements and the claim plans is proved equal to the general path in
tests/whitebox/test_executors.py."""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text

from agentguard import StoreError
from agentguard.stores import (
    DONE,
    STARTED,
    SUCCEEDED,
    AdminStore,
    ClaimStore,
    Record,
    SQLStore,
    StepStore,
    StepTransaction,
    Store,
    record_of,
)
from agentguard.stores._schema import ROW, record_from_row

from conftest import raw_exec, tid

pytestmark = pytest.mark.anyio

SCOPE = "default"
LEASE, RETENTION = 30.0, 3600.0


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[SQLStore]:
    s = SQLStore(store_url)
    try:
        yield s
    finally:
        await s.dispose()


def claim_params(key: str, **kw: Any) -> dict[str, Any]:
    return {
        "scope": SCOPE, "key": key, "task_id": tid(), "operation": f"charge[{key}]", "fingerprint": "f" * 64,
        "arg_hashes": "{}", "fence": secrets.randbits(62), "tool": "charge", "arguments": None,
        "owner": "o-" + secrets.token_hex(4), "lease": LEASE, "retention": RETENTION, "audit": None, **kw,
    }


# -- the one row layout -----------------------------------------------------------------------------------


def test_record_of_is_the_general_constructor() -> None:
    fields = ("s", "k", SUCCEEDED, 7, "f", "{}", '"r"', 1, None, "t", "op", False, True, 12.5, 7)
    fast = record_of(fields)
    assert type(fast) is Record and fast == Record(*fields) and fast.origin == 7 and fast.ttl == 12.5
    assert record_of([*fields[:-1], 0]) == Record(*fields[:-1])  # the default origin


async def test_a_row_builds_the_record_the_general_constructor_builds(store: SQLStore) -> None:
    p = claim_params("k-row")
    fence = await store.claim(p)
    assert isinstance(fence, int)
    assert await store.complete(SCOPE, "k-row", fence, SUCCEEDED, '"ok"', RETENTION)
    async with store.engine().connect() as conn:
        result = await conn.execute(store.sql.read, {"scope": SCOPE, "key": "k-row"})
        assert tuple(result.keys()) == tuple(col.name for col in ROW)  # the read's columns are the layout
        row = result.one()
    rec = record_from_row(SCOPE, "k-row", row)
    flags = {col.name for col in ROW if col.flag}
    general = Record(SCOPE, "k-row", *(bool(v) if col.name in flags else v for col, v in zip(ROW, row, strict=True)))
    assert rec == general and type(rec.live) is bool and type(rec.expired) is bool
    assert (rec.state, rec.fence, rec.result, rec.live, rec.expired, rec.origin) == (
        SUCCEEDED, fence, '"ok"', False, False, fence)


# -- the one retry policy -----------------------------------------------------------------------------------


@pytest.mark.postgres
async def test_one_policy_for_a_lost_connection_on_both_paths(
    store: SQLStore, store_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection killed since it was used is replaced once, on the general path and the hot path alike."""
    from sqlalchemy.engine import make_url

    db = make_url(store_url).database
    kill = f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}' AND pid <> pg_backend_pid()"
    assert len(await store.listing()) == 0  # the schema's connection, back in the pool
    with caplog.at_level(logging.WARNING, logger="agentguard.store"):
        await raw_exec(store_url, kill)
        assert len(await store.listing()) == 0  # the general path: SQLAlchemy's pooled connection was dead
        assert isinstance(await store.claim(claim_params("k-lost")), int)  # the hot path keeps it idle now
        await raw_exec(store_url, kill)
        assert (await store.read(SCOPE, "k-lost")) is not None  # the hot path: its idle connection was dead
    lost = [r.getMessage().split(";")[0] for r in caplog.records if "retrying once" in r.getMessage()]
    assert lost == ["store connection lost during listing records", "store connection lost during reading the record"]


# -- steps ---------------------------------------------------------------------------------------------------


async def test_step_verbs_write_only_under_the_claim(store: SQLStore) -> None:
    fence = await store.claim(claim_params("k-steps"))
    assert isinstance(fence, int)
    mine = {"fence": fence, "origin": fence, "lease": LEASE}
    stale = {"fence": fence + 1, "origin": fence, "lease": LEASE}
    assert await store.put_step(SCOPE, "k-steps", **mine, name="a", seq=0, state=STARTED, result=None)
    assert not await store.put_step(SCOPE, "k-steps", **stale, name="b", seq=1, state=STARTED, result=None)
    assert await store.load_steps(SCOPE, "k-steps", fence) == [("a", 0, STARTED, None)]
    assert not await store.clear_step(SCOPE, "k-steps", **stale, name="a")
    assert await store.clear_step(SCOPE, "k-steps", **mine, name="a")
    assert await store.load_steps(SCOPE, "k-steps", fence) == []
    assert await store.put_step(SCOPE, "k-steps", **mine, name="a", seq=0, state=DONE, result='"x"')
    assert await store.clear_step(SCOPE, "k-steps", **mine, name="a")  # a done step is not cleared
    assert await store.load_steps(SCOPE, "k-steps", fence) == [("a", 0, DONE, '"x"')]


async def test_a_step_transaction_commits_the_callers_writes_with_the_step(store: SQLStore) -> None:
    fence = await store.claim(claim_params("k-tx"))
    assert isinstance(fence, int)
    async with store.engine().connect() as conn:
        await conn.execute(text("CREATE TABLE rides (id TEXT PRIMARY KEY)"))
    mine = {"fence": fence, "origin": fence, "lease": LEASE}

    async def rides() -> int:
        async with store.engine().connect() as conn:
            return int((await conn.execute(text("SELECT COUNT(*) FROM rides"))).scalar_one())

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with store.step_transaction(SCOPE, "k-tx", **mine, name="book", seq=0) as tx:
            assert isinstance(tx, StepTransaction)
            await tx.connection.execute(text("INSERT INTO rides VALUES ('r-1')"))
            await tx.record('"r-1"')
            raise Boom  # the caller's own error: everything in the transaction is rolled back
    assert await rides() == 0 and await store.load_steps(SCOPE, "k-tx", fence) == []
    async with store.step_transaction(SCOPE, "k-tx", **mine, name="book", seq=0) as tx:
        assert tx is not None
        await tx.connection.execute(text("INSERT INTO rides VALUES ('r-1')"))
        await tx.record('"r-1"')
    assert await rides() == 1 and await store.load_steps(SCOPE, "k-tx", fence) == [("book", 0, DONE, '"r-1"')]
    async with store.step_transaction(SCOPE, "k-tx", **{**mine, "fence": fence + 1}, name="x", seq=1) as tx:
        assert tx is None  # not ours


async def test_resolving_a_started_step(store: SQLStore) -> None:
    fence = await store.claim(claim_params("k-held", lease=0.001))
    assert isinstance(fence, int)
    mine = {"fence": fence, "origin": fence, "lease": 0.001}
    for seq, name in enumerate(("a", "b")):
        assert await store.put_step(SCOPE, "k-held", **mine, name=name, seq=seq, state=STARTED, result=None)
    await _until_unknown(store, 1)  # one row per held record (its first started step), however many started
    assert await store.resolve_step(SCOPE, "k-held", "a", DONE, '"paid"')
    assert await store.resolve_step(SCOPE, "k-held", "b", None, None)  # cleared for a retry
    assert not await store.resolve_step(SCOPE, "k-held", "b", None, None)
    assert await store.load_steps(SCOPE, "k-held", fence) == [("a", 0, DONE, '"paid"')]


async def _until_unknown(store: SQLStore, n: int) -> None:
    import asyncio

    for _ in range(100):
        if len(await store.unknown()) == n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the lease did not expire")


# -- what a failure says -----------------------------------------------------------------------------------


async def test_a_store_error_says_only_what_failed(store: SQLStore, store_url: str) -> None:
    fence = await store.claim(claim_params("k-err"))
    assert isinstance(fence, int)
    await raw_exec(store_url, "ALTER TABLE agentguard_calls RENAME TO agentguard_calls_away")
    cases: list[tuple[Any, str, bool]] = [
        (store.claim(claim_params("k-err-2")), "claiming the key", False),
        (store.read(SCOPE, "k-err"), "reading the record", False),
        (store.complete(SCOPE, "k-err", fence, SUCCEEDED, "1", RETENTION), "storing the result", True),
        (store.release(SCOPE, "k-err", fence, RETENTION), "releasing the claim", True),
        (store.renew(SCOPE, "k-err", fence, LEASE), "renewing the lease", True),
        (store.put_step(SCOPE, "k-err", fence=fence, origin=fence, lease=LEASE, name="a", seq=0, state=STARTED,
                        result=None), "recording a step", True),
        (store.listing(), "listing records", False),
    ]
    for coro, what, body_ran in cases:
        with pytest.raises(StoreError) as info:
            await coro
        message = str(info.value)
        assert message.startswith(f"the store failed ({what}: ") and message.endswith(")"), message
        assert info.value.body_ran is body_ran and not info.value.transient
        assert "agentguard_calls" in message  # the database's own words: no such table / relation


def test_a_store_error_hides_secrets(store_url: str) -> None:
    exc = OSError("could not reach postgresql+asyncpg://app:hunter2@db.internal:5432/pay")
    err = SQLStore(store_url)._executor.error("claiming the key", exc, False)
    assert "hunter2" not in str(err) and "app:***@db.internal" in str(err) and err.transient


# -- the interfaces ------------------------------------------------------------------------------------------


def test_the_sql_store_implements_every_interface(store_url: str) -> None:
    store = SQLStore(store_url)  # mypy checks the signatures (agentguard/stores/_store.py)
    for protocol in (ClaimStore, StepStore, AdminStore, Store):
        assert isinstance(store, protocol)
