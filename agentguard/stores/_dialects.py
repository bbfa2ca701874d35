"""Every place where SQLite and Postgres differ, in one object chosen once, when the store is made.

- the clock: always the database's, never the worker's, so leases and retention agree across machines
  (``Options.clock``, off by default, is a test seam that replaces it in every statement);
- schema creation under concurrency: Postgres serialises it with an advisory lock; SQLite through its single
  writer lock;
- the claim plan for a key likely free (``_claims``): Postgres inserts first, SQLite reads first (a read there
  costs no round trip); for a key likely taken, both read first;
- whether a plain read costs less than a claim that finds the record (Postgres: the insert, then the read);
- how a claim commits unsynced, where asked: Postgres in the statement (``set_config``), SQLite around it;
- one statement at the driver level (compiled once: ``compiled``), a claim plan in one driver call (SQLite: one
  hop to aiosqlite's thread), a batch of rows in one driver call (Postgres' COPY, SQLite's one hop); which
  driver errors mean the connection is gone, or an outage;
- the engine and its connections: pool and server settings (Postgres); WAL, busy timeout and the
  synchronous level, and a connector that registers every connection so its thread is joined (SQLite).

Both share the upsert flavour (``INSERT ... ON CONFLICT (...) DO NOTHING RETURNING``), so claims never need
unique-violation detection. Outside this module only ``SQLStore`` asks which database it is, to choose its
executors (a SQLite file's statements on the caller's own thread: ``_direct``; Postgres' over psycopg:
``_direct_pg``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import AsyncAdaptedQueuePool

from .._errors import StoreError
from .._extras import require
from .._redact import redact_url
from ._aiosqlite import BUSY_MS, Opened, Waiters, connector
from ._aiosqlite import fetch_plan as aiosqlite_plan
from ._aiosqlite import fetch_row as aiosqlite_row
from ._budget import Budget
from ._claims import InsertFirst, Plan, ReadFirst
from ._direct import ENGINE_CHECKPOINT_FRAMES
from ._schema import TABLE
from ._statements import Compiled, compiler
from ._verbs import Plans

# SQLSTATE classes and codes of failures that may pass: connection exceptions, operator intervention (a
# server shutting down or starting up), insufficient resources (too many connections), and conflicts that
# a retry resolves.
_TRANSIENT_CLASSES = frozenset({"08", "57", "53"})
# A serialization failure and a deadlock: the statement's transaction was rolled back, having done nothing.
_CONFLICT_STATES = frozenset({"40001", "40P01"})
_TRANSIENT_STATES = _CONFLICT_STATES
# SQLSTATE classes of a row's value refused: data exception (a NUL in text, a string too long, a number out of
# range), integrity constraint violation (a NULL where none may be).
_ROW_CLASSES = frozenset({"22", "23"})
_AIOSQLITE_CLOSED = ("no active connection", "Connection closed")  # aiosqlite's ValueErrors of a closed connection

log = logging.getLogger("agentguard.store")
PROBE_CHANNEL = "agentguard_probe"
PROBE_WAIT = 1.0  # seconds a listening connection behind a pooler is given to hear its own probe

_ACCEPTED = "sqlite+aiosqlite:///path/to/file.db, sqlite+aiosqlite:// (in memory) or postgresql+asyncpg://user:password@host:5432/db"


@dataclass(frozen=True, slots=True)
class Options:
    """The store's settings, checked once."""

    pool_size: int = 10
    connect_timeout: float = 10.0
    # The worker's connection budget (Postgres): every connection it opens, of every kind (``_budget``); None:
    # three times ``pool_size``, what one event loop's pool allows.
    max_connections: int | None = None
    sqlite_synchronous: str = "FULL"
    pg_synchronous_commit: str | None = None
    pg_claim_unsynced: bool = False
    # A test seam, off by default: SQL for "seconds since the epoch" that replaces the database clock in every
    # statement, e.g. ``(SELECT t FROM my_clock)`` for a clock a test moves itself
    # (tests/whitebox/test_stateful_store.py).
    # Never set it in production: leases must follow the database's own clock.
    clock: str | None = None

    def __post_init__(self) -> None:
        if self.pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if self.max_connections is not None and (not isinstance(self.max_connections, int)
                                                 or isinstance(self.max_connections, bool)
                                                 or self.max_connections < 1):
            raise ValueError("max_connections must be an integer of at least 1")
        if self.sqlite_synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError("sqlite_synchronous must be OFF, NORMAL, FULL or EXTRA")
        if self.pg_synchronous_commit not in (None, "on", "off", "local", "remote_write", "remote_apply"):
            raise ValueError("pg_synchronous_commit must be on, off, local, remote_write or remote_apply")
        if not isinstance(self.pg_claim_unsynced, bool):
            raise ValueError("pg_claim_unsynced must be True or False")


class PoolerFull(TimeoutError):
    """The pooler had no server connection for a new connection in time (a ``TimeoutError``: transient)."""


def wrapped(exc: BaseException, *, context: bool = True) -> Iterator[BaseException]:
    """``exc`` and every error it wraps, each once: SQLAlchemy's ``orig`` (the driver's error), the cause, and
    (``context``) the error being handled when it was raised."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack.extend((getattr(e, "orig", None), e.__cause__, e.__context__ if context else None))


class Dialect:
    """What a database needs of the store, and how its driver is driven. One instance per store."""

    name: str
    now: str  # SQL for "seconds since the epoch, as a double, from the database clock"
    schema_begin = "BEGIN"  # opens the schema-creation transaction
    schema_lock: str | None = None  # taken in the schema-creation transaction, if any
    # The rows a sub-select found, fetched again by their physical address (``{}``: the sub-select of
    # ``row_id``), so that a DELETE of them never becomes a join the planner may run over the whole table
    # (the sweep's batches: ``Statements``).
    row_id = "rowid"
    rows_by_id = "rowid IN ({})"
    greatest = "max"  # the larger of two values (SQLite's max() of two arguments)
    step_isolation: str  # of the transactions that record a step
    read_is_cheaper = False  # a plain read of a record costs less than a claim that finds it
    claim_unsynced = False  # a claim's commit does not wait for its WAL to be flushed (see Statements)
    unsynced_in_statement = False  # ... which the claim statement itself says (else its executor sees to it)
    plans: Plans  # the claim plan for a key likely free (a first call), and for one likely taken (see _claims)
    plans_in_one_hop = False  # a claim plan runs in one driver call (``fetch_plan``), not statement by statement
    memory = False  # the database lives in one connection (in-memory SQLite): use it from one loop only
    single_writer = False  # one write lock for the whole database (SQLite): a long writer makes others wait
    # This store's writes waiting for that lock, and its own long writes holding it (SQLite: ``Waiters``).
    waiters: Waiters | None = None
    # Outcomes of watched records are announced to other processes (Postgres: LISTEN/NOTIFY, see _listen).
    announces = False
    channel = TABLE
    gathers = False  # first calls' claims that would wait for a connection go as one statement (``fetch_rows``)

    @property
    def capacity(self) -> int:
        """How many connections the engine's pool allows in all (its size and overflow)."""
        return 1 if self.memory else self.options.pool_size * 3

    @property
    def gather_at(self) -> int:
        """How many connections a loop's lane holds before a statement that can be gathered (where ``gathers``)
        joins those waiting rather than open another: every one it may hold (see ``PostgreSQL.gather_at``)."""
        return self.capacity

    def __init__(self, url: str, options: Options) -> None:
        self.url = url  # normalised: always names the driver
        self.options = options
        if options.clock is not None:
            self.now = options.clock  # the test seam (see Options.clock)
        self.compiled: Callable[[Any], Compiled] = compiler(self.driver_dialect())

    def driver_dialect(self) -> Any:
        """SQLAlchemy's dialect of the store's driver, which compiles its statements (``compiled``)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Anything to do once before the first connection."""

    async def probe(self) -> None:
        """Anything to find out about the server, at start, before the pool's first connection."""

    def engine_kwargs(self, opened: Opened) -> dict[str, Any]:
        """``create_async_engine``'s arguments. Autocommit: each statement is its own transaction. No reset on
        return: every connection comes back autocommitted, or with its transaction ended by its context
        manager."""
        return {"isolation_level": "AUTOCOMMIT", "pool_reset_on_return": None}

    def set_up(self, engine: AsyncEngine) -> None:
        """Connection set-up, registered on a new engine."""

    def listen_connection(self) -> Awaitable[Any]:
        """A driver connection of its own, outside the pool, to listen on (only where ``announces``)."""
        raise NotImplementedError(f"{self.name} announces nothing")

    def fetch_row(self, drv: Any, sql: str, args: Sequence[Any], writes: bool = True) -> Awaitable[Any]:
        """One statement on the driver connection ``drv``: its first row, or None. ``writes``: it writes."""
        raise NotImplementedError

    def fetch_plan(self, drv: Any, plan: Plan) -> Awaitable[Any]:
        """The rest of a claim plan in one driver call on ``drv`` (only where ``plans_in_one_hop``)."""
        raise NotImplementedError(f"{self.name} runs no plan in one driver call")

    def fetch_rows(self, drv: Any, sql: str, args: Sequence[Any]) -> Awaitable[Any]:
        """One statement on the driver connection ``drv``: all its rows (only where ``gathers``)."""
        raise NotImplementedError(f"{self.name} gathers no statements")

    def fetch_each(self, drv: Any, sql: str, args: Sequence[Sequence[Any]]) -> Awaitable[Any]:
        """``sql`` once for each of ``args``, in one round trip and one transaction on ``drv``: all their rows
        (only where ``gathers``)."""
        raise NotImplementedError(f"{self.name} gathers no statements")

    def connection_lost(self, exc: BaseException, drv: Any = None) -> bool:
        """Whether ``exc`` says the connection is gone (killed since it was pooled, a server restart), so the
        statement may be repeated on a fresh one. ``drv``: the driver connection, when the caller has it."""
        if isinstance(exc, DBAPIError):  # SQLAlchemy's own verdict (it invalidated the connection)
            return bool(exc.connection_invalidated)
        return isinstance(exc, OSError | ConnectionError) or self._driver_lost(exc, drv)

    def _driver_lost(self, exc: BaseException, drv: Any) -> bool:
        return False

    def conflicted(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a serialization failure or a deadlock (Postgres under a default isolation stricter
        than read committed, or rows locked in turn): the statement's transaction was rolled back and did
        nothing, so running it again is a new attempt, never a repeat."""
        for e in wrapped(exc):
            if (getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)) in _CONFLICT_STATES:
                return True
        return False

    def transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` looks like an outage that may pass (connection refused or lost, a timeout, a
        server restarting, a locked SQLite file) rather than a store that cannot work as configured."""
        for e in wrapped(exc):
            if isinstance(e, DBAPIError) and e.connection_invalidated:
                return True
            if isinstance(e, OSError | TimeoutError | PoolTimeout):
                return True
            state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
            if isinstance(state, str) and (state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES):
                return True
            if self._transient_here(e):
                return True
        return False

    def _transient_here(self, e: BaseException) -> bool:
        return False

    def refuses_row(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the database (or its driver) refusing a value of the rows written — a constraint,
        a number out of range, text it cannot encode — so that the rows written one by one would keep all but
        that one; not an outage, not a store that cannot work (a missing table)."""
        if self.transient(exc):
            return False
        for e in wrapped(exc, context=False):
            # The driver's own, before anything was sent (asyncpg's codecs; sqlite3's binding).
            if isinstance(e, TypeError | ValueError | OverflowError | sqlite3.IntegrityError | sqlite3.DataError):
                return True
            state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
            if isinstance(state, str) and state[:2] in _ROW_CLASSES:
                return True
        return False


class SQLite(Dialect):
    name = "sqlite"
    # julianday('now') has millisecond resolution and is fixed within one statement.
    now = "((julianday('now') - 2440587.5) * 86400.0)"
    schema_begin = "BEGIN IMMEDIATE"  # DDL is serialised by SQLite's single writer lock
    step_isolation = "SERIALIZABLE"
    single_writer = True
    plans_in_one_hop = True  # (each statement would be a hop to aiosqlite's thread)

    @property
    def _pool_size(self) -> int:
        # One writer at a time, each connection a thread of aiosqlite's: more than a few only add threads.
        return min(self.options.pool_size, 5)

    @property
    def capacity(self) -> int:
        return 1 if self.memory else self._pool_size * 3

    @property
    def claim_unsynced(self) -> bool:  # type: ignore[override]
        """At ``synchronous=FULL`` a claim's commit need not sync the WAL (``_aiosqlite.Unsynced``)."""
        return self.options.sqlite_synchronous.upper() == "FULL"

    def __init__(self, url: str, options: Options) -> None:
        super().__init__(url, options)
        db = make_url(url).database
        self.memory = db in (None, "", ":memory:") or "mode=memory" in url
        # A read costs no round trip and never waits for the writer (WAL): every claim reads first, so that a
        # replay never takes the write lock; whatever executor runs it, in one hop at most (``fetch_plan``).
        # No separate read is cheaper.
        self.plans = Plans(ReadFirst, ReadFirst)
        self.waiters: Waiters = Waiters()  # (on any thread)

    def driver_dialect(self) -> Any:
        from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite

        return SQLiteDialect_aiosqlite()

    def prepare(self) -> None:
        """Create the SQLite file's folder (``.agentguard/claims.db`` works from an empty directory), or say
        precisely why it cannot be: once, before the first connection."""
        if self.memory:
            return
        folder = os.path.dirname(os.path.abspath(make_url(self.url).database or ""))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            raise StoreError(f"the store failed (cannot create the SQLite file's folder {folder!r}: {why})") from exc
        if not os.access(folder, os.W_OK | os.X_OK):
            raise StoreError(f"the store failed (the SQLite file's folder {folder!r} is not writable)")
        path = os.path.join(folder, os.path.basename(make_url(self.url).database or ""))
        if os.path.isdir(path):
            raise StoreError(f"the store failed (the SQLite file {path!r} is a folder, not a database file)")
        if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
            raise StoreError(f"the store failed (not permitted to read and write the SQLite file {path!r})")

    def engine_kwargs(self, opened: Opened) -> dict[str, Any]:
        kwargs = {**super().engine_kwargs(opened), "async_creator": connector(self.url, opened)}
        if not self.memory:  # (an in-memory database is one connection: SQLAlchemy's static pool)
            # A queue pool of this size, whatever the SQLAlchemy version's default for aiosqlite (NullPool before
            # 2.0.38: a new connection, and a new aiosqlite thread, per checkout).
            size = self._pool_size
            kwargs.update(poolclass=AsyncAdaptedQueuePool, pool_size=size, max_overflow=size * 2)
        return kwargs

    def set_up(self, engine: AsyncEngine) -> None:
        synchronous = self.options.sqlite_synchronous.upper()
        memory = self.memory

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            if not memory:
                cur.execute("PRAGMA journal_mode = WAL")  # readers never block the writer
                # Checkpoints are the thread's (``_direct``): at SQLite's default of 1,000 frames the ledger's batch
                # whose commit crossed it copied the WAL and synced the database, on top of the thread's checkpoints.
                cur.execute(f"PRAGMA wal_autocheckpoint = {ENGINE_CHECKPOINT_FRAMES}")
            cur.execute(f"PRAGMA synchronous = {synchronous}")
            cur.close()

    def fetch_row(self, drv: Any, sql: str, args: Sequence[Any], writes: bool = True) -> Awaitable[Any]:
        return aiosqlite_row(drv, sql, args, writes, self.waiters)  # type: ignore[no-any-return]

    def fetch_plan(self, drv: Any, plan: Plan) -> Awaitable[Any]:
        return aiosqlite_plan(  # type: ignore[no-any-return]
            drv, plan, self.compiled, claim_unsynced=self.claim_unsynced, waiting=self.waiters)

    def _driver_lost(self, exc: BaseException, drv: Any) -> bool:
        # aiosqlite's own, never a value sqlite3 refused (UnicodeEncodeError is a ValueError too)
        return isinstance(exc, ValueError) and str(exc) in _AIOSQLITE_CLOSED

    def _transient_here(self, e: BaseException) -> bool:
        if isinstance(e, sqlite3.OperationalError) and any(w in str(e) for w in ("locked", "busy")):
            return True
        # aiosqlite's, for a connection closed under us
        return isinstance(e, ValueError) and str(e) in _AIOSQLITE_CLOSED


def default_budget(pool_size: int) -> int:
    """A worker's connection budget unless given (``max_connections``): one loop's whole pool (three times
    ``pool_size``) and two more — the listener and another loop's statement (the portal's: the ledger's writer, a
    sync tool's general path) — so that a busy loop's kept connections are not closed for them (they would be
    closed and opened again, each a new server backend, while the loop's callers keep every one busy)."""
    return 3 * pool_size + 2


class Postgres(Dialect):
    name = "postgresql"
    # clock_timestamp(), not now(): now() is frozen at transaction start.
    now = "(extract(epoch from clock_timestamp())::float8)"
    # Concurrent CREATE TABLE IF NOT EXISTS can still fail on pg_type's unique index; serialise it. Read committed
    # whatever the server's default: under repeatable read or serializable the snapshot is taken by the lock's
    # statement, before its wait, and a worker that waited would not see the tables made meanwhile.
    schema_begin = "BEGIN ISOLATION LEVEL READ COMMITTED"
    schema_lock = "SELECT pg_advisory_xact_lock(7283950271)"
    row_id = "ctid"
    rows_by_id = "ctid = ANY(ARRAY({}))"  # a TID scan, whatever the planner estimates
    greatest = "GREATEST"
    step_isolation = "READ COMMITTED"
    # A plain SELECT of a record costs less than the claim of a key likely free that finds it (the insert, then
    # the read), so a call that is likely a replay may read first (the guard decides when).
    read_is_cheaper = True
    announces = True
    # Under load (every connection of a loop in use), the first calls' claims that would wait for one go as one
    # statement when one is free: one round trip and one commit for them all (benchmarks: --load).
    gathers = True

    def __init__(self, url: str, options: Options) -> None:
        super().__init__(url, options)
        # A first call's plain insert costs the server about a sixth less than a read that misses and then the
        # insert (benchmarks: --load's server CPU per call); a key likely taken is read first, one round trip
        # for a replay, where the insert that finds it taken and then the read cost two.
        self.plans = Plans(InsertFirst, ReadFirst)
        self.claim_unsynced = self.unsynced_in_statement = options.pg_claim_unsynced
        self.budget = Budget(options.max_connections or default_budget(options.pool_size), options.connect_timeout)
        # The pooler between this worker and the server, found at start (``probe``): None (none: the server
        # itself, or a proxy that passes each session through), "session" or "transaction" pooling (where a
        # session's state does not outlive a transaction: no prepared statement is kept, nothing is listened to).
        self.pooling: str | None = None
        self.probed = False

    @property
    def capacity(self) -> int:
        """Each loop's pool: three times ``pool_size``, never beyond the worker's whole budget."""
        return min(self.options.pool_size * 3, self.budget.limit)

    @property
    def gather_at(self) -> int:
        """The pool's own size (``pool_size``): past it, claims and completions that find no connection idle
        join one statement for many rather than open the pool's overflow, which stays for what cannot be
        gathered (reads, renewals, transactions). A burst is then served by fewer server sessions and one commit
        for many, where each overflow connection is another backend competing for the server's CPU."""
        return min(self.options.pool_size, self.capacity)

    @property
    def listens(self) -> bool:
        """Whether a connection that LISTENs hears what is announced (not through transaction pooling)."""
        return self.pooling != "transaction"

    @property
    def keeps_statements(self) -> bool:
        """Whether a prepared statement outlives its round trip (not through transaction pooling, nor before the
        probe has said so)."""
        return self.probed and self.pooling != "transaction"

    def _connect_params(self) -> dict[str, Any]:
        """asyncpg's ``connect`` arguments for a connection of its own (the listener's, the probe's)."""
        from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg

        _, params = PGDialect_asyncpg().create_connect_args(make_url(self.url))  # type: ignore[no-untyped-call]
        for sqlalchemy_only in ("prepared_statement_cache_size", "prepared_statement_name_func", "async_fallback"):
            params.pop(sqlalchemy_only, None)
        params = dict(params)
        _numbers(params)
        params.update(timeout=self.options.connect_timeout, statement_cache_size=0)
        return params

    async def _own_connection(self, application_name: str) -> Any:
        """An asyncpg connection outside the pool, in the budget (``_budgeted``)."""
        return await self._budgeted(**self._connect_params(), server_settings={"application_name": application_name})

    async def _budgeted(self, *args: Any, **kwargs: Any) -> Any:
        """``asyncpg.connect(*args, **kwargs)`` in the budget (waiting its turn for a slot), seated where a pooler
        must seat it; its slot goes back when it closes, however it closes."""
        import asyncpg  # type: ignore[import-untyped,unused-ignore]

        await self.budget.take()
        try:
            conn = await asyncpg.connect(*args, **kwargs)
        except BaseException:
            self.budget.give()
            raise
        self._hold(conn)
        await self._seated(conn)
        return conn

    async def _seated(self, conn: Any) -> None:
        """Behind session pooling, a connection is a server session only once the pooler has one free for it: the
        pooler queues it silently meanwhile (PgBouncer for ``query_wait_timeout``, two minutes by default). It is
        given ``connect_timeout`` to be seated, as a connection to the server is to open, then refused."""
        if self.pooling != "session":
            return
        try:
            await conn.fetchval("SELECT 1", timeout=self.options.connect_timeout)
        except BaseException as exc:
            await _closed(conn)
            if isinstance(exc, TimeoutError):
                raise PoolerFull(
                    f"the pooler in front of the server (session pooling) had no server connection free for "
                    f"{self.options.connect_timeout:g}s: each of this worker's connections holds one of its pool "
                    "while open, so make max_connections times the number of workers at most the pooler's pool "
                    "size (PgBouncer: default_pool_size), or use transaction pooling") from None
            raise

    def _hold(self, conn: Any) -> None:
        budget = self.budget
        budget.hold(conn)
        conn.add_termination_listener(lambda c: budget.let_go(c))

    async def probe(self) -> None:
        """Whether a pooler stands between this worker and the server, and which pooling it does: once, at start.

        Behind a pooler the session the worker sees is the pooler's, not the server's, so the process id in the
        cancellation key (``BackendKeyData``) it was handed is not the server process that answers
        ``pg_backend_pid()`` (a NAT, a port mapping or a plain TCP proxy pass the session through: they are not
        poolers). Then a connection LISTENs and another announces to it: under session pooling (or none) the
        listener's session is one server session, and it hears; under transaction pooling its LISTEN stayed on a
        server session it no longer holds, and it cannot. Told so, the store keeps no prepared statement and
        listens to nothing (waiters poll), rather than fail later."""
        if not self.probed:
            first = await self._own_connection("agentguard")
            try:
                try:  # (bounded: a pooler with no server session free would keep it waiting, silently)
                    pid = await first.fetchval("SELECT pg_backend_pid()", timeout=self.options.connect_timeout)
                except TimeoutError:
                    raise PoolerFull(
                        f"no answer to SELECT pg_backend_pid() within {self.options.connect_timeout:g}s: a pooler in "
                        "front of the server with no server connection free? Make its pool hold every worker's "
                        "max_connections") from None
                if first.get_server_pid() != pid:
                    self.pooling = "session" if await self._hears(first) else "transaction"
            finally:
                await _closed(first)
            self.probed = True
            if self.pooling is not None:
                log.info("the store %s is reached through a pooler doing %s pooling%s", redact_url(self.url),
                         self.pooling,
                         ": no prepared statements are kept, and waiters poll" if self.pooling == "transaction" else "")
        if self.pooling is not None and self.options.pg_synchronous_commit:  # (refused at every start, not once)
            raise StoreError(
                f"the store failed (pg_synchronous_commit={self.options.pg_synchronous_commit!r} is a setting of the "
                f"session, and the store {redact_url(self.url)} is reached through a pooler ({self.pooling} pooling), "
                "which does not pass it on to the server: set it for the role instead (ALTER ROLE ... SET "
                "synchronous_commit = ...) and drop pg_synchronous_commit, or connect to the server directly)")

    async def _hears(self, listener: Any) -> bool:
        """Whether ``listener`` hears an announcement made on another connection (see :meth:`probe`)."""
        token = uuid.uuid4().hex
        heard = asyncio.get_running_loop().create_future()

        def announced(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            if payload == token and not heard.done():
                heard.set_result(True)

        await listener.add_listener(PROBE_CHANNEL, announced)
        other = await self._own_connection("agentguard")
        try:
            await other.execute(f"SELECT pg_notify('{PROBE_CHANNEL}', '{token}')", timeout=self.options.connect_timeout)
        except TimeoutError:  # (not announced in time: taken as not heard, the safe side: no statement kept, polling)
            return False
        finally:
            await _closed(other)
        try:
            await asyncio.wait_for(heard, PROBE_WAIT)
        except TimeoutError:
            return False
        return True

    def driver_dialect(self) -> Any:
        from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg

        return PGDialect_asyncpg()  # type: ignore[no-untyped-call]

    def engine_kwargs(self, opened: Opened) -> dict[str, Any]:
        o = self.options
        settings = {"application_name": "agentguard"}
        if o.pg_synchronous_commit:
            settings["synchronous_commit"] = o.pg_synchronous_commit
        connect_args: dict[str, Any] = {"timeout": o.connect_timeout, "server_settings": settings}
        if not self.keeps_statements:  # (asyncpg then prepares each statement unnamed, within its round trip)
            connect_args.update(statement_cache_size=0, prepared_statement_cache_size=0)
        size = min(o.pool_size, self.capacity)
        # (a caller waits for a connection of the pool as long as for a new one: never the pool's half a minute)
        return {**super().engine_kwargs(opened), "pool_size": size, "max_overflow": self.capacity - size,
                "pool_timeout": o.connect_timeout, "connect_args": connect_args}

    def set_up(self, engine: AsyncEngine) -> None:
        """Every connection of the engine's pool is opened within the budget (waiting its turn for a slot) and
        gives its slot back when it closes (``_budgeted``)."""

        def budgeted(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
            cparams["async_creator_fn"] = self._budgeted
            _numbers(cparams)

        def closed(dbapi_conn: Any, _record: Any) -> None:  # (at once; the termination listener runs later)
            conn = getattr(dbapi_conn, "_connection", None)  # (the adapter's asyncpg connection)
            if conn is not None:
                self.budget.let_go(conn)

        event.listen(engine.sync_engine, "do_connect", budgeted)
        event.listen(engine.sync_engine, "close", closed)

    def fetch_row(self, drv: Any, sql: str, args: Sequence[Any], writes: bool = True) -> Awaitable[Any]:
        return drv.fetchrow(sql, *args)  # type: ignore[no-any-return]

    def fetch_rows(self, drv: Any, sql: str, args: Sequence[Any]) -> Awaitable[Any]:
        return drv.fetch(sql, *args)  # type: ignore[no-any-return]

    def fetch_each(self, drv: Any, sql: str, args: Sequence[Sequence[Any]]) -> Awaitable[Any]:
        # (one pipeline ended by one Sync: an implicit transaction, every statement or none)
        return drv.fetchmany(sql, args)  # type: ignore[no-any-return]

    def listen_connection(self) -> Awaitable[Any]:
        # In the budget's line like any connection (its holders close theirs meanwhile): without a slot in time,
        # waiters poll (``_listen``).
        return self._own_connection("agentguard-listen")

    def _driver_lost(self, exc: BaseException, drv: Any) -> bool:
        return _asyncpg_connection_error(exc) or (drv is not None and drv.is_closed())

    def _transient_here(self, e: BaseException) -> bool:
        return _asyncpg_connection_error(e)


# asyncpg's connect arguments that are numbers, which a URL's query gives as text (``?statement_cache_size=0``
# reached asyncpg as "0": a bare TypeError on every call).
_NUMBERS = {"statement_cache_size": int, "max_cached_statement_lifetime": int, "max_cacheable_statement_size": int,
            "command_timeout": float}


def _numbers(params: dict[str, Any]) -> None:
    for name, kind in _NUMBERS.items():
        value = params.get(name)
        if isinstance(value, str):
            try:
                params[name] = kind(value)
            except ValueError:
                raise StoreError(f"the store failed (the URL's {name}={value!r} is not a number)") from None


async def _closed(conn: Any) -> None:
    try:
        await asyncio.wait_for(conn.close(), timeout=2.0)
    except Exception:
        with contextlib.suppress(Exception):
            conn.terminate()


def _asyncpg_connection_error(exc: BaseException) -> bool:
    """The connection is gone or unusable: closed, killed (``pg_terminate_backend``, a server shutting down or
    restarting), or left mid-protocol by a FATAL error that arrived while it sat idle (asyncpg then reports
    "cannot switch to state ...; another operation is in progress" before it sees the socket close)."""
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    return isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError | asyncpg.PostgresConnectionError
                      | asyncpg.AdminShutdownError | asyncpg.CrashShutdownError | asyncpg.CannotConnectNowError)


def dialect_for(url: str, **settings: Any) -> Dialect:
    """The dialect of a store URL (``sqlite+aiosqlite://...`` or ``postgresql+asyncpg://...``), with the
    store's ``settings`` (see :class:`Options`)."""
    try:
        u = make_url(url)
    except Exception:  # ArgumentError and ValueError both mean a malformed URL
        raise ValueError(f"malformed store URL {redact_url(url)!r}: use {_ACCEPTED}") from None
    backend, _, driver = u.drivername.partition("+")
    if backend in ("postgres", "postgresql"):
        if driver not in ("", "asyncpg"):
            raise ValueError(f"Postgres is supported through asyncpg only (postgresql+asyncpg://...), got "
                             f"{redact_url(url)!r}")
        require("asyncpg", extra="postgres", by="a postgresql+asyncpg:// store")  # refused here, not at first use
        normal = u.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)
        return Postgres(normal, Options(**settings))
    if backend == "sqlite":
        if driver not in ("", "aiosqlite"):
            raise ValueError(f"SQLite is supported through aiosqlite only (sqlite+aiosqlite://...), got "
                             f"{redact_url(url)!r}")
        normal = u.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)
        return SQLite(normal, Options(**settings))
    raise ValueError(f"unsupported store URL {redact_url(url)!r}: use {_ACCEPTED}")
