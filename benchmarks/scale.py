"""Whether a guarded call's cost stays flat as the store grows (issue 34, point 4).

    python -m benchmarks.scale [--only sqlite|postgres] [--url URL] [--sizes 10k,100k,1M,10M] [--calls N]

One guard, opened on an empty store and kept while the store grows (as a long-lived worker's: its connections and
their prepared statements planned while the table was small), and the raw driver running the store's own
statements (the floor: asyncpg on Postgres, stdlib ``sqlite3`` on the caller's thread on SQLite). At each size the
records table is filled (by the server, records shaped as the guard's: ten per task, keys of the guard's form,
retained for a day, never analysed: autovacuum is off on the throwaway cluster; ``synchronous_commit`` off, as
``python -m benchmarks`` measures Postgres) with as many ledger entries (a store that made a million first calls
has kept a million entries, and every new entry is written into their indexes), then first calls and replays of an
async and a sync tool (cache off) are timed beside the floor's claim + complete and its read, interleaved, over
``--reps`` reps: the ratio is the median of each rep's. Flat: each ratio at the largest size within 25% of the
same ratio at the smallest (``FLAT``). And nothing reads the table whole: on Postgres the server's counters
(``pg_stat_user_tables``) around each size's calls and an empty sweep — no row read by a sequential scan, and at
most ``ROWS_PER_SCAN`` rows fetched by an index scan on average (before issue 34's fix, a call's read and
completion went through an index of the scope alone: every row of the scope, and 233 ms a first call at 1M);
on SQLite the plans of the statements that name one record and of the sweep. Default sizes: Postgres 10k to 10M,
SQLite 10k to 1M. Minutes (the 10M fill is most of it); never in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentguard import Guard, task
from agentguard.stores import SQLStore
from agentguard.stores._chain import GENESIS

from ._common import AMOUNT, Body, Raw, fake_key, guarded, observe, pin_one_cpu, run_id
from ._drivers import asyncpg_raw, dsn_of, set_sync_commit, sqlite3_raw

ROWS_PER_SCAN = 2  # rows an index scan of the records table fetches, on average, at most
FLAT = 1.25  # a ratio at the largest size ÷ the same ratio at the smallest, at most
PER_TASK = 10
SIZES = {"postgresql": (10_000, 100_000, 1_000_000, 10_000_000), "sqlite": (10_000, 100_000, 1_000_000)}
CHUNK = 500_000  # records per filling statement

# Records as the guard leaves them, made by the database: ``i`` numbers them.
_PG_FILL = ("INSERT INTO agentguard_calls (scope, key, task_id, operation, fingerprint, arg_hashes, state, fence,"
            " origin, tool, attempts, created_at, updated_at, expires_at, result) SELECT 'default',"
            " 'ag_' || substr(md5('fill-' || i) || md5('more-' || i), 1, 48), 'fill-' || (i / {per}), 'charge',"
            " md5('f' || i), '{{}}', 'succeeded', i, i, 'charge', 1, {now}, {now}, {now} + 86400, '{{\"ok\": true}}'"
            " FROM generate_series({first}, {last}) AS i")
_SQLITE_FILL = ("WITH RECURSIVE n(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM n WHERE i < {last})"
                " INSERT INTO agentguard_calls (scope, key, task_id, operation, fingerprint, arg_hashes, state, fence,"
                " origin, tool, attempts, created_at, updated_at, expires_at, result) SELECT 'default',"
                " 'ag_' || lower(hex(randomblob(24))), 'fill-' || (i / {per}), 'charge', lower(hex(randomblob(32))),"
                " '{{}}', 'succeeded', i, i, 'charge', 1, {now}, {now}, {now} + 86400, '{{\"ok\": true}}' FROM n")

# The ledger's entries of those records, one each (a first call's ``ran``), made with them: a store of a million
# records has kept at least a million entries, whose indexes every new entry is written into. They are placed in a
# chain of their own (scope ``fill``, ``seq`` = ``i``; digests not computed: nothing verifies them here), so the
# guard's own entries follow their scope's head as ever. Keys and tasks as the records' (on Postgres the same keys).
_ENTRY_COLUMNS = ("INSERT INTO agentguard_attempts (scope, key, task_id, operation, tool, kind, detail, attempt,"
                  " call_id, process, at, guard_ms, wait_ms, expires_at, seq, prev, digest) SELECT 'fill', ")
_PG_FILL_LEDGER = (_ENTRY_COLUMNS + "'ag_' || substr(md5('fill-' || i) || md5('more-' || i), 1, 48),"
                   " 'fill-' || (i / {per}), 'charge', 'charge', 'ran', 'succeeded', 1, NULL, 'fill:1', {now}, 0.05,"
                   " 0.0, {now} + 86400, i, md5('p' || i) || md5('q' || i), md5('d' || i) || md5('e' || i)"
                   " FROM generate_series({first}, {last}) AS i")
_SQLITE_FILL_LEDGER = ("WITH RECURSIVE n(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM n WHERE i < {last}) "
                       + _ENTRY_COLUMNS + "'ag_' || lower(hex(randomblob(24))), 'fill-' || (i / {per}), 'charge',"
                       " 'charge', 'ran', 'succeeded', 1, NULL, 'fill:1', {now}, 0.05, 0.0, {now} + 86400, i,"
                       " lower(hex(randomblob(32))), lower(hex(randomblob(32))) FROM n")
_FILL_HEAD = ("INSERT INTO agentguard_ledger_chains (scope, seq, digest, anchor_seq, anchor) VALUES ('fill', {last},"
              " '{digest}', 1, '{genesis}') ON CONFLICT (scope) DO UPDATE SET seq = excluded.seq,"
              " digest = excluded.digest")

Call = Callable[[int], Awaitable[Any]]


def _size(text: str) -> int:
    text = text.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * scale)


def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and not n % 1_000_000 else f"{n // 1_000}k" if n >= 1_000 else str(n)


async def fill(url: str, have: int, upto: int, log: Callable[[str], None]) -> None:
    """Add ``upto - have`` records (the table holds ``have`` filled ones and the calls made so far). (Counted here,
    not by the table: a count would read it whole, and the counters below would see it.)"""
    sqlite = url.startswith("sqlite")
    now = time.time()
    while have < upto:
        last = min(upto, have + CHUNK)
        values = {"first": have + 1, "last": last, "per": PER_TASK, "now": now}
        head = hashlib.sha256(f"fill-{last}".encode()).hexdigest()
        sql = [(_SQLITE_FILL if sqlite else _PG_FILL).format(**values),
               (_SQLITE_FILL_LEDGER if sqlite else _PG_FILL_LEDGER).format(**values),
               _FILL_HEAD.format(last=last, digest=head, genesis=GENESIS)]
        started = time.perf_counter()
        if sqlite:
            db = sqlite3.connect(url.split("///", 1)[1])
            with db:
                for statement in sql:
                    db.execute(statement)
            db.close()
        else:
            import asyncpg

            conn = await asyncpg.connect(dsn_of(url))
            try:
                async with conn.transaction():
                    for statement in sql:
                        await conn.execute(statement)
            finally:
                await conn.close()
        log(f"   filled to {last:,} records and as many ledger entries ({time.perf_counter() - started:.1f} s)")
        have = last


async def filled_entries(url: str) -> int:
    """The fill's ledger entries in the table: the last place of its chain (one row through the chain's index)."""
    sql = "SELECT max(seq) FROM agentguard_attempts WHERE scope = 'fill'"
    if url.startswith("sqlite"):
        db = sqlite3.connect(url.split("///", 1)[1])
        try:
            return int(db.execute(sql).fetchone()[0] or 0)
        finally:
            db.close()
    import asyncpg

    conn = await asyncpg.connect(dsn_of(url))
    try:
        return int(await conn.fetchval(sql) or 0)
    finally:
        await conn.close()


async def pg_counters(url: str) -> tuple[int, int, int, int]:
    """(sequential scans, rows they read, index scans, rows they fetched) of the records table, once every other
    session's counts are in (a session reports them when idle, at most ``PGSTAT_IDLE_INTERVAL`` = 10 s later)."""
    import asyncpg

    await asyncio.sleep(11)
    conn = await asyncpg.connect(dsn_of(url))
    try:
        row = await conn.fetchrow("SELECT seq_scan, seq_tup_read, idx_scan, idx_tup_fetch FROM pg_stat_user_tables"
                                  " WHERE relname = 'agentguard_calls'")
        return tuple(int(row[i] or 0) for i in range(4))  # type: ignore[return-value]
    finally:
        await conn.close()


def sqlite_scans(path: Path, store: SQLStore) -> list[str]:
    """The steps of the plans of the statements that name one record, and the sweep's, that read the records
    table whole (``SCAN agentguard_calls``)."""
    sql = store.sql
    named = [sql.read, sql.complete, sql.release, sql.renew, sql.take_over, sql.sweep]
    db = sqlite3.connect(path)
    try:
        found = []
        for stmt in named:
            text, args = store._executor._compiled(stmt)
            params = dict.fromkeys(stmt.compile().params, 1)
            found += [f"{str(stmt)[:40]}…: {r[3]}" for r in db.execute("EXPLAIN QUERY PLAN " + text, args(params))
                      if r[3].startswith("SCAN agentguard_calls")]
        return found
    finally:
        db.close()


async def one_size(tools: dict[str, Call], floor: Raw, n: int, reps: int, rid: str, size: int) -> dict[str, Any]:
    """Interleaved reps of ``n`` first calls then their ``n`` replays, of each tool and of the floor: µs per call
    (medians) and each tool's ratios to the floor (medians of each rep's)."""
    body = Body()
    times: dict[str, list[float]] = {}
    names = (*tools, "floor")
    for rep in range(-1, reps):  # rep -1: the warm-up, not kept
        k = n if rep >= 0 else 20
        orders = [f"s{size}-r{rep}-{i}" for i in range(k)]
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            for kind in ("first", "replay"):
                started = time.perf_counter()
                if name == "floor":
                    for i, order in enumerate(orders):
                        key = fake_key(rid, size, rep, i)
                        if kind == "first":
                            await floor.first(key, order, json.dumps(body.result(order, AMOUNT, key)))
                        else:
                            json.loads((await floor.read(key))["result"])
                else:
                    with task(f"scale-{rid}-{size}-{rep}-{name}"):  # (the second pass: replays of the first's)
                        for order in orders:
                            await tools[name](order)
                if rep >= 0:
                    times.setdefault(f"{name} {kind}", []).append((time.perf_counter() - started) / k * 1e6)
    out: dict[str, Any] = {"us": {name: round(statistics.median(v), 1) for name, v in times.items()}}
    for tool in tools:
        for kind in ("first", "replay"):
            per_rep = [a / b for a, b in zip(times[f"{tool} {kind}"], times[f"floor {kind}"], strict=True)]
            out[f"{tool} {kind}"] = statistics.median(per_rep)
    return out


RATIOS = ("async first", "async replay", "sync first", "sync replay")


async def run(url: str, sizes: tuple[int, ...], n: int, reps: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Every size in turn, on one guard kept open from the empty store on."""
    sqlite = url.startswith("sqlite")
    if not sqlite:  # as python -m benchmarks measures Postgres: the cost is CPU, not the disk
        await set_sync_commit(url, "off")
    obs = await observe(url, {})
    path = Path(url.split("///", 1)[1]) if sqlite else None
    # (on SQLite at the guard's default ``synchronous``, FULL, the floor's claim unsynced as the store's is)
    floor = await (sqlite3_raw(path, obs, "FULL") if path is not None else asyncpg_raw(url, obs))
    rid, body = run_id(), Body()
    doc: dict[str, Any] = {"backend": "sqlite" if sqlite else "postgresql", "sizes": {}}
    try:
        async with Guard(url, cache_size=0) as guard:
            charge = guarded(guard, body)

            @guard.once(key=["order_id"])
            def charge_sync(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
                return body.result(order_id, amount_cents, idempotency_key)

            async def call_sync(order: str) -> Any:
                return charge_sync(order, AMOUNT)  # (in the loop's thread: the caller's, as a sync tool's)

            tools: dict[str, Call] = {"async": lambda order: charge(order, AMOUNT), "sync": call_sync}
            with task(f"scale-{rid}-warm"):  # the guard's connections made and their statements planned while small
                for i in range(20):
                    for tool in tools.values():
                        await tool(f"warm-{i}")
            filled = 0
            for size in sizes:
                await fill(url, filled, size, log)
                filled = size
                entries = await filled_entries(url)
                before = None if sqlite else await pg_counters(url)
                result = await one_size(tools, floor, n, reps, rid, size)
                result["swept"] = await guard.sweep()  # (nothing is expired: what an empty sweep reads)
                result["ledger_filled"] = entries
                if before is not None:
                    after = await pg_counters(url)
                    result.update(seq_scans=after[0] - before[0], seq_rows_read=after[1] - before[1],
                                  index_scans=after[2] - before[2], index_rows_fetched=after[3] - before[3])
                else:
                    assert path is not None
                    result["whole_table_reads"] = sqlite_scans(path, guard._store)  # type: ignore[attr-defined]
                doc["sizes"][size] = result
                log(f"   {_label(size)}: " + ", ".join(f"{k} {result[k]:.2f}x" for k in RATIOS))
    finally:
        await floor.close()
        if not sqlite:
            await set_sync_commit(url, None)
    return doc


def table(doc: dict[str, Any]) -> tuple[str, bool]:
    """The printed table and the targets' lines; whether every target passed."""
    sizes = sorted(doc["sizes"])
    rows = [f"== Scale: {doc['backend']}, agentguard ÷ the raw driver running the store's statements, by records in"
            " the table (µs/call medians of the largest size; ratio = median of per-rep ratios, cache off)"]
    head = f"{'call':<16}" + "".join(f"{_label(s):>9}" for s in sizes) + f"{'largest µs':>12}{'floor µs':>10}"
    rows += [head, "-" * len(head)]
    last = doc["sizes"][sizes[-1]]
    for name in RATIOS:
        kind = name.split()[1]
        rows.append(f"{name:<16}" + "".join(f"{doc['sizes'][s][name]:>8.2f}×" for s in sizes)
                    + f"{last['us'][name]:>12.0f}{last['us']['floor ' + kind]:>10.0f}")
    ok = True
    rows.append("")
    for name in RATIOS:
        growth = doc["sizes"][sizes[-1]][name] / doc["sizes"][sizes[0]][name]
        passed = growth <= FLAT
        ok &= passed
        rows.append(f"{'PASS' if passed else 'FAIL'}  flat: {name}, {_label(sizes[-1])} ÷ {_label(sizes[0])}"
                    f"  {growth:.2f}×  <= {FLAT}×")
    for s in sizes:
        r = doc["sizes"][s]
        if "seq_rows_read" in r:
            # (an index scan of many rows is a whole read too: the scope's, through an index of the scope alone)
            per_scan = r["index_rows_fetched"] / max(1, r["index_scans"])
            passed = r["seq_rows_read"] == 0 and per_scan <= ROWS_PER_SCAN
            what = (f"{r['seq_scans']} sequential scans read {r['seq_rows_read']:,} rows; {r['index_scans']:,} index"
                    f" scans fetched {per_scan:.2f} rows each (<= {ROWS_PER_SCAN})")
        else:
            passed = not r["whole_table_reads"]
            what = "; ".join(r["whole_table_reads"]) or "every plan searches an index"
        ok &= passed
        rows.append(f"{'PASS' if passed else 'FAIL'}  nothing read whole at {_label(s)}: {what}")
    return "\n".join(rows), ok


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("sqlite", "postgres"))
    ap.add_argument("--url", help="this Postgres database (filled) instead of a throwaway cluster")
    ap.add_argument("--sizes", help="records at each measurement, e.g. 10k,100k,1M (default: by backend)")
    ap.add_argument("--calls", type=int, default=200, help="first calls (and as many replays) per rep")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    chosen = tuple(_size(s) for s in args.sizes.split(",")) if args.sizes else None
    started = time.perf_counter()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {line}", flush=True)

    pin_one_cpu()
    docs, ok = [], True
    for backend in ("sqlite", "postgres"):
        if args.only not in (None, backend):
            continue
        sizes = chosen or SIZES["sqlite" if backend == "sqlite" else "postgresql"]
        log(f"== {backend}: {', '.join(map(_label, sizes))} records")
        with tempfile.TemporaryDirectory(prefix="agentguard-scale.") as tmp:
            if backend == "sqlite":
                doc = asyncio.run(run(f"sqlite+aiosqlite:///{Path(tmp) / 'scale.db'}", sizes, args.calls, args.reps,
                                      log))
            elif args.url:
                doc = asyncio.run(run(args.url, sizes, args.calls, args.reps, log))
            else:
                from ._pgserver import PgServer

                with PgServer() as url:
                    doc = asyncio.run(run(url, sizes, args.calls, args.reps, log))
        docs.append(doc)
        text, passed = table(doc)
        ok &= passed
        print("\n" + text + "\n", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(docs, indent=1))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
