"""One SQLAlchemy Core async store for ``sqlite+aiosqlite`` and ``postgresql+asyncpg``.

Every hot statement is written once, compiled once per dialect (SQLAlchemy's compiled cache) and executed
in autocommit mode on a connection checked out for that step only: one statement, one round trip, one
commit. No connection is held while a tool body runs. Every write after the claim is conditional on the
fence the caller holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import operator
import os
import sqlite3
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Double,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    event,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from .._errors import StoreError
from .._redact import redact_text, redact_url
from ._dialects import Dialect, dialect_for

log = logging.getLogger("agentguard.store")
T = TypeVar("T")

TABLE = "agentguard_calls"
_IDLE_MAX = 2  # driver connections kept between hot statements, per event loop
STEPS = "agentguard_steps"

# SQLSTATE classes and codes of failures that may pass: connection exceptions, operator intervention (a
# server shutting down or starting up), insufficient resources (too many connections), and conflicts that
# a retry resolves.
_TRANSIENT_CLASSES = frozenset({"08", "57", "53"})
_TRANSIENT_STATES = frozenset({"40001", "40P01"})

RUNNING, SUCCEEDED, FAILED, RELEASED = "running", "succeeded", "failed", "released"
STARTED, DONE = "started", "done"  # step states

metadata = MetaData()
calls = Table(
    TABLE,
    metadata,
    Column("scope", String(255), nullable=False),
    Column("key", String(64), nullable=False),
    Column("task_id", Text, nullable=False),  # audit only; the key is what identifies the record
    Column("operation", Text, nullable=False),  # audit only
    Column("fingerprint", String(64), nullable=False),
    Column("arg_hashes", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("fence", BigInteger, nullable=False),
    # The fence the row was (re)born with: steps belong to one origin, so steps of an operation that
    # expired or was swept can never be mistaken for steps of a new one with the same key.
    Column("origin", BigInteger, nullable=False),
    Column("tool", Text, nullable=False),
    Column("arguments", Text),  # only for resumable tools (complete_stalled)
    Column("attempts", Integer, nullable=False),
    Column("owner", String(64)),
    Column("lease_until", Double),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("expires_at", Double, nullable=False),
    Column("result", Text),
    Column("audit", Text),
    PrimaryKeyConstraint("scope", "key", name=f"{TABLE}_pkey"),
    CheckConstraint(
        f"state IN ('{RUNNING}', '{SUCCEEDED}', '{FAILED}', '{RELEASED}')", name=f"{TABLE}_state_check"
    ),
    Index(f"{TABLE}_expires_idx", "expires_at"),
)

steps = Table(
    STEPS,
    metadata,
    Column("scope", String(255), nullable=False),
    Column("key", String(64), nullable=False),
    Column("origin", BigInteger, nullable=False),
    Column("name", String(255), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("result", Text),
    Column("updated_at", Double, nullable=False),
    PrimaryKeyConstraint("scope", "key", "origin", "name", name=f"{STEPS}_pkey"),
    CheckConstraint(f"state IN ('{STARTED}', '{DONE}')", name=f"{STEPS}_state_check"),
)


class Record(NamedTuple):
    """A stored call, as the state machine sees it (immutable; cheap to build on the hot path)."""

    scope: str
    key: str
    state: str
    fence: int
    fingerprint: str
    arg_hashes: str
    result: str | None
    attempts: int
    owner: str | None
    task_id: str
    operation: str
    live: bool  # running and its lease has not expired
    expired: bool  # past retention (meaningful only when not live)
    ttl: float  # seconds until the record's retention ends, by the database clock
    origin: int = 0


@dataclass(frozen=True, slots=True)
class Listing:
    scope: str
    key: str
    task_id: str
    operation: str
    state: str
    attempts: int
    age: float
    lease_left: float | None
    audit: dict[str, Any] | None = None  # what the caller recorded beside the key (e.g. host call ids)


def _audit(text_: str) -> dict[str, Any] | None:
    from .._codec import loads

    try:
        value = loads(text_)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# Records are built with tuple.__new__, skipping the NamedTuple's Python-level __new__ (this is on every
# replay). Both drivers already give int for the integer columns and float for ttl (a REAL / float8
# expression); live and expired come as 0/1 and are made bool.
_new = tuple.__new__


def _record(scope: str, key: str, row: Sequence[Any]) -> Record:
    # scope, key, state, fence, fingerprint, arg_hashes, result, attempts, owner, task_id, operation, live,
    # expired, ttl, origin
    rec: Record = _new(Record, (scope, key, row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7],
                                row[8], bool(row[9]), bool(row[10]), row[11], row[12]))
    return rec


def _claimed_record(scope: str, key: str, row: Sequence[Any]) -> Record:
    # The claim function's row: (claimed, fence, state, fingerprint, ...) — the read's columns, fence first.
    rec: Record = _new(Record, (scope, key, row[2], row[1], row[3], row[4], row[5], row[6], row[7], row[8],
                                row[9], bool(row[10]), bool(row[11]), row[12], row[13]))
    return rec


class _Statements:
    """The store's statements, built once per dialect."""

    def __init__(self, d: Dialect) -> None:
        now = d.now
        live = f"(state = '{RUNNING}' AND lease_until > {now})"
        where_fenced = "scope = :scope AND key = :key AND fence = :fence"
        self.claim = text(
            f"INSERT INTO {TABLE} (scope, key, task_id, operation, fingerprint, arg_hashes, state, fence,"
            " origin, tool, arguments, attempts, owner, lease_until, created_at, updated_at, expires_at, audit)"
            f" VALUES (:scope, :key, :task_id, :operation, :fingerprint, :arg_hashes, '{RUNNING}', :fence,"
            f" :fence, :tool, :arguments, 1, :owner, {now} + :lease, {now}, {now}, {now} + :retention, :audit)"
            " ON CONFLICT (scope, key) DO NOTHING RETURNING fence"
        )
        columns = (
            "state, fence, fingerprint, arg_hashes, result, attempts, owner, task_id, operation,"
            f" CASE WHEN {live} THEN 1 ELSE 0 END AS live,"
            f" CASE WHEN expires_at < {now} THEN 1 ELSE 0 END AS expired,"
            f" expires_at - {now} AS ttl, origin"
        )
        self.read = text(f"SELECT {columns} FROM {TABLE} WHERE scope = :scope AND key = :key")
        # Postgres: read-or-claim in one round trip, through a function (made with the schema): it reads
        # first, so a replay costs about one SELECT (a writable CTE costs half as much again), and inserts
        # only when there was nothing to read. Each statement in it takes a new snapshot (READ COMMITTED),
        # so a racing insert that wins between its read and its insert is read on its next turn.
        self.claim_or_fetch: Any = None
        self.claim_function: str | None = None
        if d.name == "postgresql":
            self.claim_function = _pg_claim_function(now)
            self.claim_or_fetch = text(
                f"SELECT * FROM {CLAIM_FUNCTION}(:scope, :key, :task_id, :operation, :fingerprint, :arg_hashes,"
                " :fence, :tool, :arguments, :owner, :lease, :retention, :audit)"
            )
        # A takeover needs the fence it saw (so exactly one taker wins) and a record that is not live:
        # released, lease expired, or past retention (then it restarts as a new operation: reset = 1).
        self.take_over = text(
            f"UPDATE {TABLE} SET fence = fence + 1, state = '{RUNNING}', owner = :owner,"
            f" lease_until = {now} + :lease, updated_at = {now}, expires_at = {now} + :retention,"
            " attempts = CASE WHEN :reset = 1 THEN 1 ELSE attempts + 1 END,"
            f" created_at = CASE WHEN :reset = 1 THEN {now} ELSE created_at END,"
            " fingerprint = :fingerprint, arg_hashes = :arg_hashes, task_id = :task_id,"
            " operation = :operation, result = NULL, audit = COALESCE(:audit, audit), tool = :tool,"
            " arguments = COALESCE(:arguments, arguments),"
            " origin = CASE WHEN :reset = 1 THEN fence + 1 ELSE origin END"
            f" WHERE {where_fenced} AND NOT {live}"
            f" AND (state IN ('{RUNNING}', '{RELEASED}') OR expires_at < {now})"
            " RETURNING fence, origin"
        )
        self.release_owned = text(
            f"UPDATE {TABLE} SET state = '{RELEASED}', lease_until = NULL, updated_at = {now},"
            f" expires_at = {now} + :retention WHERE scope = :scope AND key = :key AND owner = :owner"
            f" AND state = '{RUNNING}' RETURNING fence"
        )
        self.renew = text(
            f"UPDATE {TABLE} SET lease_until = {now} + :lease, updated_at = {now}"
            f" WHERE {where_fenced} AND state = '{RUNNING}' RETURNING fence"
        )
        # Both are idempotent for the fence that holds the claim (a recording redone after a cancellation
        # finds its own earlier write), and refuse any other fence.
        self.complete = text(
            f"UPDATE {TABLE} SET state = :state, result = :result, lease_until = NULL, updated_at = {now},"
            f" expires_at = {now} + :retention WHERE {where_fenced}"
            f" AND (state = '{RUNNING}' OR (state = :state AND result = :result)) RETURNING fence"
        )
        self.release = text(
            f"UPDATE {TABLE} SET state = '{RELEASED}', lease_until = NULL, updated_at = {now},"
            f" expires_at = {now} + :retention WHERE {where_fenced} AND state IN ('{RUNNING}', '{RELEASED}')"
            " RETURNING fence"
        )
        # Bounded batches; the outer predicate is re-checked on rows changed meanwhile (a takeover
        # between the sub-select and the delete refreshes expires_at, so it is not deleted).
        dead = f"expires_at < {now} AND NOT {live}"
        self.sweep = text(
            f"DELETE FROM {TABLE} WHERE (scope, key) IN"
            f" (SELECT scope, key FROM {TABLE} WHERE {dead} LIMIT :batch) AND {dead}"
        )
        # -- steps of multi-step operations (every write inside a transaction that first re-checks and
        #    locks the claim: a takeover cannot interleave, a stale worker cannot record anything)
        self.fence_check = text(
            f"UPDATE {TABLE} SET lease_until = {now} + :lease, updated_at = {now}"
            f" WHERE {where_fenced} AND state = '{RUNNING}' RETURNING origin"
        )
        self.load_steps = text(
            f"SELECT name, seq, state, result FROM {STEPS}"
            " WHERE scope = :scope AND key = :key AND origin = :origin ORDER BY seq"
        )
        self.put_step = text(
            f"INSERT INTO {STEPS} (scope, key, origin, name, seq, state, fence, result, updated_at)"
            f" VALUES (:scope, :key, :origin, :name, :seq, :state, :fence, :result, {now})"
            " ON CONFLICT (scope, key, origin, name) DO UPDATE SET state = :state, fence = :fence,"
            f" result = :result, updated_at = {now}"
        )
        self.clear_step = text(
            f"DELETE FROM {STEPS} WHERE scope = :scope AND key = :key AND origin = :origin AND name = :name"
            f" AND state = '{STARTED}'"
        )
        self.sweep_steps = text(
            f"DELETE FROM {STEPS} WHERE NOT EXISTS (SELECT 1 FROM {TABLE} c WHERE c.scope = {STEPS}.scope"
            f" AND c.key = {STEPS}.key AND c.origin = {STEPS}.origin)"
        )
        # Operations whose worker died inside a step: a started step, and nobody holds a live lease.
        self.unknown = text(
            f"SELECT c.scope, c.key, c.task_id, c.operation, s.name, c.attempts, {now} - c.created_at"
            f" FROM {TABLE} c JOIN {STEPS} s ON s.scope = c.scope AND s.key = c.key AND s.origin = c.origin"
            f" WHERE s.state = '{STARTED}' AND c.state IN ('{RUNNING}', '{RELEASED}')"
            f" AND NOT (c.state = '{RUNNING}' AND c.lease_until > {now})"
            " AND (CAST(:scope AS VARCHAR) IS NULL OR c.scope = :scope) ORDER BY c.updated_at DESC LIMIT :limit"
        )
        self.resolve_step = text(
            f"UPDATE {STEPS} SET state = :state, result = :result, updated_at = {now}"
            f" WHERE scope = :scope AND key = :key AND name = :name AND state = '{STARTED}'"
            f" AND origin = (SELECT origin FROM {TABLE} WHERE scope = :scope AND key = :key AND NOT {live})"
        )
        self.abandon = text(
            f"UPDATE {TABLE} SET state = '{FAILED}', result = :result, lease_until = NULL, updated_at = {now},"
            f" expires_at = {now} + :retention WHERE scope = :scope AND key = :key AND NOT {live}"
            f" AND state IN ('{RUNNING}', '{RELEASED}') RETURNING fence"
        )
        self.stalled = text(
            f"SELECT scope, key, task_id, tool, arguments FROM {TABLE} WHERE arguments IS NOT NULL"
            f" AND state IN ('{RUNNING}', '{RELEASED}') AND NOT {live} AND expires_at > {now}"
            " ORDER BY updated_at LIMIT :limit"
        )
        self.listing = text(
            f"SELECT scope, key, task_id, operation, state, attempts, {now} - created_at AS age,"
            f" CASE WHEN state = '{RUNNING}' THEN lease_until - {now} END AS lease_left, audit"
            f" FROM {TABLE} WHERE (CAST(:scope AS VARCHAR) IS NULL OR scope = :scope)"
            " AND (CAST(:task_id AS VARCHAR) IS NULL OR task_id = :task_id)"
            " ORDER BY updated_at DESC LIMIT :limit"
        )


CLAIM_FUNCTION = f"{TABLE}_claim_v1"  # versioned: a changed body gets a new name, never a silent swap


def _pg_claim_function(now: str) -> str:
    """(claimed, fence, state, fingerprint, arg_hashes, result, attempts, owner, task_id, operation, live,
    expired, ttl, origin): claimed = 1 with our fence, or 0 with the existing record; no row if the record
    kept vanishing between read and insert (the caller retries, bounded)."""
    return f"""
CREATE OR REPLACE FUNCTION {CLAIM_FUNCTION}(
  p_scope text, p_key text, p_task_id text, p_operation text, p_fingerprint text, p_arg_hashes text,
  p_fence bigint, p_tool text, p_arguments text, p_owner text, p_lease float8, p_retention float8, p_audit text)
RETURNS TABLE (claimed int, fence bigint, state text, fingerprint text, arg_hashes text, result text,
  attempts int, owner text, task_id text, operation text, live int, expired int, ttl float8, origin bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
BEGIN
  FOR i IN 1..3 LOOP
    RETURN QUERY SELECT 0, c.fence, c.state::text, c.fingerprint::text, c.arg_hashes, c.result, c.attempts,
        c.owner::text, c.task_id, c.operation,
        CASE WHEN c.state = '{RUNNING}' AND c.lease_until > {now} THEN 1 ELSE 0 END,
        CASE WHEN c.expires_at < {now} THEN 1 ELSE 0 END, c.expires_at - {now}, c.origin
      FROM {TABLE} c WHERE c.scope = p_scope AND c.key = p_key;
    IF FOUND THEN RETURN; END IF;
    RETURN QUERY INSERT INTO {TABLE} AS c (scope, key, task_id, operation, fingerprint, arg_hashes, state,
        fence, origin, tool, arguments, attempts, owner, lease_until, created_at, updated_at, expires_at, audit)
      VALUES (p_scope, p_key, p_task_id, p_operation, p_fingerprint, p_arg_hashes, '{RUNNING}', p_fence,
        p_fence, p_tool, p_arguments, 1, p_owner, {now} + p_lease, {now}, {now}, {now} + p_retention, p_audit)
      ON CONFLICT (scope, key) DO NOTHING
      RETURNING 1, c.fence, NULL::text, NULL::text, NULL::text, NULL::text, 1, NULL::text, NULL::text,
        NULL::text, 0, 0, 0.0::float8, c.fence;
    IF FOUND THEN RETURN; END IF;
  END LOOP;
END
$fn$"""


async def _connect(engine: AsyncEngine, idle: list[Any]) -> Any:
    """A connection from the pool, opened to the end even if the caller is cancelled meanwhile: a connect
    cut off halfway (asyncpg's TLS negotiation, say) leaves a half-open socket and a failed future behind.
    A connection nobody waits for any more joins the idle ones (or goes back to the pool)."""
    opening = asyncio.ensure_future(engine.raw_connection())
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        if not opening.done():
            opening.add_done_callback(functools.partial(_adopt, idle))
        raise


def _adopt(idle: list[Any], opening: asyncio.Future[Any]) -> None:
    if opening.cancelled() or opening.exception() is not None:
        return  # retrieved: nothing is left unreported
    raw = opening.result()
    if len(idle) < _IDLE_MAX:
        idle.append((raw, raw.driver_connection))
    else:
        asyncio.get_running_loop().create_task(greenlet_spawn(raw.close))


def _read_or_claim(conn: Any, read_sql: str, read_args: Sequence[Any], claim_sql: str,
                   claim_args: Sequence[Any]) -> int | tuple[Any, ...] | None:
    """Runs on aiosqlite's thread (autocommit): the record's columns, or the fence we inserted. A racing
    insert from another process between the read and the insert makes the insert do nothing: read again."""
    for _ in range(3):
        rows = conn.execute(read_sql, read_args).fetchall()
        if rows:
            return tuple(rows[0])
        rows = conn.execute(claim_sql, claim_args).fetchall()  # fetch all: the statement ends, it commits
        if rows:
            return int(rows[0][0])
    return None  # the row keeps vanishing and reappearing: the caller's bounded retry decides


def _aiosqlite_runs_functions() -> bool:
    try:
        import aiosqlite
    except ImportError:
        return False
    conn = getattr(aiosqlite, "Connection", None)
    return asyncio.iscoroutinefunction(getattr(conn, "_execute", None)) and isinstance(
        getattr(conn, "_conn", None), property
    )


_ACCEPTED = "sqlite+aiosqlite:///path/to/file.db, sqlite+aiosqlite:// (in memory) or postgresql+asyncpg://user:password@host:5432/db"


def _backend(url: str) -> tuple[str, str]:
    try:
        u = make_url(url)
    except Exception:  # ArgumentError and ValueError both mean a malformed URL
        raise ValueError(f"malformed store URL {redact_url(url)!r}: use {_ACCEPTED}") from None
    backend, _, driver = u.drivername.partition("+")
    if backend in ("postgres", "postgresql"):
        if driver not in ("", "asyncpg"):
            raise ValueError(f"Postgres is supported through asyncpg only (postgresql+asyncpg://...), got "
                             f"{redact_url(url)!r}")
        return "postgresql", u.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)
    if backend == "sqlite":
        if driver not in ("", "aiosqlite"):
            raise ValueError(f"SQLite is supported through aiosqlite only (sqlite+aiosqlite://...), got "
                             f"{redact_url(url)!r}")
        return "sqlite", u.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)
    raise ValueError(f"unsupported store URL {redact_url(url)!r}: use {_ACCEPTED}")


def _asyncpg_connection_error(exc: BaseException) -> bool:
    """The connection is gone or unusable: closed, killed (``pg_terminate_backend``, a server shutting down or
    restarting), or left mid-protocol by a FATAL error that arrived while it sat idle (asyncpg then reports
    "cannot switch to state ...; another operation is in progress" before it sees the socket close)."""
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    return isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError | asyncpg.PostgresConnectionError
                      | asyncpg.AdminShutdownError | asyncpg.CrashShutdownError | asyncpg.CannotConnectNowError)


def _thread_alive(drv: Any) -> bool:
    """Whether an aiosqlite connection's worker thread still runs (it ends after the connection stops)."""
    thread = getattr(drv, "_thread", None)
    return thread is not None and thread.is_alive()


def _thread_started(drv: Any) -> bool:
    thread = getattr(drv, "_thread", None)
    return thread is not None and thread.ident is not None


def _is_memory(url: str) -> bool:
    db = make_url(url).database
    return db in (None, "", ":memory:") or "mode=memory" in url


class SQLStore:
    """The store. Engines are created lazily, one per event loop (asyncpg and aiosqlite connections are
    bound to the loop that opened them); the schema is created on first use."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        sqlite_synchronous: str = "FULL",
        pg_synchronous_commit: str | None = None,
    ) -> None:
        self.backend, self.url = _backend(url)
        self.dialect = dialect_for(self.backend)
        self.memory = self.backend == "sqlite" and _is_memory(self.url)
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if sqlite_synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError("sqlite_synchronous must be OFF, NORMAL, FULL or EXTRA")
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._sqlite_synchronous = sqlite_synchronous.upper()
        if pg_synchronous_commit not in (None, "on", "off", "local", "remote_write", "remote_apply"):
            raise ValueError("pg_synchronous_commit must be on, off, local, remote_write or remote_apply")
        self._pg_synchronous_commit = pg_synchronous_commit
        self.sql = _Statements(self.dialect)
        # SQLite: a claim reads and (if nothing is there) inserts in one hop to aiosqlite's thread, through
        # the queue every aiosqlite method uses; on an aiosqlite without it, two hops (insert, then read).
        self._one_hop = self.backend == "sqlite" and _aiosqlite_runs_functions()
        # Postgres: a plain SELECT of the record costs less than the claim statement (a function), so a call
        # that is likely a replay may read first. SQLite's claim reads first already, in the same hop.
        self.read_is_cheaper = self.sql.claim_or_fetch is not None
        self._engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncEngine] = (
            weakref.WeakKeyDictionary()
        )
        self._schema_ready = False
        self._sql_cache: dict[int, tuple[str, Callable[[dict[str, Any]], tuple[Any, ...]]]] = {}
        # The last loop's (loop, engine, idle connections): the hot path's one lookup, not two weak ones.
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], AsyncEngine, list[Any]] | None = None
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        # A few driver connections kept checked out between hot statements, per loop: a pool checkout
        # through SQLAlchemy costs a large share of a one-statement step.
        # (Each as (pool connection, driver connection): reaching the driver's costs SQLAlchemy three hops.)
        self._idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[tuple[Any, Any]]] = (
            weakref.WeakKeyDictionary()
        )
        # The aiosqlite connections opened on each loop, to close and join when it is disposed.
        self._drivers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Any]] = weakref.WeakKeyDictionary()
        # Test seam: awaited between a claim that found an existing row and acting on that row.
        self.after_claim_miss: Callable[[], Awaitable[None]] | None = None
        self._schema_tasks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )

    # -- engines ------------------------------------------------------------------------------------

    def _make_engine(self) -> AsyncEngine:
        # Autocommit: each statement is its own transaction. No reset on return: every connection comes back
        # either autocommitted or with its transaction committed or rolled back by its context manager.
        kw: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", "pool_reset_on_return": None}
        if self.backend == "postgresql":
            settings = {"application_name": "agentguard"}
            if self._pg_synchronous_commit:
                settings["synchronous_commit"] = self._pg_synchronous_commit
            kw.update(
                pool_size=self._pool_size,
                max_overflow=self._pool_size * 2,
                connect_args={"timeout": self._connect_timeout, "server_settings": settings},
            )
        else:
            kw["async_creator"] = self._sqlite_connector()
        try:
            engine = create_async_engine(self.url, **kw)
        except Exception as exc:  # missing driver, bad URL parts
            raise StoreError(f"cannot create the store engine for {self.backend}: {redact_text(str(exc))}") from exc
        if self.backend == "sqlite":
            synchronous = self._sqlite_synchronous
            memory = self.memory

            @event.listens_for(engine.sync_engine, "connect")
            def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA busy_timeout = 30000")
                if not memory:
                    cur.execute("PRAGMA journal_mode = WAL")  # readers never block the writer
                cur.execute(f"PRAGMA synchronous = {synchronous}")
                cur.close()

        return engine

    def _sqlite_connector(self) -> Callable[[], Any]:
        """Opens aiosqlite connections as SQLAlchemy would (same arguments), but knows each from its start:
        the worker thread of every connection opened on a loop is joined before that loop is let go."""
        import aiosqlite
        from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite

        cargs, cparams = SQLiteDialect_aiosqlite().create_connect_args(make_url(self.url))
        cparams.setdefault("timeout", 30.0)
        drivers = self._drivers

        def connect() -> Any:
            conn = aiosqlite.connect(*cargs, **cparams)
            conn._thread.daemon = True  # as SQLAlchemy's own connect does: never keeps the process alive
            opened = drivers.setdefault(asyncio.get_running_loop(), [])
            opened[:] = [d for d in opened if _thread_alive(d) or not _thread_started(d)]
            opened.append(conn)
            return conn  # awaited by SQLAlchemy, which starts the thread and connects

        return connect

    def engine(self) -> AsyncEngine:
        loop = asyncio.get_running_loop()
        engine = self._engines.get(loop)
        if engine is None:
            engine = self._engines[loop] = self._make_engine()
            self._close_with(loop)
        return engine

    def _close_with(self, loop: asyncio.AbstractEventLoop) -> None:
        """Dispose this loop's engine when the loop shuts down (``asyncio.run`` closes its async generators
        before closing the loop), so a Guard used across several ``asyncio.run`` calls or per-test loops
        does not leave connections open on dead loops."""

        async def closer() -> AsyncIterator[None]:
            try:
                yield
            finally:
                with contextlib.suppress(Exception):
                    await self.dispose()

        agen = closer()
        self._closers[loop] = agen
        loop.create_task(agen.__anext__())  # type: ignore[arg-type]  # registers it with the loop

    async def dispose(self) -> None:
        """Dispose the engine of the running loop."""
        loop = asyncio.get_running_loop()
        self._last = None
        idle = self._idle.pop(loop, None)
        while idle:
            await greenlet_spawn(idle.pop()[0].close)
        engine = self._engines.pop(loop, None)
        if engine is not None:
            await engine.dispose()
        await self._join_drivers(loop)

    async def _join_drivers(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close every aiosqlite connection opened on this loop and wait for its thread to end.

        aiosqlite runs each connection on a thread that reports back with ``loop.call_soon_threadsafe``. A
        connect or statement abandoned by a cancelled caller (aiosqlite then stops the connection without
        waiting) still reports when it finishes: if the loop has closed by then, the thread dies with "Event
        loop is closed". So the loop is let go only once every thread opened on it has ended.
        """
        drivers = self._drivers.pop(loop, None) or []
        for _ in range(2000):  # ~10 s at most; each pass takes no time unless a thread is still busy
            busy = False
            for drv in drivers:
                if not _thread_alive(drv):
                    continue
                if getattr(drv, "_connection", None) is not None and getattr(drv, "_running", False):
                    with contextlib.suppress(Exception):
                        await drv.close()  # queued behind whatever it still runs; ends its thread
                busy = busy or _thread_alive(drv)
            if not busy:
                return
            await asyncio.sleep(0.005)  # a connect still opening: its thread stops by itself once done
        log.warning("aiosqlite threads still running while their event loop is let go")

    # -- execution ----------------------------------------------------------------------------------

    async def _with_conn(
        self, what: str, fn: Callable[[AsyncConnection], Awaitable[T]], *, body_ran: bool | None
    ) -> T:
        if not self._schema_ready:
            await self.ensure_schema()
        engine = self.engine()
        for attempt in (1, 2):
            try:
                async with engine.connect() as conn:
                    return await fn(conn)
            except DBAPIError as exc:
                # A connection killed since it was pooled (server restart, pg_terminate_backend): every
                # statement here is safe to repeat once on a fresh connection (claims carry an owner
                # token, writes are fenced).
                if exc.connection_invalidated and attempt == 1:
                    log.warning("store connection lost during %s; retrying once on a new connection", what)
                    continue
                raise self._error(what, exc, body_ran) from exc
            except (SQLAlchemyError, OSError) as exc:
                raise self._error(what, exc, body_ran) from exc
        raise AssertionError("unreachable")

    def _error(self, what: str, exc: BaseException, body_ran: bool | None) -> StoreError:
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0] if str(exc) else type(exc).__name__
        detail = redact_text(detail)
        transient = self._transient(exc)
        if body_ran:
            msg = (
                f"the store failed while recording the outcome ({what}: {detail}); the tool body already ran, "
                "so the claim is left held: after the lease expires the next caller takes over with the same "
                "downstream key"
            )
        elif body_ran is None:
            msg = f"the store failed ({what}: {detail})"
        else:
            msg = f"the store failed ({what}: {detail}); the tool was not run"
        return StoreError(msg, body_ran=bool(body_ran), transient=transient)

    def _transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` looks like an outage that may pass (connection refused or lost, a timeout, a
        server restarting, a locked SQLite file) rather than a store that cannot work as configured."""
        seen: set[int] = set()
        stack: list[BaseException | None] = [exc]
        while stack:
            e = stack.pop()
            if e is None or id(e) in seen:
                continue
            seen.add(id(e))
            if isinstance(e, DBAPIError) and e.connection_invalidated:
                return True
            if isinstance(e, OSError | TimeoutError | PoolTimeout):
                return True
            state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
            if isinstance(state, str) and (state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES):
                return True
            if self.backend == "postgresql" and _asyncpg_connection_error(e):
                return True
            if isinstance(e, sqlite3.OperationalError) and any(w in str(e) for w in ("locked", "busy")):
                return True
            if isinstance(e, ValueError) and str(e) in ("no active connection", "Connection closed"):
                return True  # aiosqlite's, for a connection closed under us
            stack.extend((getattr(e, "orig", None), e.__cause__, e.__context__))
        return False

    def _compiled(
        self, stmt: Any, engine: AsyncEngine
    ) -> tuple[str, Callable[[dict[str, Any]], tuple[Any, ...]]]:
        """The driver-level SQL of one of our statements and a getter of its positional arguments from the
        named parameters, built once."""
        found = self._sql_cache.get(id(stmt))
        if found is None:
            compiled = stmt.compile(dialect=engine.dialect)
            names = tuple(compiled.positiontup or ())
            getter = operator.itemgetter(*names) if len(names) > 1 else lambda p: tuple(p[n] for n in names)
            found = self._sql_cache[id(stmt)] = (compiled.string, getter)
        return found

    def _here(self) -> tuple[AsyncEngine, list[Any]]:
        """The running loop's engine and idle connections."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            return last[1], last[2]
        engine = self.engine()
        idle = self._idle.get(loop)
        if idle is None:
            idle = self._idle[loop] = []
        self._last = (weakref.ref(loop), engine, idle)
        return engine, idle

    async def _one(
        self, what: str, stmt: Any, params: dict[str, Any], *, body_ran: bool | None = False,
        then: Any = None,
    ) -> Any:
        """One statement, one round trip (one thread hop on SQLite): the hot path.

        SQLAlchemy owns the pool, the dialect and the compiled SQL; the statement itself goes straight to
        the driver (asyncpg's prepared-statement cache, aiosqlite's ``execute_fetchall``), skipping the
        per-statement cursor, result and rollback hops of the ORM-style path.
        """
        if not self._schema_ready:
            await self.ensure_schema()
        engine, idle = self._here()
        sql, getter = self._compiled(stmt, engine)
        args = getter(params)
        pg = self.backend == "postgresql"
        if then is not None:  # SQLite: a second statement in the same thread hop (see claim)
            then_sql, then_getter = self._compiled(then, engine)
            then_args = then_getter(params)
        for attempt in (1, 2):
            if idle:
                raw, drv = idle.pop()
            else:
                try:
                    raw = await _connect(engine, idle)
                except Exception as exc:  # the pool raises the driver's own errors here, unwrapped
                    raise self._error(what, exc, body_ran) from exc
                drv = raw.driver_connection
            keep = False
            try:
                if pg:
                    row = await drv.fetchrow(sql, *args)
                elif then is not None:
                    row = await drv._execute(_read_or_claim, drv._conn, sql, args, then_sql, then_args)
                else:
                    rows = await drv.execute_fetchall(sql, args)
                    row = rows[0] if rows else None
                keep = len(idle) < _IDLE_MAX
                return row
            except Exception as exc:
                if self._connection_lost(exc, raw):
                    # Killed since it was pooled (server restart, pg_terminate_backend): every statement here
                    # is safe to repeat once on a fresh connection (claims carry an owner token, writes are
                    # fenced). The kept ones are likely dead too: drop them.
                    raw.invalidate()
                    while idle:
                        stale = idle.pop()[0]
                        stale.invalidate()
                        await greenlet_spawn(stale.close)
                    if attempt == 1:
                        log.warning("store connection lost during %s; retrying once on a new connection", what)
                        continue
                raise self._error(what, exc, body_ran) from exc
            finally:
                # Cancelled mid-statement (keep is False): both drivers recover the connection by themselves
                # (asyncpg completes its cancel request before the next query; aiosqlite finishes the
                # statement on its thread), so it goes back to the pool as it is; terminating it here would
                # race asyncpg's cancel protocol.
                if keep:
                    idle.append((raw, drv))
                else:
                    # Checked in inside SQLAlchemy's greenlet, so a connection the pool discards (overflow,
                    # invalidated) is closed with an await rather than dropped.
                    await greenlet_spawn(raw.close)
        raise AssertionError("unreachable")

    def _connection_lost(self, exc: BaseException, raw: Any) -> bool:
        if isinstance(exc, OSError | ConnectionError):
            return True
        drv = raw.driver_connection
        if self.backend == "postgresql":
            return _asyncpg_connection_error(exc) or drv.is_closed()
        return isinstance(exc, ValueError)  # aiosqlite: "no active connection"

    async def ensure_schema(self) -> None:
        """Create the table and indexes if missing; safe when many processes start at once.

        Runs once per loop in its own task, which callers await shielded: a caller cancelled meanwhile (a
        client timeout on the very first call) never cuts a connect or a DDL transaction in half."""
        if self._schema_ready:
            return
        loop = asyncio.get_running_loop()
        making = self._schema_tasks.get(loop)
        if making is None:
            making = self._schema_tasks[loop] = loop.create_task(self._make_schema())
            making.add_done_callback(functools.partial(self._schema_done, loop))
        await asyncio.shield(making)

    def _schema_done(self, loop: asyncio.AbstractEventLoop, making: asyncio.Task[None]) -> None:
        # Forget it (the task holds the loop: a weak key must not stay reachable from its value); a failure
        # is seen by its awaiters, and the next caller tries again.
        if self._schema_tasks.get(loop) is making:
            del self._schema_tasks[loop]
        if not making.cancelled():
            making.exception()

    async def _make_schema(self) -> None:
        if self._schema_ready:
            return
        if self.backend == "sqlite" and not self.memory:
            self._make_folder()
        engine = self.engine()
        try:
            async with engine.connect() as conn:
                await self._create(conn)
        except (SQLAlchemyError, OSError) as exc:
            raise self._error("creating the schema", exc, False) from exc  # before any body
        self._schema_ready = True

    def _make_folder(self) -> None:
        """Create the SQLite file's folder (``.agentguard/claims.db`` works from an empty directory), or
        say precisely why it cannot be: once, before the first connection."""
        folder = os.path.dirname(os.path.abspath(make_url(self.url).database or ""))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            raise StoreError(f"the store failed (cannot create the SQLite file's folder {folder!r}: {why}); "
                             "the tool was not run") from exc
        if not os.access(folder, os.W_OK | os.X_OK):
            raise StoreError(f"the store failed (the SQLite file's folder {folder!r} is not writable); "
                             "the tool was not run")

    async def _create(self, conn: AsyncConnection) -> None:
        # The engine is in autocommit mode; DDL runs in one explicit transaction so the advisory lock
        # (Postgres) covers it.
        await conn.exec_driver_sql("BEGIN IMMEDIATE" if self.backend == "sqlite" else "BEGIN")
        try:
            if self.dialect.schema_lock:
                await conn.exec_driver_sql(self.dialect.schema_lock)
            await conn.run_sync(metadata.create_all, checkfirst=True)
            if self.sql.claim_function is not None:
                await conn.exec_driver_sql(self.sql.claim_function)
            await conn.exec_driver_sql("COMMIT")
        except BaseException:
            await conn.exec_driver_sql("ROLLBACK")
            raise

    # -- the state machine's statements -------------------------------------------------------------

    async def claim(self, params: dict[str, Any]) -> int | Record | None:
        """Claim the key by INSERT ... ON CONFLICT DO NOTHING (the row count decides).

        Returns our fence if we claimed it, else the existing record, or None if that record is not
        visible (it vanished, or a racing insert committed after our snapshot): the caller claims again.
        """
        scope, key = params["scope"], params["key"]
        if self.sql.claim_or_fetch is not None:
            row = await self._one("claiming the key", self.sql.claim_or_fetch, params)
            if row is not None and row[0] == 1:
                return int(row[1])
            if self.after_claim_miss is not None:
                await self.after_claim_miss()
            if row is not None:
                return _claimed_record(scope, key, row)
            return await self.read(scope, key)
        if self._one_hop:
            # One thread hop: read, and insert only if there was nothing to read (a replay never takes the
            # write lock). Returns the fence we claimed, or the read's columns.
            got = await self._one("claiming the key", self.sql.read, params, then=self.sql.claim)
            if isinstance(got, int):
                return got
            if self.after_claim_miss is not None:
                await self.after_claim_miss()
            return None if got is None else _record(scope, key, got)
        row = await self._one("claiming the key", self.sql.claim, params)
        if row is not None:
            return int(row[0])
        if self.after_claim_miss is not None:
            await self.after_claim_miss()
        return await self.read(scope, key)

    async def read(self, scope: str, key: str) -> Record | None:
        row = await self._one("reading the record", self.sql.read, {"scope": scope, "key": key})
        return None if row is None else _record(scope, key, row)

    async def take_over(self, params: dict[str, Any]) -> tuple[int, int] | None:
        """Returns (fence, origin) if we took the claim over."""
        row = await self._one("taking over the claim", self.sql.take_over, params)
        return None if row is None else (int(row[0]), int(row[1]))

    async def renew(self, scope: str, key: str, fence: int, lease: float) -> bool:
        params = {"scope": scope, "key": key, "fence": fence, "lease": lease}
        return await self._one("renewing the lease", self.sql.renew, params, body_ran=True) is not None

    async def complete(self, scope: str, key: str, fence: int, state: str, result: str, retention: float) -> bool:
        params = {
            "scope": scope, "key": key, "fence": fence, "state": state, "result": result, "retention": retention,
        }
        return await self._one("storing the result", self.sql.complete, params, body_ran=True) is not None

    async def release_owned(self, scope: str, key: str, owner: str, retention: float) -> bool:
        """Release the claim a cancelled claimer may or may not have won, recognised by its owner token."""
        params = {"scope": scope, "key": key, "owner": owner, "retention": retention}
        return await self._one("releasing the claim", self.sql.release_owned, params, body_ran=None) is not None

    async def release(self, scope: str, key: str, fence: int, retention: float) -> bool:
        params = {"scope": scope, "key": key, "fence": fence, "retention": retention}
        return await self._one("releasing the claim", self.sql.release, params, body_ran=True) is not None

    # -- steps -------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def fenced(self, scope: str, key: str, fence: int, lease: float) -> AsyncIterator[AsyncConnection | None]:
        """A transaction that starts by re-checking (and locking, and renewing) our claim.

        Yields None, having opened nothing durable, if the claim is no longer ours.
        """
        if not self._schema_ready:
            await self.ensure_schema()
        raised_inside: BaseException | None = None
        try:
            async with self.engine().connect() as conn:
                tx_conn = await conn.execution_options(
                    isolation_level="READ COMMITTED" if self.backend == "postgresql" else "SERIALIZABLE"
                )
                async with tx_conn.begin():
                    row = (await tx_conn.execute(
                        self.sql.fence_check, {"scope": scope, "key": key, "fence": fence, "lease": lease}
                    )).first()
                    try:
                        yield None if row is None else tx_conn
                    except BaseException as exc:  # the caller's own error (e.g. its IntegrityError): not ours
                        raised_inside = exc
                        raise
        except (SQLAlchemyError, OSError) as exc:
            if exc is raised_inside:
                raise
            raise self._error("recording a step", exc, True) from exc

    async def load_steps(self, scope: str, key: str, origin: int) -> list[tuple[str, int, str, str | None]]:
        async def run(conn: AsyncConnection) -> list[tuple[str, int, str, str | None]]:
            rows = await conn.execute(self.sql.load_steps, {"scope": scope, "key": key, "origin": origin})
            return [(r[0], int(r[1]), r[2], r[3]) for r in rows]

        return await self._with_conn("loading the recorded steps", run, body_ran=False)

    async def unknown(self, *, scope: str | None = None, limit: int = 100) -> list[tuple[Any, ...]]:
        async def run(conn: AsyncConnection) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in await conn.execute(self.sql.unknown, {"scope": scope, "limit": limit})]

        return await self._with_conn("listing unknown outcomes", run, body_ran=None)

    async def resolve_step(self, scope: str, key: str, name: str, state: str | None, result: str | None) -> bool:
        """Settle a started step: record it done with ``result``, or (state None) clear it for a retry."""

        async def run(conn: AsyncConnection) -> bool:
            if state is None:
                stmt = text(str(self.sql.clear_step.text).replace("origin = :origin", "origin = (SELECT origin"
                            f" FROM {TABLE} WHERE scope = :scope AND key = :key)"))
                res = await conn.execute(stmt, {"scope": scope, "key": key, "name": name})
            else:
                res = await conn.execute(
                    self.sql.resolve_step, {"scope": scope, "key": key, "name": name, "state": state, "result": result}
                )
            return bool(res.rowcount)

        return await self._with_conn("resolving the step", run, body_ran=None)

    async def stalled(self, *, limit: int = 100) -> list[tuple[str, str, str, str, str]]:
        async def run(conn: AsyncConnection) -> list[tuple[str, str, str, str, str]]:
            return [(r[0], r[1], r[2], r[3], r[4]) for r in await conn.execute(self.sql.stalled, {"limit": limit})]

        return await self._with_conn("listing stalled operations", run, body_ran=None)

    async def abandon(self, scope: str, key: str, result: str, retention: float) -> bool:
        params = {"scope": scope, "key": key, "result": result, "retention": retention}
        return await self._one("abandoning the operation", self.sql.abandon, params, body_ran=None) is not None

    async def sweep(self, batch: int = 1000) -> int:
        """Delete records past their retention, in batches; never a running claim whose lease is live."""
        total = 0

        async def run(conn: AsyncConnection) -> int:
            result = await conn.execute(self.sql.sweep, {"batch": batch})
            return int(result.rowcount or 0)

        while True:
            n = await self._with_conn("sweeping expired records", run, body_ran=None)
            total += n
            if n < batch:
                break

        async def orphans(conn: AsyncConnection) -> None:
            await conn.execute(self.sql.sweep_steps)

        # Steps of deleted records are unreachable anyway (a new record has a new origin): tidy them.
        await self._with_conn("sweeping orphaned steps", orphans, body_ran=None)
        return total

    async def listing(
        self, *, scope: str | None = None, task_id: str | None = None, limit: int = 100
    ) -> Sequence[Listing]:
        async def run(conn: AsyncConnection) -> list[Listing]:
            rows = await conn.execute(self.sql.listing, {"scope": scope, "task_id": task_id, "limit": limit})
            return [
                Listing(
                    scope=r[0], key=r[1], task_id=r[2], operation=r[3], state=r[4], attempts=int(r[5]),
                    age=float(r[6]), lease_left=None if r[7] is None else float(r[7]),
                    audit=None if r[8] is None else _audit(r[8]),
                )
                for r in rows
            ]

        return await self._with_conn("listing records", run, body_ran=None)
