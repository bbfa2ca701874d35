"""Postgres: what durability costs per call, counted (deterministic) with ``synchronous_commit=on``.

commits: transactions that were assigned an xid (the advance of ``pg_snapshot_xmax(pg_current_snapshot())``,
which reading does not consume), each a commit record to flush; transactions: ``pg_stat_database.xact_commit``
of the benchmark's database, read from a connection to another database (autocommit round trips); WAL
flushes and bytes: ``pg_stat_wal``. Each count is (phase of 3+N calls - phase of 3 calls) / N, so opening a
guard or a connection cancels out; statistics are flushed with ``pg_stat_force_next_flush()`` once the
phase's backends have exited. xids and ``pg_stat_wal`` are cluster-wide, so another client of a shared server
can add to them: the pair of phases is repeated until two pairs agree on the xids (at most 5), else the row
is flagged ``noisy``; transactions and rows written are per database, so exact.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

from agentguard import Guard, task

from ._common import AMOUNT, Body, fake_key, guarded, observe, run_id
from ._drivers import asyncpg_raw, dsn_of, pg_exec, pg_settings, set_sync_commit, with_db

_COUNTERS = ("xact_commit", "rows_written", "next_xid", "wal_bytes", "wal_sync")
_READ = ("SELECT d.xact_commit, d.tup_inserted + d.tup_updated + d.tup_deleted AS rows_written,"
         " pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid, w.wal_bytes::bigint AS wal_bytes,"
         " w.wal_sync FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = $1")
Phase = Callable[[int], Awaitable[None]]


async def _per_call(conn: Any, db: str, run: Phase, n: int) -> dict[str, Any]:
    async def read() -> dict[str, int]:
        for _ in range(500):  # until the phase's backends have exited (a backend flushes its counters then)
            if not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
                                       " AND pid <> pg_backend_pid()", db):
                break
            await asyncio.sleep(0.01)
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        return dict(await conn.fetchrow(_READ, db))

    async def phase(k: int) -> dict[str, int]:
        before = await read()
        await run(k)
        after = await read()
        return {c: after[c] - before[c] for c in _COUNTERS}

    seen: list[dict[str, int]] = []
    for _ in range(5):
        a, b = await phase(3), await phase(3 + n)
        d = {c: b[c] - a[c] for c in _COUNTERS}
        if any(p["next_xid"] == d["next_xid"] for p in seen):
            return {"noisy": False, **{c: v / n for c, v in d.items()}}
        seen.append(d)
    d = min(seen, key=lambda d: abs(d["next_xid"] - d["rows_written"]))
    return {"noisy": True, **{c: v / n for c, v in d.items()}}


async def durability_counts(url: str, n: int, log: Callable[[str], None]) -> dict[str, Any]:
    await set_sync_commit(url, "on")
    async with Guard(url) as g:
        await g.ensure_schema()
    await pg_exec(url, "ALTER TABLE agentguard_calls SET (autovacuum_enabled = false,"
                  " toast.autovacuum_enabled = false)")
    conf, obs, rid, body, phases = await pg_settings(url), await observe(url, {}), run_id(), Body(), itertools.count()
    orders, history, sel = [f"o-{i}" for i in range(3 + n)], f"counts-{rid}-history", fake_key(rid, "sel")

    async def guard_phase(task_id: str, calls: list[str], sync: bool = False, **kw: Any) -> None:
        async with Guard(url, **kw) as g:
            if sync:  # a sync tool, called in a thread of its own (its claim and completion there: _direct_pg)
                charge = g.once(key=["order_id"], operation="charge")(body.result)  # (guarded's operation)

                def run() -> None:
                    with task(task_id):
                        for o in calls:
                            charge(o, AMOUNT)

                await asyncio.to_thread(run)
                return
            tool = guarded(g, body)
            with task(task_id):
                for o in calls:
                    await tool(o, AMOUNT)

    def raw_phase(select: bool) -> Phase:
        async def run(k: int) -> None:
            raw, p = await asyncpg_raw(url, obs), next(phases)
            for i in range(k):
                await (raw.read(sel) if select else raw.first(fake_key(rid, "raw", p, i), orders[i], "{}"))
            await raw.close()

        return run

    await guard_phase(history, orders)  # the records the replays read
    raw = await asyncpg_raw(url, obs)
    await raw.first(sel, "o-sel", "{}")
    await raw.close()
    variants: dict[str, Phase] = {
        "raw asyncpg: claim + complete": raw_phase(select=False),
        "raw asyncpg: SELECT": raw_phase(select=True),
        "agentguard: first call": lambda k: guard_phase(f"counts-{rid}-first-{next(phases)}", orders[:k]),
        "agentguard: first call, pg_claim_unsynced": lambda k: guard_phase(
            f"counts-{rid}-unsynced-{next(phases)}", orders[:k], pg_claim_unsynced=True),
        "agentguard: first call, sync tool": lambda k: guard_phase(
            f"counts-{rid}-sync-{next(phases)}", orders[:k], sync=True),
        "agentguard: first call, sync tool, pg_claim_unsynced": lambda k: guard_phase(
            f"counts-{rid}-sync-unsynced-{next(phases)}", orders[:k], sync=True, pg_claim_unsynced=True),
        "agentguard: replay": lambda k: guard_phase(history, orders[:k]),
        "agentguard: replay, sync tool": lambda k: guard_phase(history, orders[:k], sync=True),
        "agentguard: cached replay": lambda k: guard_phase(history, orders[:3] + [orders[i % 3] for i in range(k)]),
    }
    db = str(make_url(url).database)
    try:  # the reader on another database, so that its own transactions are not counted
        if db == "postgres":
            raise OSError("the benchmark's own database")
        conn, same_db = await asyncpg.connect(dsn_of(with_db(url, "postgres"))), False
    except (OSError, asyncpg.PostgresError):
        conn, same_db = await asyncpg.connect(dsn_of(url)), True
    out: dict[str, Any] = {"settings": conf, "calls": n}
    try:
        for name, run in variants.items():
            runs = body.runs
            row = await _per_call(conn, db, run, n)
            out[name] = {"commits": row["next_xid"], "transactions": None if same_db else row["xact_commit"],
                         "rows_written": row["rows_written"], "wal_bytes": row["wal_bytes"],
                         "wal_flushes": row["wal_sync"] if conf.get("fsync") == "on" else None,
                         "noisy": row["noisy"], "body_runs": body.runs - runs}
            log(f"  counts: {name}: {row['next_xid']:g} commits, {row['xact_commit']:g} transactions per call"
                f"{' (noisy: another client wrote meanwhile)' if row['noisy'] else ''}")
    finally:
        await conn.close()
    return out
