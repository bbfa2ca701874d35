"""The sweep, at scale and beside claims: it deletes exactly the expired records nobody holds, over many short
batches, while another process claims; and a sweep with nothing to delete reads no row, however large the
table (counted by the database: SQLite's virtual-machine steps, Postgres' per-table tuple counters)."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

from agentguard import Guard
from agentguard.stores import SQLStore
from agentguard.stores._sweep import FIRST

from conftest import pg_dsn, tid

pytestmark = pytest.mark.anyio

CALLS = ("scope, key, task_id, operation, fingerprint, arg_hashes, state, fence, origin, tool, attempts, owner,"
         " lease_until, created_at, updated_at, expires_at, result")
CLAIMER = str(Path(__file__).resolve().parents[1] / "sweep_claimer.py")
STEP_COLS = "scope, key, origin, name, seq, state, fence, result, updated_at"


def _row(key: str, state: str, expires_in: float, lease_in: float | None = None) -> dict[str, Any]:
    now = time.time()
    names = [c.strip() for c in CALLS.split(",")]
    values = ["default", key, "bulk", "op", "f" * 64, "{}", state, 1, 1, "op", 1,
              "someone" if state == "running" else None, None if lease_in is None else now + lease_in,
              now - 10, now - 10, now + expires_in, '"r"' if state == "succeeded" else None]
    return dict(zip(names, values, strict=True))


async def _insert(store: SQLStore, rows: list[dict[str, Any]], steps: list[dict[str, Any]]) -> None:
    """Rows written behind the store's back (records past their retention cannot be made through it quickly);
    on SQLite by stdlib ``sqlite3`` in one transaction (a tenth of the time of SQLAlchemy's executemany)."""
    url = store.engine().url
    if url.get_backend_name() == "sqlite":
        await asyncio.to_thread(_insert_sqlite, str(url.database), rows, steps)
        return
    async with store.engine().begin() as conn:
        names = [c.strip() for c in CALLS.split(",")]
        await conn.execute(text(f"INSERT INTO agentguard_calls ({CALLS}) VALUES"
                                f" ({', '.join(':' + n for n in names)})"), rows)
        if steps:
            await conn.execute(text(f"INSERT INTO agentguard_steps ({STEP_COLS}) VALUES"
                                    " (:scope, :key, 1, :name, 1, 'done', 1, '1', 0)"), steps)


def _insert_sqlite(path: str, rows: list[dict[str, Any]], steps: list[dict[str, Any]]) -> None:
    names = [c.strip() for c in CALLS.split(",")]
    _execute_sqlite(path, f"INSERT INTO agentguard_calls ({CALLS}) VALUES ({', '.join(':' + n for n in names)})", rows)
    if steps:
        _execute_sqlite(path, f"INSERT INTO agentguard_steps ({STEP_COLS}) VALUES"
                              " (:scope, :key, 1, :name, 1, 'done', 1, '1', 0)", steps)


async def _keys(store: SQLStore, table: str = "agentguard_calls") -> set[str]:
    async with store.engine().connect() as conn:
        return {r[0] for r in await conn.execute(text(f"SELECT key FROM {table}"))}


async def test_the_sweep_deletes_exactly_the_expired_records_nobody_holds_beside_another_processes_claims(
    store_url: str,
) -> None:
    expired = [_row(f"gone-{i}", "succeeded", -60) for i in range(1500)]
    dead = [_row(f"dead-{i}", "running", -60, lease_in=-30) for i in range(50)]  # its worker is gone
    held = [_row(f"held-{i}", "running", -60, lease_in=600) for i in range(50)]  # past retention, lease live
    kept = [_row(f"kept-{i}", "succeeded", 600) for i in range(300)]
    steps = [{"scope": "default", "key": r["key"], "name": "a"} for r in (*expired[:200], *kept[:100], *held[:10])]
    store = SQLStore(store_url)
    await store.ensure_schema()
    await _insert(store, [*expired, *dead, *held, *kept], steps)
    claimer_task = tid()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, CLAIMER, store_url, claimer_task,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert (await proc.stdout.readline()).strip() == b"ready"
        sizes: list[int] = []
        statement = store.sql.sweep

        def seen(_conn: Any, _cursor: Any, stmt: str, params: Any, context: Any, _many: bool) -> None:
            if context.compiled is not None and context.compiled.statement is statement:
                sizes.append(int(context.compiled_parameters[0]["batch"]))

        event.listen(store.engine().sync_engine, "before_cursor_execute", seen)
        deleted = await store.sweep(batch=64)
        proc.stdin.write(b"stop\n")
        await proc.stdin.drain()
        made, runs = map(int, (await proc.stdout.readline()).split())
        assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert deleted == len(expired) + len(dead)
    # many short batches, none above the caller's bound
    assert len(sizes) >= (len(expired) + len(dead)) // 64 and max(sizes) <= 64 and sizes[0] == min(FIRST, 64)
    left = await _keys(store)
    ours = {k for k in left if not k.startswith(("held-", "kept-"))}
    assert left - ours == {r["key"] for r in (*held, *kept)}
    assert len(ours) == made + 1 and runs == made + 1  # every claim of the other process kept, each run once
    # the steps of the deleted records went with them; the others' stayed
    assert await _keys(store, "agentguard_steps") == {s["key"] for s in steps if not s["key"].startswith("gone-")}
    await store.dispose()


async def _empty_sweep(url: str, n: int, prefix: str = "a") -> list[tuple[str, Any]]:
    """The statements a guard's sweep sends on a store of ``n`` live records, ``n`` ledger entries and ``n`` keys'
    rows (of records gone), none of them expired (each sweep deletes nothing); the tables are analysed first, as
    autovacuum would."""
    async with Guard(url) as guard:
        await guard.ensure_schema()
        store = guard._store
        assert isinstance(store, SQLStore)
        await _insert(store, [_row(f"{prefix}-live-{i}", "succeeded", 600) for i in range(n)], [])
        now = time.time()
        entries = [{"k": f"{prefix}-{i}", "now": now, "until": now + 600} for i in range(n)]
        attempts = ("INSERT INTO agentguard_attempts (scope, key, task_id, operation, tool, kind, detail, attempt,"
                    " process, at, expires_at) VALUES ('default', :k, 't', 'op', 'op', 'ran', 'succeeded', 1,"
                    " 'p', :now, :until)")
        keys = ("INSERT INTO agentguard_ledger_keys (key, scope, task_id, expires_at)"
                " VALUES (:k, 'default', 't', :until)")
        if url.startswith("sqlite"):
            for stmt in (attempts, keys):
                await asyncio.to_thread(_execute_sqlite, str(make_url(url).database), stmt, entries)
        async with store.engine().begin() as conn:
            if not url.startswith("sqlite"):
                await conn.execute(text(attempts), entries)
                await conn.execute(text(keys), entries)
            await conn.execute(text("ANALYZE"))
        sent: list[tuple[str, Any]] = []

        def seen(_conn: Any, _cursor: Any, stmt: str, params: Any, _context: Any, _many: bool) -> None:
            sent.append((stmt, params))

        event.listen(store.engine().sync_engine, "before_cursor_execute", seen)
        assert await guard.sweep() == 0
        event.remove(store.engine().sync_engine, "before_cursor_execute", seen)
    return sent


def _execute_sqlite(path: str, stmt: str, rows: list[dict[str, Any]]) -> None:
    db = sqlite3.connect(path, isolation_level=None, timeout=60)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.executemany(stmt, rows)
        db.execute("COMMIT")
    finally:
        db.close()


def _vm_steps(path: str, sent: list[tuple[str, Any]]) -> int:
    """SQLite: the virtual-machine instructions ``sent`` takes on the file at ``path``, as SQLite counts them
    (a progress handler called at every instruction): a row read is many instructions, so an equal count on a
    small and a large table means no row of the large one was read."""
    db = sqlite3.connect(path, isolation_level=None)
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    try:
        db.set_progress_handler(tick, 1)
        for stmt, params in sent:
            db.execute(stmt, params)
    finally:
        db.close()
    return steps[0]


async def _tuples_read(url: str, sent: list[tuple[str, Any]]) -> dict[str, tuple[int, ...]]:
    """Postgres: what ``sent`` read, table by table (sequential and index tuples, rows deleted), by the server's
    counters for the current transaction, which is rolled back."""
    import asyncpg

    conn = await asyncpg.connect(pg_dsn(url))
    try:
        tx = conn.transaction()
        await tx.start()
        for stmt, params in sent:
            await conn.execute(stmt, *params)
        rows = await conn.fetch(
            "SELECT relname, seq_tup_read, idx_tup_fetch, n_tup_del FROM pg_stat_xact_user_tables"
            " WHERE relname IN ('agentguard_calls', 'agentguard_attempts', 'agentguard_steps',"
            " 'agentguard_ledger_keys')")
        await tx.rollback()
    finally:
        await conn.close()
    return {r["relname"]: (r["seq_tup_read"], r["idx_tup_fetch"], r["n_tup_del"]) for r in rows}


async def test_a_sweep_with_nothing_to_delete_reads_no_row_however_large_the_table(
    store_url: str, tmp_path: Path,
) -> None:
    small, large = 200, 20_000
    urls = {n: f"sqlite+aiosqlite:///{tmp_path / f'sweep-{n}.db'}" for n in (small, large)}
    sent = {small: await _empty_sweep(urls[small], small)} if store_url.startswith("sqlite") else {}
    if store_url.startswith("sqlite"):
        sent[large] = await _empty_sweep(urls[large], large)
        # the records' sweep, the ledger's and its keys': no orphans' pass after a sweep that deleted nothing
        assert [s for s, _ in sent[large]] == [s for s, _ in sent[small]] and len(sent[large]) == 3
        path = {n: str(make_url(urls[n]).database) for n in (small, large)}
        counts = {n: _vm_steps(path[n], sent[n]) for n in (small, large)}
        # a statement that reads every row takes more than an instruction per row: the counter sees rows
        scan = _vm_steps(path[large], [("SELECT count(*) FROM agentguard_calls WHERE expires_at + 0 < 0", ())])
        assert scan > large
        # the sweep's statements take the same few instructions on 200 rows as on 20,000 (the planner may pick
        # another index by the tables' statistics: a few instructions more or less, not one per row)
        assert max(counts.values()) < 500 and abs(counts[large] - counts[small]) < 50, counts
        return
    # Postgres: two large sizes (a table of 200 is read whole by choice: the planner's, not the sweep's), the
    # second the first filled further; the server's counters for the sweep's statements alike, no row read.
    sent[large] = await _empty_sweep(store_url, large, "a")
    first = await _tuples_read(store_url, sent[large])
    sent[2 * large] = await _empty_sweep(store_url, large, "b")
    assert [s for s, _ in sent[2 * large]] == [s for s, _ in sent[large]] and len(sent[large]) == 3
    second = await _tuples_read(store_url, sent[2 * large])
    # No row read at either size: no sequential read, nothing deleted, and a few index fetches at most (the
    # heap tuples at the index's edge, whose number the visibility of recent rows moves: 1 or 2 from one run to
    # the next), not one per row of 20,000 or 40,000.
    for read in (first, second):
        assert read.keys() == {"agentguard_calls", "agentguard_steps", "agentguard_attempts",
                               "agentguard_ledger_keys"}, read
        assert all(seq == 0 and fetched <= 4 and deleted == 0 for seq, fetched, deleted in read.values()), (
            first, second)
