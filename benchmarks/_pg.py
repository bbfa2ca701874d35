"""PostgreSQL: durability counts (synchronous_commit on), then one caller and 64 callers with durability
relaxed (``ALTER DATABASE ... SET synchronous_commit = off`` on the benchmark's own database, so that round
trips and CPU show rather than the disk)."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

from agentguard import Guard, task

from . import _common as c
from ._harness import Stat, Unavailable, Variant, run_group
from ._seq import check_runs

Log = Callable[[str], None]


def dsn_of(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def db_of(url: str) -> str:
    return str(make_url(url).database or "postgres")


def with_db(url: str, db: str) -> str:
    return make_url(url).set(database=db).render_as_string(hide_password=False)


async def _exec(dsn: str, *sql: str) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return [await conn.fetch(s) for s in sql]
    finally:
        await conn.close()


async def set_sync_commit(url: str, value: str | None) -> None:
    db = db_of(url)
    stmt = (f'ALTER DATABASE "{db}" RESET synchronous_commit' if value is None
            else f'ALTER DATABASE "{db}" SET synchronous_commit = {value}')
    await _exec(dsn_of(url), stmt)


async def settings(url: str) -> dict[str, str]:
    names = "'fsync', 'synchronous_commit', 'wal_sync_method', 'server_version', 'shared_buffers', 'max_connections'"
    rows = await _exec(dsn_of(url), f"SELECT name, setting FROM pg_settings WHERE name IN ({names})")
    return {r["name"]: r["setting"] for r in rows[0]}


async def ensure_schema(url: str) -> None:
    g = Guard(url)
    try:
        await g.ensure_schema()
    finally:
        await g.aclose()


def _raw_stmts(url: str) -> tuple[tuple[str, Any], tuple[str, Any], tuple[str, Any]]:
    st = c.store_statements(url)
    return c.positional(st.claim), c.positional(st.complete), c.positional(st.read)


def _claim_or_fetch(url: str) -> tuple[str, Any] | None:
    st = c.store_statements(url)
    return None if st.claim_or_fetch is None else c.positional(st.claim_or_fetch)


# -- durability counts ------------------------------------------------------------------------------------

_COUNTERS = ("xact_commit", "xact_rollback", "rows_written", "next_xid", "wal_records", "wal_bytes", "wal_write",
             "wal_sync")


class _Counter:
    """Reads the benchmark database's counters from a connection to *another* database when it can, so
    the reader's own transactions are not counted; ``next_xid`` and ``pg_stat_wal`` are cluster-wide."""

    def __init__(self, url: str) -> None:
        self.url, self.db = url, db_of(url)
        self.conn: asyncpg.Connection | None = None
        self.same_db = False

    async def open(self) -> None:
        for other in ("postgres",):  # never template1: a session there blocks CREATE DATABASE
            if other == self.db:
                continue
            try:
                self.conn = await asyncpg.connect(dsn_of(with_db(self.url, other)))
                return
            except (OSError, asyncpg.PostgresError):
                continue
        self.conn = await asyncpg.connect(dsn_of(self.url))
        self.same_db = True

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    async def idle(self) -> None:
        """Wait until every other backend on the database has exited (and so flushed its statistics)."""
        assert self.conn is not None
        for _ in range(500):
            n = await self.conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", self.db)
            if n == 0:
                return
            await asyncio.sleep(0.01)
        raise RuntimeError("benchmark backends did not exit")

    async def read(self) -> dict[str, int]:
        assert self.conn is not None
        await self.conn.execute("SELECT pg_stat_force_next_flush()")
        await self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await self.conn.fetchrow(
            "SELECT d.xact_commit, d.xact_rollback, d.tup_inserted + d.tup_updated + d.tup_deleted AS rows_written,"
            " pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid,"
            " w.wal_records, w.wal_bytes::bigint AS wal_bytes, w.wal_write, w.wal_sync"
            " FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = $1", self.db)
        return {k: int(row[k]) for k in _COUNTERS}

    async def phase(self, run: Callable[[int], Awaitable[None]], k: int) -> dict[str, int]:
        await self.idle()
        before = await self.read()
        await run(k)
        await self.idle()
        after = await self.read()
        return {k_: after[k_] - before[k_] for k_ in _COUNTERS}

    async def per_call(self, run: Callable[[int], Awaitable[None]], n: int, base: int = 3) -> dict[str, Any]:
        """Counter deltas per call: (phase of base+n calls - phase of base calls) / n, so the constant cost
        of opening a guard (connect, schema check) cancels.

        Transaction ids and pg_stat_wal are cluster-wide, so another client of a shared server can add to
        either phase. The pair is repeated until two pairs agree exactly on the transaction ids (at most 5
        pairs); without agreement the result is flagged ``noisy``. The per-database counters
        (transactions, rows written) are exact whatever else runs on the server.
        """
        seen: list[dict[str, int]] = []
        chosen: dict[str, int] | None = None
        for _ in range(5):
            a = await self.phase(run, base)
            b = await self.phase(run, base + n)
            d = {k: b[k] - a[k] for k in _COUNTERS}
            if any(p["next_xid"] == d["next_xid"] for p in seen):
                chosen = d
                break
            seen.append(d)
        out: dict[str, Any] = {"noisy": chosen is None}
        if chosen is None:
            chosen = min(seen, key=lambda d: abs(d["next_xid"] - d["rows_written"]))
        out.update({k: v / n for k, v in chosen.items()})
        return out


async def durability_counts(url: str, n: int, log: Log) -> dict[str, Any]:
    """Commits (transactions that were assigned an xid and committed), transactions, WAL flushes per call."""
    await set_sync_commit(url, "on")
    await ensure_schema(url)
    await _exec(dsn_of(url), "ALTER TABLE agentguard_calls SET (autovacuum_enabled = false,"
                " toast.autovacuum_enabled = false)")
    conf = await settings(url)
    (claim_sql, claim_args), (complete_sql, complete_args), (read_sql, read_args) = _raw_stmts(url)
    rp = (await c.observe(url)).params
    rid = c.run_id()
    pop_task = f"counts-{rid}-pop"
    body = c.Body()
    n_pop = 3 + n

    # The records the replays read, completed beforehand.
    g = Guard(url)
    tool = c.guarded(g, body)
    with task(pop_task):
        for i in range(n_pop):
            await tool(f"o-{i}", c.AMOUNT)
    await g.aclose()

    phases = 0

    async def first(k: int) -> None:
        nonlocal phases
        phases += 1
        g = Guard(url)
        tool = c.guarded(g, body)
        with task(f"counts-{rid}-first-{phases}"):
            for i in range(k):
                await tool(f"o-{i}", c.AMOUNT)
        await g.aclose()

    async def replay(k: int) -> None:
        g = Guard(url)
        tool = c.guarded(g, body)
        with task(pop_task):
            for i in range(k):
                await tool(f"o-{i}", c.AMOUNT)
        await g.aclose()

    async def cached(k: int) -> None:
        g = Guard(url, **c.cache_kwargs())
        tool = c.guarded(g, body)
        with task(pop_task):
            for i in range(3):
                await tool(f"o-{i}", c.AMOUNT)  # fills the cache (misses)
            for i in range(k):
                await tool(f"o-{i % 3}", c.AMOUNT)
        await g.aclose()

    async def raw_first(k: int) -> None:
        nonlocal phases
        phases += 1
        conn = await asyncpg.connect(dsn_of(url))
        for i in range(k):
            key = c.fake_key(rid, "raw", phases, i)
            fence = secrets.randbits(62)
            await conn.fetchval(claim_sql, *claim_args(rp.claim(key, f"o-{i}", fence)))
            await conn.fetchval(complete_sql, *complete_args(rp.complete(key, fence, "{}")))
        await conn.close()

    sel_keys = [c.fake_key(rid, "sel", i) for i in range(3)]
    conn = await asyncpg.connect(dsn_of(url))
    for key in sel_keys:
        await conn.fetchval(claim_sql, *claim_args(rp.claim(key, "o-sel", 1)))
        await conn.fetchval(complete_sql, *complete_args(rp.complete(key, 1, "{}")))
    await conn.close()

    async def raw_select(k: int) -> None:
        conn = await asyncpg.connect(dsn_of(url))
        for i in range(k):
            await conn.fetchrow(read_sql, *read_args({"scope": c.SCOPE, "key": sel_keys[i % 3]}))
        await conn.close()

    counter = _Counter(url)
    await counter.open()
    out: dict[str, Any] = {"settings": conf, "calls": n, "reader_on_same_db": counter.same_db}
    try:
        variants: list[tuple[str, Callable[[int], Awaitable[None]]]] = [
            ("raw asyncpg: claim + complete", raw_first), ("raw asyncpg: SELECT", raw_select),
            ("agentguard: first call", first), ("agentguard: replay", replay),
        ]
        g = Guard(url, **c.cache_kwargs())
        try:
            probe = c.Body()
            await c.require_cache(g, c.guarded(g, probe), probe, _forget(url))
            variants.append(("agentguard: cached replay", cached))
        except Unavailable as exc:
            out["agentguard: cached replay"] = {"unavailable": str(exc)}
        finally:
            await g.aclose()
        for name, run in variants:
            runs = body.runs
            out[name] = per = await counter.per_call(run, n)
            per["body_runs"] = body.runs - runs  # over every phase; must be 0 for replays
            log(f"  counts: {name}: {per['next_xid']:g} commits, {per['xact_commit']:g} transactions, "
                f"{per['rows_written']:g} rows written, {per['wal_sync']:g} WAL flushes per call"
                f"{' (noisy: another client wrote meanwhile)' if per['noisy'] else ''}")
    finally:
        await counter.close()
    fsync_on = conf.get("fsync") == "on"
    for name in list(out):
        row = out[name]
        if isinstance(row, dict) and "next_xid" in row:
            row["commits"] = row.pop("next_xid")
            row["transactions"] = None if counter.same_db else row["xact_commit"]
            row["wal_flushes"] = row["wal_sync"] if fsync_on else None
    return out


def _forget(url: str) -> Callable[[str], Awaitable[None]]:
    async def forget(task_id: str) -> None:
        conn = await asyncpg.connect(dsn_of(url))
        try:
            await conn.execute("DELETE FROM agentguard_calls WHERE task_id = $1", task_id)
        finally:
            await conn.close()

    return forget


# -- 64 callers, distinct keys --------------------------------------------------------------------------


async def concurrent(
    url: str, *, n: int, reps: int, warmup: int, callers: int, log: Log
) -> tuple[dict[str, Stat], list[str]]:
    from agentguard.stores import SQLStore

    notes = [f"{callers} callers; raw pool and SQLAlchemy pools both hold {callers} connections"]
    (claim_sql, claim_args), (complete_sql, complete_args), _ = _raw_stmts(url)

    async def no_reset(_conn: asyncpg.Connection) -> None:
        return None

    pool = await asyncpg.create_pool(dsn_of(url), min_size=callers, max_size=callers, reset=no_reset)
    store = SQLStore(url, pool_size=callers)
    g = Guard(url, pool_size=callers)
    rid = c.run_id()
    rp = (await c.observe(url)).params
    orders = [f"o-{i}" for i in range(max(n, warmup))]
    keys: dict[str, list[str]] = {}
    tids: dict[str, str] = {}

    def fresh(tag: str) -> Callable[[int, int], Awaitable[None]]:
        async def prepare(rep: int, k: int) -> None:
            keys[tag] = [c.fake_key(rid, tag, rep, i) for i in range(k)]
            tids[tag] = f"bench-{rid}-{tag}-{rep}"

        return prepare

    raw_body = c.Body()

    async def raw_first(i: int) -> None:
        key = keys["raw"][i]
        value = await raw_body(orders[i], c.AMOUNT, key)
        fence = secrets.randbits(62)
        async with pool.acquire() as conn:  # one acquire per step, as the store does
            await conn.fetchval(claim_sql, *claim_args(rp.claim(key, orders[i], fence)))
        async with pool.acquire() as conn:
            await conn.fetchval(complete_sql, *complete_args(rp.complete(key, fence, json.dumps(value))))

    async def store_first(i: int) -> None:
        key = keys["store"][i]
        value = await raw_body(orders[i], c.AMOUNT, key)
        fence = await store.claim(rp.claim(key, orders[i], secrets.randbits(62)))
        if not isinstance(fence, int):
            raise AssertionError("store claim missed a fresh key")
        await store.complete(c.SCOPE, key, fence, "succeeded", json.dumps(value), c.RETENTION)

    gbody = c.Body()
    tool = c.guarded(g, gbody)

    async def guard_first(i: int) -> None:
        with task(tids["guard"]):
            await tool(orders[i], c.AMOUNT)

    floor = "raw asyncpg pool (reset= no-op): claim + complete"
    variants = [
        Variant(floor, raw_first, fresh("raw"), "the floor", ref=floor),
        Variant("store only (SQLStore): claim + complete", store_first, fresh("store"), ref=floor),
        Variant("agentguard: first call", guard_first, fresh("guard"), ref=floor),
    ]
    try:
        stats = await run_group(variants, n=n, reps=reps, warmup=warmup, callers=callers, log=log)
    finally:
        await g.aclose()
        await store.dispose()
        await pool.close()
    check_runs(stats, notes, gbody, "agentguard: first call", warmup + n * reps)
    return stats, notes


class RawAsyncpg:
    """The store's statements on one held asyncpg connection (statements prepared once by asyncpg's cache)."""

    label = "asyncpg"

    def __init__(self, url: str, conn: asyncpg.Connection) -> None:
        (self._claim, self._claim_args), (self._complete, self._complete_args), (self._read, self._read_args) = (
            _raw_stmts(url))
        self.conn = conn
        cof = _claim_or_fetch(url)
        if cof is not None:
            sql, args = cof

            async def claim_or_fetch(p: dict[str, Any]) -> Any:
                return await self.conn.fetchrow(sql, *args(p))

            self.claim_or_fetch = claim_or_fetch

    @classmethod
    async def connect(cls, url: str) -> RawAsyncpg:
        return cls(url, await asyncpg.connect(dsn_of(url)))

    async def claim(self, p: dict[str, Any]) -> Any:
        return await self.conn.fetchval(self._claim, *self._claim_args(p))

    async def complete(self, p: dict[str, Any]) -> Any:
        return await self.conn.fetchval(self._complete, *self._complete_args(p))

    async def read(self, p: dict[str, Any]) -> Any:
        return await self.conn.fetchrow(self._read, *self._read_args(p))

    async def close(self) -> None:
        await self.conn.close()


async def sequential(
    url: str, obs: c.Observed, *, n: int, reps: int, warmup: int, log: Log
) -> tuple[dict[str, Stat], list[str]]:
    from . import _seq

    raw = await RawAsyncpg.connect(url)
    return await _seq.sequential(url, [raw], rp=obs.params, guard_kw={}, forget=_forget(url), n=n, reps=reps,
                                 warmup=warmup, log=log)
