"""A record is found by its primary key, whatever the planner knows of the table.

Every statement that names one record (``scope = :scope AND key = :key``: the read, the completion, the release,
a renewal, the steps' statements ...) is planned through the primary key on Postgres — generically, as a prepared
statement is after five runs and then kept for the connection's life, on a table of three records without
statistics and on one of 20,000 analysed. Before the task index came first, a small table without statistics had
the read and the completion planned through ``(scope, task_id, created_at)`` with the key as a filter: every call
read its whole scope, and a replay took 41 -> 234 us after 2,800 records (issue 34). A Postgres store made with
that index is told so when opened and ``agentguard migrate`` replaces it without blocking writes; SQLite replaces
it when the store is opened, and its planner takes the primary key for both.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import TextClause

from agentguard import Guard, task
from agentguard.stores import SQLStore
from agentguard.stores._schema import OLD_TASK_INDEX, STEPS, TABLE, TASK_INDEX

from conftest import ROOT, pg_dsn

pytestmark = pytest.mark.anyio

_ROWS = ("INSERT INTO agentguard_calls (scope, key, task_id, operation, fingerprint, arg_hashes, state, fence,"
         " origin, tool, attempts, created_at, updated_at, expires_at) SELECT 'default', 'k-' || i, 't', 'op', 'f',"
         " '{{}}', 'succeeded', i, i, 'op', 1, i, i, 4e9 FROM generate_series({first}, {last}) AS i")
_STEPS = ("INSERT INTO agentguard_steps (scope, key, origin, name, seq, state, fence, updated_at) SELECT 'default',"
          " 'k-' || i, i, 'step', 1, 'done', i, i FROM generate_series({first}, {last}) AS i")
_OLD_INDEX = f"CREATE INDEX {OLD_TASK_INDEX} ON {TABLE} (scope, task_id, created_at)"


async def _key_statements(url: str) -> dict[str, tuple[str, int]]:
    """The statements that name one record by its key of a store at ``url`` (its schema made), compiled for its
    driver: name -> (SQL, number of parameters)."""
    store = SQLStore(url)
    try:
        await store.ensure_schema()
        found = {}
        for name, stmt in vars(store.sql).items():
            if isinstance(stmt, TextClause) and "scope = :scope AND key = :key" in stmt.text:
                sql, _ = store._executor._compiled(stmt)
                found[name] = (sql, max((int(n) for n in re.findall(r"\$(\d+)", sql)), default=0))
    finally:
        await store.dispose()
    # (the ones a call makes: found by the text they share, so a new one is checked without being listed here)
    assert {"read", "complete", "release", "renew", "load_steps"} <= set(found), sorted(found)
    # The completion's form for many callers (each caller's statement, in one pipeline): planned as the single one.
    many = store.sql.complete_many
    if many is not None:
        found["complete_many"] = (many.sql, len(many.names))
    return found


def _nodes(plan: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    found = [(plan["Node Type"], plan.get("Relation Name"), plan.get("Index Name"))]
    for child in plan.get("Plans", ()):
        found += _nodes(child)
    return found


async def _generic_plans(url: str, statements: dict[str, tuple[str, int]]) -> dict[str, list[Any]]:
    """Each statement's generic plan (as a prepared statement's after five runs), on a connection of its own."""
    import asyncpg

    conn = await asyncpg.connect(pg_dsn(url))
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        plans = {}
        for i, (name, (sql, n)) in enumerate(statements.items()):
            await conn.execute(f"PREPARE s{i} AS {sql}")
            args = f"({', '.join(['NULL'] * n)})" if n else ""
            plan = json.loads(await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE s{i}{args}"))[0]["Plan"]
            plans[name] = _nodes(plan)
        return plans
    finally:
        await conn.close()


def _by_key(nodes: list[tuple[str, str | None, str | None]], steps_known: bool = True) -> bool:
    """The records read only through their primary key; the steps too, once the planner knows their size
    (``steps_known``: a steps table of one page, never analysed, is read whole by an operator's settling
    statement's test of started steps, as cheap as its index there)."""
    read = [(kind, table, index) for kind, table, index in nodes if table is not None and kind != "ModifyTable"]
    return (bool(read) and all(index == f"{table}_pkey" or (kind == "Seq Scan" and table == STEPS and not steps_known)
                               for kind, table, index in read))


@pytest.mark.postgres
async def test_every_statement_naming_a_record_is_planned_through_the_primary_key(store_url: str) -> None:
    import asyncpg

    statements = await _key_statements(store_url)
    conn = await asyncpg.connect(pg_dsn(store_url))
    try:
        # No statistics until the test makes them: autovacuum would analyse the tables at its own moment.
        for table in (TABLE, STEPS):
            await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        await conn.execute(_ROWS.format(first=1, last=3))
        await conn.execute(_STEPS.format(first=1, last=3))
        seen = {"3 records, no statistics": await _generic_plans(store_url, statements)}
        await conn.execute(_ROWS.format(first=4, last=20_000))
        await conn.execute(_STEPS.format(first=4, last=20_000))
        await conn.execute(f"ANALYZE {TABLE}")
        await conn.execute(f"ANALYZE {STEPS}")
        seen["20,000 records, analysed"] = await _generic_plans(store_url, statements)
    finally:
        await conn.close()
    wrong = [(state, name, nodes) for state, plans in seen.items() for name, nodes in plans.items()
             if not _by_key(nodes, steps_known="analysed" in state)]
    assert not wrong, wrong


@pytest.mark.postgres
async def test_a_store_made_with_the_scope_first_index_is_told_at_open_and_migrate_replaces_it(
    store_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Opening such a store builds nothing (a build that blocks writes would hold every worker's completions
    and renewals meanwhile) and says what to run; ``agentguard migrate`` builds the index ``CONCURRENTLY`` and
    drops the old one, while a guard of the same store goes on claiming and completing, every call answered."""
    import asyncpg

    statements = await _key_statements(store_url)
    conn = await asyncpg.connect(pg_dsn(store_url))
    try:
        # The store as an earlier version made it: its task index with the scope first.
        await conn.execute(f"DROP INDEX {TASK_INDEX}")
        await conn.execute(_OLD_INDEX)
        for table in (TABLE, STEPS):
            await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        await conn.execute(_ROWS.format(first=1, last=3))
        before = await _generic_plans(store_url, statements)
        # What the check above refuses: the read through the old index, the key a filter over the whole scope.
        assert (not _by_key(before["read"])
                and ("Index Scan", TABLE, OLD_TASK_INDEX) in before["read"]), before["read"]
        # The store has grown meanwhile (the new index's build counts its records for the planner).
        await conn.execute(_ROWS.format(first=4, last=20_000))
        await conn.execute(_STEPS.format(first=1, last=20_000))
        reopened = SQLStore(store_url)
        try:
            with caplog.at_level(logging.WARNING, logger="agentguard"):
                await reopened.ensure_schema()
        finally:
            await reopened.dispose()
        (warned,) = [r.getMessage() for r in caplog.records if OLD_TASK_INDEX in r.getMessage()]
        assert "run `agentguard migrate`" in warned, warned
        assert await conn.fetchval(f"SELECT to_regclass('{TASK_INDEX}') IS NULL")  # nothing built at open

        async with Guard(store_url) as guard:
            @guard.once(key="n")
            async def claim(n: int) -> int:
                return n

            stop = asyncio.Event()

            async def calls() -> int:  # claims (and completions) all along the build
                made = 0
                with task("t-during-the-build"):
                    while not stop.is_set():
                        assert await claim(made) == made
                        made += 1
                return made

            going = asyncio.create_task(calls())
            out = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "agentguard.cli", "migrate", "--url", store_url],
                capture_output=True, text=True, timeout=120, cwd=ROOT)
            stop.set()
            made = await going
        assert out.returncode == 0, out.stderr
        assert f"replaced the task index of an earlier version ({OLD_TASK_INDEX}) with {TASK_INDEX}" in out.stdout
        assert made > 0
        assert await conn.fetchval(f"SELECT to_regclass('{OLD_TASK_INDEX}') IS NULL")
        row = await conn.fetchrow(
            "SELECT i.indisvalid, string_agg(a.attname, ',' ORDER BY k.n) AS columns FROM pg_index i,"
            " unnest(i.indkey) WITH ORDINALITY AS k(att, n), pg_attribute a WHERE i.indexrelid = to_regclass($1)"
            " AND a.attrelid = i.indrelid AND a.attnum = k.att GROUP BY i.indisvalid", TASK_INDEX)
        assert (row["indisvalid"], row["columns"]) == (True, "task_id,scope,created_at")
        after = await _generic_plans(store_url, statements)
        assert all(_by_key(nodes, steps_known=False) for nodes in after.values()), after
        # ... and again: nothing left to do.
        again = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "agentguard.cli", "migrate", "--url", store_url],
            capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert again.returncode == 0 and "replaced" not in again.stdout, again.stdout + again.stderr
    finally:
        await conn.close()


@pytest.mark.storeless
async def test_sqlite_reads_a_record_by_its_key_with_either_index_and_migrate_replaces_the_old_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys.db"
    url = f"sqlite+aiosqlite:///{path}"
    store = SQLStore(url)
    await store.ensure_schema()
    sql, _ = store._executor._compiled(store.sql.read)
    await store.dispose()

    def look() -> tuple[dict[str, str], list[str]]:
        db = sqlite3.connect(path)
        try:
            indexes = {r[0]: r[1] for r in db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'")}
            return indexes, [r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, ("default", "k"))]
        finally:
            db.close()

    by_key = ["SEARCH agentguard_calls USING INDEX sqlite_autoindex_agentguard_calls_1 (scope=? AND key=?)"]
    db = sqlite3.connect(path)
    try:
        db.execute(f"DROP INDEX {TASK_INDEX}")
        db.execute(_OLD_INDEX)
        db.commit()
    finally:
        db.close()
    reopened = SQLStore(url)
    try:
        await reopened.ensure_schema()  # (opening builds nothing)
        indexes, plan = look()
        assert OLD_TASK_INDEX in indexes and TASK_INDEX not in indexes and plan == by_key, (indexes, plan)
        assert [index.name for index in await reopened.replace_indexes()] == [TASK_INDEX]
        indexes, plan = look()
        assert OLD_TASK_INDEX not in indexes and "(task_id, scope, created_at)" in indexes[TASK_INDEX], indexes
        assert plan == by_key
        assert await reopened.replace_indexes() == []  # (nothing left to do)
    finally:
        await reopened.dispose()
