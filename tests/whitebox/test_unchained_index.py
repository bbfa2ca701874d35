"""The ledger's expiry index holds only the entries outside any chain (``_attempts.UNCHAINED_INDEX``): those the
sweep deletes by their expiry. A chained entry is swept by its place, from its chain's start, so it is never in
that index, and writing it updates one index fewer. A store made by an earlier version has an index of every entry's
expiry; ``agentguard migrate`` replaces it (``SQLStore.replace_indexes``), opening the store never does."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from agentguard import Guard, task
from agentguard.stores import SQLStore
from agentguard.stores._attempts import ATTEMPTS, UNCHAINED_INDEX, UNCHAINED_REPLACEMENT

from conftest import BACKEND, raw_exec

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
OLD = UNCHAINED_REPLACEMENT.old  # agentguard_attempts_expires_idx: every entry's expiry
# Entries written before the store had a chain: no place in one, their expiry passed (a store's own write stamps
# them "now" by its clock; any time before it will do).
UNCHAINED_ROWS = (f"INSERT INTO {ATTEMPTS} (scope, key, task_id, operation, tool, kind, detail, attempt, process, at,"
                  " expires_at) VALUES ('default', 'k-old-1', 't-old', 'op', 'op', 'ran', 'succeeded', 1, 'p', 1, 2),"
                  " ('default', 'k-old-2', 't-old', 'op', 'op', 'ran', 'succeeded', 1, 'p', 1, 2)")


async def indexes(url: str) -> dict[str, str]:
    """The ledger's indexes by name, each as the database holds its definition."""
    sql = ("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = :t" if BACKEND == "sqlite" else
           "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = :t")
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return {name: definition or "" for name, definition in await conn.execute(text(sql), {"t": ATTEMPTS})}
    finally:
        await engine.dispose()


async def entries(url: str) -> list[tuple[str, int | None]]:
    """(key, place) of every entry, in order of id."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return [(k, s) for k, s in await conn.execute(text(f"SELECT key, seq FROM {ATTEMPTS} ORDER BY id"))]
    finally:
        await engine.dispose()


async def calls_and_sweep(url: str, task_id: str) -> list[tuple[str, int | None]]:
    """Three first calls (three chained entries) beside the two unchained expired ones, then a sweep: what is left."""
    async with Guard(url) as guard:
        @guard.once(key="order_id")
        async def charge(order_id: str) -> str:
            return f"ch-{order_id}"

        with task(task_id):
            for n in range(3):
                assert await charge(f"o-{n}") == f"ch-o-{n}"
        await guard.flush_ledger()
        await raw_exec(url, UNCHAINED_ROWS)
        assert sum(seq is None for _, seq in await entries(url)) == 2
        await guard.sweep()
        assert all(check.ok for check in await guard.verify_ledger())
    return await entries(url)


async def valid(url: str, name: str) -> bool:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return bool((await conn.execute(
                text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:n)"), {"n": name})).scalar())
    finally:
        await engine.dispose()


def is_partial(definition: str) -> bool:
    """The index's definition keeps only the entries outside a chain (as SQLite keeps the statement, and as
    Postgres writes it back)."""
    return definition.rstrip().endswith(("WHERE seq IS NULL", "WHERE (seq IS NULL)"))


async def test_the_expiry_index_holds_only_the_entries_outside_a_chain_and_the_sweep_finds_them(
    store_url: str,
) -> None:
    left = await calls_and_sweep(store_url, "t-partial")
    assert len(left) == 3 and all(seq is not None for _, seq in left)  # the unchained, expired: swept
    found = await indexes(store_url)
    assert UNCHAINED_INDEX in found and OLD not in found, found
    assert is_partial(found[UNCHAINED_INDEX]) and "expires_at" in found[UNCHAINED_INDEX], found[UNCHAINED_INDEX]
    if BACKEND == "sqlite":  # (Postgres' plans: tests/stores/test_sweep_plans.py)
        store = SQLStore(store_url)
        await store.ensure_schema()
        chain = store.ledger.chain
        statements = [store._executor._compiled(statement)[0] for statement in (chain.to_sweep, chain.sweep_unchained)]
        await store.dispose()
        db = sqlite3.connect(make_url(store_url).database or "")
        try:
            for sql in statements:
                plan = [r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, (100,) if "?" in sql else ())]
                uses = f"SEARCH {ATTEMPTS} USING INDEX {UNCHAINED_INDEX} (expires_at<?)"
                assert uses in plan and not any(step.startswith(f"SCAN {ATTEMPTS}") for step in plan), plan
        finally:
            db.close()


async def test_migrate_replaces_an_earlier_versions_expiry_index_and_opening_never_does(store_url: str) -> None:
    store = SQLStore(store_url)
    await store.ensure_schema()
    await store.dispose()
    # As an earlier version made it: every entry's expiry.
    await raw_exec(store_url, f"DROP INDEX {UNCHAINED_INDEX}")
    await raw_exec(store_url, f"CREATE INDEX {OLD} ON {ATTEMPTS} (expires_at)")
    left = await calls_and_sweep(store_url, "t-before")  # opened, called, swept: all as before
    assert len(left) == 3 and all(seq is not None for _, seq in left)
    found = await indexes(store_url)
    assert OLD in found and UNCHAINED_INDEX not in found, found  # (opening built nothing)

    out = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "agentguard.cli", "migrate", "--url", store_url],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert (f"replaced the ledger's expiry index of an earlier version ({OLD}) with {UNCHAINED_INDEX}"
            in out.stdout), out.stdout
    found = await indexes(store_url)
    assert OLD not in found and is_partial(found[UNCHAINED_INDEX]), found
    if BACKEND == "postgres":  # (built CONCURRENTLY: an interrupted build would leave it invalid)
        assert await valid(store_url, UNCHAINED_INDEX)

    left = await calls_and_sweep(store_url, "t-after")  # the new index serves the sweep as the old one did
    assert len(left) == 6 and all(seq is not None for _, seq in left)
    again = SQLStore(store_url)
    try:
        assert await again.replace_indexes() == []  # (nothing left to do)
    finally:
        await again.dispose()
