"""Postgres with ``pg_claim_unsynced=True``: a claim's transaction (and a takeover's) commits with
``synchronous_commit`` off, and only those — the completion's commit stays synced and flushes the claim's WAL
with its own. Seen by the server: the store's own claim statement, run inside a transaction, leaves
``SHOW synchronous_commit`` at ``off`` for that transaction; without the option, at the server's setting. The
benchmark counts the WAL flushes per first call (2, and 1 with the option)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text

from agentguard import Guard, task
from agentguard.stores import SQLStore

from conftest import tid

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


def _params() -> dict[str, Any]:
    return {
        "scope": "default", "key": "ag_" + uuid.uuid4().hex, "task_id": "t", "operation": "charge",
        "fingerprint": "f", "arg_hashes": "{}", "fence": 1, "tool": "charge", "arguments": None, "owner": "o",
        "lease": 30.0, "retention": 60.0, "audit": None,
    }


async def _setting_after(store: SQLStore, stmt: Any, params: dict[str, Any]) -> str:
    """``synchronous_commit`` in a transaction, after ``stmt`` ran in it (rolled back: nothing stays)."""
    async with store.engine().connect() as autocommitted:
        conn = await autocommitted.execution_options(isolation_level="READ COMMITTED")  # (the store's: autocommit)
        tx = await conn.begin()
        try:
            await conn.execute(stmt, params)
            return str((await conn.execute(text("SHOW synchronous_commit"))).scalar())
        finally:
            await tx.rollback()


@pytest.mark.parametrize("unsynced", [True, False])
async def test_the_claim_alone_commits_unsynced(store_url: str, unsynced: bool) -> None:
    store = SQLStore(store_url, pg_claim_unsynced=unsynced)
    await store.ensure_schema()
    try:
        server = await _setting_after(store, text("SELECT 1"), {})
        assert server != "off"  # (the server's own setting: synced)
        expected = "off" if unsynced else server
        params = _params()
        assert await _setting_after(store, store.sql.claim, params) == expected
        # A takeover is a claim too: of a released record here.
        assert await store.claim(params) == 1
        assert await store.release(params["scope"], params["key"], 1, 60.0)
        taking = {**params, "owner": "o2", "reset": 0}
        assert await _setting_after(store, store.sql.take_over, taking) == expected
        # The completion and the release commit at the server's setting whatever the option.
        assert await _setting_after(store, store.sql.complete, {
            "scope": params["scope"], "key": params["key"], "fence": 1, "state": "succeeded", "result": "1",
            "retention": 60.0, "audit": None}) == server
    finally:
        await store.dispose()


async def test_unsynced_claims_keep_the_contract(store_url: str) -> None:
    """First call, replay, and a takeover after a release, with the same downstream key."""
    runs: list[str] = []
    async with Guard(store_url, pg_claim_unsynced=True, cache_size=0) as guard:

        @guard.once(key=["order_id"])
        async def charge(order_id: str, idempotency_key: str = "") -> str:
            runs.append(idempotency_key)
            if len(runs) == 1:
                raise ConnectionError("provider down")  # released: the retry takes it over
            return f"{order_id}:{idempotency_key}"

        with task(tid()):
            with pytest.raises(ConnectionError):
                await charge("o-1")
            first = await charge("o-1")
            assert await charge("o-1") == first
    assert len(runs) == 2 and runs[0] == runs[1]


def test_the_option_is_checked() -> None:
    with pytest.raises(ValueError, match="pg_claim_unsynced"):
        SQLStore("postgresql+asyncpg://u@localhost/db", pg_claim_unsynced="yes")  # type: ignore[arg-type]
