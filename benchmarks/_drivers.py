"""The raw drivers, each running the store's own statements (see ``_common.Raw``), and Postgres' plumbing.

The floors: aiosqlite lean (``execute_fetchall``, one thread hop per statement, autocommit); one held asyncpg
connection (statements prepared once by asyncpg's cache); for concurrent callers, an asyncpg pool with
``reset=`` a no-op and one acquire per statement, as the store does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

from agentguard.stores._aiosqlite import Unsynced
from agentguard.stores._direct import CHECKPOINT_EVERY, CHECKPOINT_WAIT, WAL_RESTART_FRAMES
from agentguard.stores._schema import ROW

from ._common import Observed, Raw, pin_one_cpu

SYNCHRONOUS = "OFF"
_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def _pragmas(synchronous: str) -> tuple[str, ...]:
    """What each raw SQLite connection sets first (the store's own settings)."""
    return ("PRAGMA busy_timeout = 30000", "PRAGMA journal_mode = WAL", f"PRAGMA synchronous = {synchronous}")


async def aiosqlite_raw(path: Path, obs: Observed) -> Raw:
    conn = await aiosqlite.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    for pragma in _pragmas(SYNCHRONOUS):
        await conn.execute_fetchall(pragma)
    return Raw("aiosqlite", sqlite_url(path), obs, conn.execute_fetchall, conn.close)


class Checkpoints:
    """A raw SQLite connection's WAL checkpointed as the store's own connections have it (``_direct``): never by
    the commit that crosses SQLite's threshold (``wal_autocheckpoint`` 0), but every ``CHECKPOINT_EVERY`` commits
    on a thread of its own, passive, restarting the WAL past ``WAL_RESTART_FRAMES``. So the floor does the same
    work as the store, the same way: a checkpoint's copying and syncing is not on the caller's path, its CPU is on
    the one CPU the run is pinned to."""

    def __init__(self, path: Path) -> None:
        self.path, self.commits, self._running = path, 0, threading.Lock()
        self.copied = 0  # WAL frames its checkpoints have copied into the database, so far

    def running(self) -> bool:
        """Whether a checkpoint's thread is at work."""
        return self._running.locked()

    def committed(self) -> None:
        self.commits += 1
        if self.commits >= CHECKPOINT_EVERY and self._running.acquire(blocking=False):
            self.commits = 0
            threading.Thread(target=self._checkpoint, name="floor-checkpoint", daemon=True).start()

    def _checkpoint(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=CHECKPOINT_WAIT)
            try:
                _, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                self.copied += max(copied, 0)
                if frames > WAL_RESTART_FRAMES:
                    conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
            finally:
                conn.close()
        except sqlite3.Error:
            pass  # (left to the next one, as the store's)
        finally:
            self._running.release()


async def sqlite3_raw(path: Path, obs: Observed, synchronous: str = SYNCHRONOUS) -> Raw:
    """stdlib ``sqlite3`` on the caller's thread, no hop, autocommit: the physical floor of a SQLite call. At
    ``FULL`` its claim commits unsynced, as the store's does (``Unsynced``: the completion's sync covers it); its
    WAL is checkpointed off the caller's thread, as the store's is (:class:`Checkpoints`)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    for pragma in (*_pragmas(synchronous), "PRAGMA wal_autocheckpoint = 0"):
        conn.execute(pragma)
    unsynced = synchronous.upper() == "FULL"
    checkpoints = Checkpoints(path)

    async def fetch(sql: str, p: dict[str, Any]) -> list[sqlite3.Row]:
        if sql == raw.read_sql:
            return conn.execute(sql, p).fetchall()
        if unsynced and sql == raw.claim_sql:
            with Unsynced(conn):
                rows = conn.execute(sql, p).fetchall()
        else:
            rows = conn.execute(sql, p).fetchall()
        checkpoints.committed()
        return rows

    async def close() -> None:
        conn.close()

    raw = Raw("sqlite3", sqlite_url(path), obs, fetch, close)  # (fetch reads raw.claim_sql)
    raw.checkpoints = checkpoints  # type: ignore[attr-defined]
    raw.conn = conn  # type: ignore[attr-defined]
    return raw


def psycopg_raw(url: str, obs: Observed) -> Raw | None:
    """One psycopg connection (autocommit, statements prepared after their fifth run, as a sync tool's own
    connection is: ``_direct_pg.connect_kwargs``), each statement run on the caller's thread: the floor of a sync
    tool's call on Postgres. None if psycopg is not installed."""
    try:
        import psycopg
    except ImportError:
        return None
    from agentguard.stores._direct_pg import connect_kwargs

    kwargs = connect_kwargs(url, None)
    if kwargs is None:
        return None
    conn = psycopg.connect(**kwargs)
    cur = conn.cursor()
    done: dict[str, str] = {}

    async def fetch(sql: str, p: dict[str, Any]) -> list[Any]:
        text = done.get(sql)
        if text is None:  # ``:name`` to psycopg's ``%(name)s``, once per statement
            text = done[sql] = _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))
        return cur.execute(text, p).fetchall()  # type: ignore[arg-type]

    async def close() -> None:
        conn.close()

    return _TupleRows("psycopg", url, obs, fetch, close)


class _TupleRows(Raw):
    """A driver whose rows are plain tuples (psycopg's own, the cheapest): a record's result read by its place."""

    RESULT = [c.name for c in ROW].index("result")

    async def read(self, key: str) -> Any:
        rows = await self.fetch(self.read_sql, {"scope": self.obs.claim["scope"], "key": key})
        return {"result": rows[0][self.RESULT]}


def positional() -> Callable[[str], tuple[str, Callable[[dict[str, Any]], Sequence[Any]]]]:
    """``:name`` placeholders to asyncpg's ``$n``, once per statement: the SQL and a dict -> arguments getter."""
    done: dict[str, tuple[str, Callable[[dict[str, Any]], Sequence[Any]]]] = {}

    def convert(sql: str) -> tuple[str, Callable[[dict[str, Any]], Sequence[Any]]]:
        if sql not in done:
            names = list(dict.fromkeys(_NAMED.findall(sql)))
            get = itemgetter(*names)
            done[sql] = (_NAMED.sub(lambda m: f"${names.index(m.group(1)) + 1}", sql),
                         (lambda p: (get(p),)) if len(names) == 1 else get)
        return done[sql]

    return convert


async def asyncpg_raw(url: str, obs: Observed, pool_size: int = 0) -> Raw:
    """One held connection; or (``pool_size``) a pool with ``reset=`` a no-op, one acquire per statement."""
    convert = positional()
    if not pool_size:
        conn = await asyncpg.connect(dsn_of(url))

        async def fetch(sql: str, p: dict[str, Any]) -> Any:
            text, args = convert(sql)
            return await conn.fetch(text, *args(p))

        return Raw("asyncpg", url, obs, fetch, conn.close)

    async def no_reset(_conn: asyncpg.Connection) -> None:
        return None

    pool = await asyncpg.create_pool(dsn_of(url), min_size=pool_size, max_size=pool_size, reset=no_reset)

    async def fetch_pooled(sql: str, p: dict[str, Any]) -> Any:
        text, args = convert(sql)
        async with pool.acquire() as conn:
            return await conn.fetch(text, *args(p))

    return Raw("asyncpg pool (reset= no-op)", url, obs, fetch_pooled, pool.close)


def dsn_of(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_db(url: str, db: str) -> str:
    return make_url(url).set(database=db).render_as_string(hide_password=False)


async def pg_exec(url: str, *sql: str) -> list[Any]:
    conn = await asyncpg.connect(dsn_of(url))
    try:
        return [await conn.fetch(s) for s in sql]
    finally:
        await conn.close()


async def set_sync_commit(url: str, value: str | None) -> None:
    db = make_url(url).database
    await pg_exec(url, f'ALTER DATABASE "{db}" ' + ("RESET synchronous_commit" if value is None
                                                     else f"SET synchronous_commit = {value}"))


async def pg_settings(url: str) -> dict[str, str]:
    names = "'fsync', 'synchronous_commit', 'wal_sync_method', 'server_version', 'shared_buffers', 'max_connections'"
    rows = await pg_exec(url, f"SELECT name, setting FROM pg_settings WHERE name IN ({names})")
    return {r["name"]: r["setting"] for r in rows[0]}


@contextlib.asynccontextmanager
async def unsynced_database(url: str | None, name: str) -> AsyncIterator[str]:
    """``url`` (default: database ``name`` of a throwaway cluster, stopped afterwards) with its commits not waiting
    for the WAL's flush (``synchronous_commit = off``) while the block runs, so that a one-caller measurement counts
    round trips and CPU, not the disk."""
    server = None
    if url is None:
        from ._pgserver import PgServer

        server = PgServer()
        base = await asyncio.to_thread(server.start)
        await pg_exec(base, f'CREATE DATABASE "{name}"')
        url = with_db(base, name)
    try:
        await set_sync_commit(url, "off")
        try:
            yield url
        finally:
            await set_sync_commit(url, None)
    finally:
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(server.stop)


def postgres_script(module: str, doc: str, name: str, measure: Callable[[str, int, int, int], Awaitable[Any]],
                    report: Callable[[Any], str], *, calls: int, warmup: int, what: str = "calls") -> None:
    """The command line of a one-caller Postgres measurement (``python -m benchmarks.<module>``): ``--url`` (else a
    throwaway cluster), ``--calls``, ``--reps``, ``--warmup``; pinned to one CPU, its database ``name`` unsynced
    (:func:`unsynced_database`); prints the ``report`` of ``measure(url, calls, reps, warmup)``."""
    ap = argparse.ArgumentParser(prog=f"python -m benchmarks.{module}", description=doc.split("\n\n")[1])
    ap.add_argument("--url", help="postgresql+asyncpg://... of a database the run may fill (default: a throwaway "
                                  "cluster)")
    ap.add_argument("--calls", type=int, default=calls, help=f"{what} per variant per rep (default {calls})")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=warmup, help=f"{what} per variant before the reps (default {warmup})")
    args = ap.parse_args()
    pin_one_cpu()

    async def main() -> None:
        async with unsynced_database(args.url, name) as db:
            print(report(await measure(db, args.calls, args.reps, args.warmup)))

    asyncio.run(main())
