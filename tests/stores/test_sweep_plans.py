"""The sweep's plan does not depend on the planner's estimates.

An empty sweep reads no row of the calls table however large it is — 300,000 and 3,000,000 records, with no
statistics, fresh ones or stale ones, planned for the batch's size or generically — by Postgres' own counters
(``pg_stat_xact_user_tables``: what this transaction read, table by table); and a batch that deletes reads what
it deletes, not every expired record. On SQLite the plan (``EXPLAIN QUERY PLAN``) searches the expires_at index
and deletes by rowid, with and without statistics.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from agentguard import Guard
from agentguard.stores import SQLStore

from conftest import pg_dsn

pytestmark = pytest.mark.anyio

BATCH = 1000  # the guard's and `agentguard sweep`'s default largest batch

# Records made by the server at a million a few seconds: ``i`` numbers them; each expires ``{expires}``.
_ROWS = ("INSERT INTO agentguard_calls (scope, key, task_id, operation, fingerprint, arg_hashes, state, fence,"
         " origin, tool, attempts, created_at, updated_at, expires_at) SELECT 'default', 'k-' || i, 't', 'op', 'f',"
         " '{{}}', 'succeeded', i, i, 'op', 1, 0, 0, {expires} FROM generate_series({first}, {last}) AS i")
_LATER = "extract(epoch from clock_timestamp()) + 86400 + i"  # retained for a day more
_PAST = "extract(epoch from clock_timestamp()) - 86400 + i * 0.001"  # past retention


async def _sweep_sql(store: SQLStore) -> str:
    """The statement the store's own sweep sends (seen on its way to the driver); the sweep deletes nothing."""
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, stmt: str, _params: Any, context: Any, _many: bool) -> None:
        if context.compiled is not None and context.compiled.statement is store.sql.sweep:
            sent.append(stmt)

    event.listen(store.engine().sync_engine, "before_cursor_execute", seen)
    try:
        assert await store.sweep(batch=BATCH) == 0
    finally:
        event.remove(store.engine().sync_engine, "before_cursor_execute", seen)
    assert sent
    return sent[0]


def _nodes(plan: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan: (type, relation, index)."""
    found = [(plan["Node Type"], plan.get("Relation Name"), plan.get("Index Name"))]
    for child in plan.get("Plans", ()):
        found += _nodes(child)
    return found


async def _one_batch(url: str, sql: str, plans: str, table: str = "agentguard_calls",
                     ) -> tuple[dict[str, int], list[tuple[str, str | None, str | None]]]:
    """One batch of ``sql`` (a sweep's statement, its one parameter the batch's size) in a transaction rolled
    back, on a connection of its own, planned as ``plans`` says (``plan_cache_mode``: ``force_custom_plan``, for
    this batch's size; ``force_generic_plan``, for any, as a prepared statement may be after five runs): what it
    read of ``table`` by the server's counters, and its plan's nodes."""
    import asyncpg

    conn = await asyncpg.connect(pg_dsn(url))
    try:
        await conn.execute(f"SET plan_cache_mode = {plans}")
        await conn.execute(f"PREPARE batch AS {sql}")
        tx = conn.transaction()
        await tx.start()
        args = f"({BATCH})" if "$1" in sql else ""  # (the ledger's probe has no parameter)
        plan = json.loads(await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE batch{args}"))[0]["Plan"]
        await conn.execute(f"EXECUTE batch{args}")
        row = await conn.fetchrow(
            "SELECT seq_scan, seq_tup_read, idx_scan, idx_tup_fetch, n_tup_del FROM pg_stat_xact_user_tables"
            " WHERE relname = $1", table)
        await tx.rollback()
    finally:
        await conn.close()
    return dict(row), _nodes(plan)


@pytest.mark.postgres
@pytest.mark.slow
async def test_an_empty_sweep_reads_no_row_of_300k_or_3m_records_whatever_the_planner_estimates(
    store_url: str,
) -> None:
    import asyncpg

    store = SQLStore(store_url)
    await store.ensure_schema()
    conn = await asyncpg.connect(pg_dsn(store_url))
    try:
        # No statistics until the test makes them: autovacuum would analyse the table at its own moment.
        await conn.execute("ALTER TABLE agentguard_calls SET (autovacuum_enabled = false)")
        await conn.execute(_ROWS.format(expires=_LATER, first=1, last=300_000))
        sql = await _sweep_sql(store)
        await store.dispose()
        seen: dict[str, tuple[dict[str, int], Any]] = {}

        async def look(state: str) -> None:
            for plans in ("force_custom_plan", "force_generic_plan"):
                seen[f"{state}, {plans}"] = await _one_batch(store_url, sql, plans)

        # Without statistics Postgres guesses that a third of the table is expired.
        await look("300k, no statistics")
        await conn.execute("ANALYZE agentguard_calls")
        await look("300k, analysed")
        await conn.execute(_ROWS.format(expires=_LATER, first=300_001, last=3_000_000))
        await look("3M, statistics of 300k")  # (stale: the planner scales them by the table's size)
        await conn.execute("ANALYZE agentguard_calls")
        await look("3M, analysed")
    finally:
        await conn.close()
    for state, (read, nodes) in seen.items():
        # No sequential scan, not even one that found nothing; nothing deleted; a few index fetches at most (the
        # heap tuples at the index's edge), not one per row.
        assert read["seq_scan"] == 0 and read["seq_tup_read"] == 0 and read["n_tup_del"] == 0, (state, read, nodes)
        assert read["idx_tup_fetch"] <= 4, (state, read)
        assert ("Index Scan", "agentguard_calls", "agentguard_calls_expires_idx") in nodes, (state, nodes)
        assert not [n for n in nodes if n[0] == "Seq Scan"], (state, nodes)


@pytest.mark.postgres
@pytest.mark.slow
async def test_the_guards_own_empty_sweep_leaves_the_servers_count_of_sequential_scans_unchanged(
    store_url: str,
) -> None:
    """The same, by the server's cumulative counters (``pg_stat_user_tables``, of the test's own database) around
    what a user runs — ``Guard.sweep``, on its own pooled connections — at 300,000 records, analysed or not."""
    import asyncpg

    conn = await asyncpg.connect(pg_dsn(store_url))

    async def counts() -> tuple[int, int]:
        """(seq_scan, idx_scan) of the calls table, once every other session has ended: a session reports its
        counts when it ends, so none are still to come."""
        for _ in range(600):
            if not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                       " AND pid <> pg_backend_pid()"):
                break
            await asyncio.sleep(0.05)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await conn.fetchrow("SELECT seq_scan, idx_scan FROM pg_stat_user_tables WHERE relname = $1",
                                  "agentguard_calls")
        return row["seq_scan"], row["idx_scan"] or 0

    try:
        async with Guard(store_url) as guard:
            await guard._store.ensure_schema()  # type: ignore[attr-defined]
        await conn.execute("ALTER TABLE agentguard_calls SET (autovacuum_enabled = false)")
        await conn.execute(_ROWS.format(expires=_LATER, first=1, last=300_000))
        for analysed in (False, True):
            if analysed:
                await conn.execute("ANALYZE agentguard_calls")
            (seq_before, idx_before) = await counts()
            async with Guard(store_url) as guard:
                assert await guard.sweep(batch=BATCH) == 0
            (seq_after, idx_after) = await counts()
            assert seq_after == seq_before, (analysed, seq_before, seq_after)  # no sequential read of it
            assert idx_after > idx_before, analysed  # (the sweep's counts are in: it went through the index)
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_a_batch_that_deletes_reads_what_it_deletes_not_every_expired_record(store_url: str) -> None:
    import asyncpg

    store = SQLStore(store_url)
    await store.ensure_schema()
    conn = await asyncpg.connect(pg_dsn(store_url))
    try:
        await conn.execute("ALTER TABLE agentguard_calls SET (autovacuum_enabled = false)")
        await conn.execute(_ROWS.format(expires=_PAST, first=1, last=40_000))
        await conn.execute(_ROWS.format(expires=_LATER, first=40_001, last=80_000))
        await conn.execute("ANALYZE agentguard_calls")  # (it knows half the table is expired)
        sql, _ = store._executor._compiled(store.sql.sweep)
        await store.dispose()
        for plans in ("force_custom_plan", "force_generic_plan"):
            read, nodes = await _one_batch(store_url, sql, plans)
            # the oldest BATCH records, each fetched once by the index and deleted by its address
            assert read["n_tup_del"] == BATCH and read["seq_tup_read"] == 0, (plans, read, nodes)
            assert read["idx_tup_fetch"] <= BATCH + 4, (plans, read, nodes)
        oldest = await conn.fetchval("SELECT min(key) FROM agentguard_calls")  # (rolled back: all still there)
        assert oldest == "k-1"
    finally:
        await conn.close()
    # and the store's own sweep deletes exactly the expired ones
    swept = SQLStore(store_url)
    try:
        assert await swept.sweep(batch=BATCH) == 40_000
    finally:
        await swept.dispose()


@pytest.mark.postgres
async def test_the_ledgers_empty_sweep_reads_no_row_of_300k_entries_whatever_the_planner_estimates(
    store_url: str,
) -> None:
    import asyncpg

    store = SQLStore(store_url)
    await store.ensure_schema()
    # An empty sweep of the ledger sends only its probe (anything expired, chained or not?).
    sql, _ = store._executor._compiled(store.ledger.chain.to_sweep)
    await store.dispose()
    conn = await asyncpg.connect(pg_dsn(store_url))
    try:
        await conn.execute("ALTER TABLE agentguard_attempts SET (autovacuum_enabled = false)")
        await conn.execute(
            "INSERT INTO agentguard_attempts (scope, key, task_id, operation, tool, kind, detail, attempt, process, at,"
            " expires_at) SELECT 'default', 'k-' || i, 't', 'op', 'op', 'ran', 'succeeded', 1, 'p', 0,"
            f" {_LATER} FROM generate_series(1, 300000) AS i")
        seen = {}
        for state in ("no statistics", "analysed"):
            for plans in ("force_custom_plan", "force_generic_plan"):
                seen[f"{state}, {plans}"] = await _one_batch(store_url, sql, plans, "agentguard_attempts")
            await conn.execute("ANALYZE agentguard_attempts")
    finally:
        await conn.close()
    for state, (read, nodes) in seen.items():
        assert read["seq_scan"] == 0 and read["n_tup_del"] == 0 and read["idx_tup_fetch"] <= 4, (state, read, nodes)
        # (the index holds only the entries outside a chain, the probe's own condition: read from it alone)
        assert {("Index Scan", "agentguard_attempts", "agentguard_attempts_unchained_idx"),
                ("Index Only Scan", "agentguard_attempts", "agentguard_attempts_unchained_idx")} & set(nodes), (
            state, nodes)


def _sqlite_plan(path: Path, sql: str) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, (BATCH,))]
    finally:
        db.close()


@pytest.mark.storeless
async def test_sqlite_sweeps_through_the_index_and_deletes_by_rowid(tmp_path: Path) -> None:
    path = tmp_path / "sweep.db"
    store = SQLStore(f"sqlite+aiosqlite:///{path}")
    await store.ensure_schema()
    sql, _ = store._executor._compiled(store.sql.sweep)
    await store.dispose()
    db = sqlite3.connect(path)
    try:
        db.execute("INSERT INTO agentguard_calls (scope, key, task_id, operation, fingerprint, arg_hashes, state,"
                   " fence, origin, tool, attempts, created_at, updated_at, expires_at) WITH RECURSIVE n(i) AS"
                   " (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) SELECT 'default', 'k-' || i, 't',"
                   " 'op', 'f', '{}', 'succeeded', i, i, 'op', 1, 0, 0, CAST(strftime('%s', 'now') AS REAL) + 86400 + i"
                   " FROM n")
        db.commit()
    finally:
        db.close()
    plans = {"no statistics": _sqlite_plan(path, sql)}
    db = sqlite3.connect(path)
    db.execute("ANALYZE")
    db.close()
    plans["analysed"] = _sqlite_plan(path, sql)
    for state, plan in plans.items():
        assert "SEARCH agentguard_calls USING INDEX agentguard_calls_expires_idx (expires_at<?)" in plan, (state, plan)
        assert "SEARCH agentguard_calls USING INTEGER PRIMARY KEY (rowid=?)" in plan, (state, plan)
        assert not [line for line in plan if line.startswith("SCAN agentguard_calls")], (state, plan)
