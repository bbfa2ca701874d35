"""The keys' rows (``agentguard_ledger_keys``) are written by three kinds of transaction: the ledger's batches
(a refusal's key, a late entry's), the records' trigger (a sweep's or a forget's deletion) and the keys' own sweep.
Each takes the rows it writes in the keys' order, so two of them never each hold a row the other waits for. Before,
a ledger batch and a deletion of the same records, crosswise, were a deadlock on Postgres (CI met it once, between
the stateful engine test's reset and a guard's batch): one of them was aborted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from agentguard import Guard, task
from agentguard.stores import SQLStore
from agentguard.stores._attempts import RAN, REFUSED, kept_keys

from conftest import BACKEND, pg_dsn

pytestmark = pytest.mark.anyio
postgres_only = pytest.mark.skipif(BACKEND != "postgres",
                                   reason="Postgres-only test (AGENTGUARD_TEST_BACKEND=postgres)")


def entry(key: str, kind: str, at: float, expires: float, scope: str = "s") -> tuple[Any, ...]:
    """An entry's values (``_attempts.WRITTEN``)."""
    return (scope, key, "t", "op", "tool", kind, "", 1, None, "host:1", at, None, None, expires)


def test_a_batch_writes_its_key_rows_in_the_keys_order_one_each() -> None:
    now, late = 1_000_000.0, 900_000.0
    rows = kept_keys([
        entry("kc", REFUSED, now, now + 10),
        entry("ka", RAN, now, now + 10),  # on time, not a refusal: its record finds its key
        entry("kb", RAN, late - 1, late + 5),  # late
        entry("ka", REFUSED, now, now + 30, scope="s2"),
        entry("kc", REFUSED, now, now + 20),  # the same key again: its latest expiry
        entry("", REFUSED, now, now + 10),  # a refusal before a key (a missing task): none
    ], late)
    assert rows == [("ka", "s2", "t", now + 30), ("kb", "s", "t", late + 5), ("kc", "s", "t", now + 20)]


async def two_records(url: str) -> Any:
    """A connection to a store with two records, ``kb`` written before ``ka`` (so a scan of the table meets the
    larger key first), each with an expired row in the keys' table (so writing one locks a row)."""
    async with Guard(url) as guard:
        @guard.once(key=["order_id"], operation="charge")
        async def charge(order_id: str) -> str:
            return order_id

        with task("t"):
            await charge("o1")
    conn = await asyncpg.connect(pg_dsn(url))
    columns = [r[0] for r in await conn.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'agentguard_calls'"
        " ORDER BY ordinal_position")]
    copied = ", ".join("$1" if c == "key" else c for c in columns)
    for key in ("kb", "ka"):
        await conn.execute(f"INSERT INTO agentguard_calls ({', '.join(columns)}) SELECT {copied}"
                           " FROM agentguard_calls WHERE key NOT IN ('ka', 'kb')", key)
    await conn.execute("DELETE FROM agentguard_calls WHERE key NOT IN ('ka', 'kb')")
    await conn.execute("DELETE FROM agentguard_ledger_keys")
    await conn.execute("INSERT INTO agentguard_ledger_keys (key, scope, task_id, expires_at)"
                       " SELECT key, scope, task_id, 0 FROM agentguard_calls")
    return conn


async def a_session_waits_for_a_lock(conn: Any) -> None:
    """Until another session on this database waits for a lock (a state, not a time)."""
    for _ in range(2400):
        await conn.execute("SELECT pg_stat_clear_snapshot()")  # (else a transaction sees its first reading)
        if await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                               " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"):
            return
        await asyncio.sleep(0.025)
    raise AssertionError("no session waited for a lock")


async def holds_ka(conn: Any) -> bool:
    """Whether another transaction holds ``ka``'s row of the keys' table."""
    try:
        await conn.fetch("SELECT 1 FROM agentguard_ledger_keys WHERE key = 'ka' FOR UPDATE NOWAIT")
    except asyncpg.LockNotAvailableError:
        return True
    return False


async def held_ka_behind_kb(conn: Any, writing: Callable[[], Awaitable[Any]]) -> bool:
    """With ``kb``'s row of the keys' table held, ``writing()`` (a transaction that writes both keys' rows) is
    started: once it waits, whether it holds ``ka``'s already (it went in the keys' order). Then it finishes."""
    hold = conn.transaction()
    await hold.start()
    await conn.execute("UPDATE agentguard_ledger_keys SET task_id = task_id WHERE key = 'kb'")
    running = asyncio.ensure_future(writing())
    try:
        await a_session_waits_for_a_lock(conn)
        return await holds_ka(conn)
    finally:
        await hold.rollback()
        await running


@postgres_only
async def test_a_deletion_writes_its_key_rows_in_the_keys_order(store_url: str) -> None:
    """The records' trigger: a scan of the table meets ``kb`` first; the key rows are written ``ka`` first."""
    conn, other = await two_records(store_url), await asyncpg.connect(pg_dsn(store_url))
    try:
        assert await held_ka_behind_kb(conn, lambda: other.execute("DELETE FROM agentguard_calls"))
        assert await conn.fetchval("SELECT count(*) FROM agentguard_calls") == 0
    finally:
        await other.close()
        await conn.close()


@postgres_only
async def test_the_keys_sweep_writes_its_rows_in_the_keys_order(store_url: str) -> None:
    """The keys' sweep finds ``kb`` first (its row expired first, no entry left of either key) and deletes the
    rows ``ka`` first."""
    conn = await two_records(store_url)
    store = SQLStore(store_url)
    try:
        await conn.execute("UPDATE agentguard_ledger_keys SET expires_at = CASE key WHEN 'kb' THEN 1 ELSE 2 END;"
                           " DELETE FROM agentguard_attempts")
        assert await held_ka_behind_kb(conn, store.ledger.sweep_attempts)
        assert await conn.fetchval("SELECT count(*) FROM agentguard_ledger_keys") == 0  # both swept
    finally:
        await store.dispose()
        await conn.close()
