"""``agentguard doctor``: check the user's own store before money moves through it, and say what to change.

Runs against the store a deployment will use (a SQLite file, or Postgres directly or through a pooler), with
plain driver connections (asyncpg, sqlite3) for the checks and real guards for the race, and prints one line per
check — server, pooler, isolation, clock offset, privileges, listen/notify, round trip, connection budget — then
a short live race on a scratch scope of its own (``agentguard-doctor-<random>``): parallel callers on one key,
threads and coroutines on two guards (two workers), while the winner's completion is made to fail mid-call (on
Postgres its connection is terminated while it waits on the scratch record; on SQLite the file is held locked by
another connection). The race must end with one execution, every caller holding the result. What the race wrote
is deleted afterwards, by its scope alone: no other scope's rows are ever read or touched beyond counting.

Each line is ``ok``, ``warn`` (works; worth knowing), ``FAIL`` (with what to change) or ``-`` (not applicable,
or skipped because an earlier line failed). The command exits 0 only when no line failed.

Every statement the checks send through asyncpg runs inside an explicit transaction, with asyncpg's statement
cache off: a transaction-pooling PgBouncer keeps a client's transaction on one server session, and nothing is
left prepared on a session another client gets next.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import sqlite3
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ._redact import redact_text, redact_url

if TYPE_CHECKING:
    from ._guard import Guard

OK, WARN, FAIL, NA = "ok", "warn", "FAIL", "-"
SCRATCH = "agentguard-doctor-"  # the race's scope starts so; a random part follows
APP_NAME = "agentguard-doctor"  # the doctor's own Postgres sessions, in pg_stat_activity
CALLERS = 8  # in the race: half threads, half coroutines, across two guards
RACE_SECONDS = 90.0  # the whole race, callers and fault included: past it, callers hung
HOLD_SECONDS = 10.0  # the longest the fault waits to catch the completion mid-statement
PG_MIN = 120000  # PostgreSQL 12
SQLITE_MIN = (3, 35, 0)  # RETURNING
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "ceph", "glusterfs",
                                 "fuse.glusterfs", "lustre", "afs", "gpfs"})


@dataclass
class Line:
    """One line of the table: the check, its status, what was found, and what to change when it failed."""

    check: str
    status: str
    found: str
    fix: str = ""


@dataclass
class Settings:
    pool_size: int = 10  # the pool_size the user's guards run with
    max_connections: int | None = None  # their max_connections, the connection budget (None: 3 × pool_size + 2)
    workers: int = 1  # worker processes that will share the store
    race: bool = True  # run the live race (it writes to a scratch scope, then deletes what it wrote)
    keep: bool = False  # leave what the race wrote, to be read (it expires with the race's retention)
    timeout: float = 10.0  # seconds to connect


@dataclass
class Report:
    url: str
    lines: list[Line] = field(default_factory=list)
    race: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return all(line.status != FAIL for line in self.lines)

    def add(self, line: Line) -> Line:
        self.lines.append(line)
        return line

    def failed(self, *checks: str) -> bool:
        return any(line.status == FAIL for line in self.lines if line.check in checks)


def _ms(seconds: float) -> str:
    if seconds < 0.0001:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1000:.2f} ms" if seconds < 0.01 else f"{seconds * 1000:.1f} ms"


def _why(exc: BaseException) -> str:
    return redact_text(f"{type(exc).__name__}: {exc}".strip().rstrip(":"))


# ==================================================================================================================
# Detections that the pooler, connection-budget and Postgres-defaults work (issue 30, points 1, 2 and 4) may
# replace with their own: each is one function, of plain values or of a connection opener, returning a verdict.
#   detect_pooling, pooling_line   — which pooler mode sits between the worker and Postgres, and what it means
#   worker_connections             — the most connections one worker process may open, and the formula
#   budget_line                    — that bound against max_connections and the role's and database's limits
#   isolation_line, read_only_line — the session defaults agentguard meets
#   privileges_line                — the tables and the rights agentguard needs
# ==================================================================================================================

PoolMode = Literal["none", "session", "transaction", "statement"]


@dataclass(frozen=True)
class Pooling:
    mode: PoolMode
    evidence: str


async def detect_pooling(connect: Callable[[], Awaitable[Any]], url_port: int | None,
                         patience: float = 2.0) -> Pooling:
    """Which pooling a client connection gets. ``SHOW pool_mode`` answers only on PgBouncer's admin console, so
    the behaviour tells: client A's server session (``pg_backend_pid()``) in one transaction; then client B holds
    a transaction open and A asks again. Under transaction pooling A's next transaction runs elsewhere, or B was
    handed A's session; a session of its own means session pooling or none, told apart by the port the server
    itself listens on against the URL's.

    Which session answered tells, never how long it took: A's question is not cancelled. Left unanswered for
    ``patience`` seconds (a loaded server, or a pooler in transaction mode whose every session is taken, B's
    among them), B's transaction ends and A's answer is awaited. (Cancelling it, as an earlier doctor did after
    two seconds, took a slow server for transaction pooling, and asyncpg's cancel of a query behind a pooler
    could leave the connection given a result nobody waited for: a traceback from the event loop.)"""
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    a, b = await connect(), await connect()
    try:
        try:
            for _ in range(3):  # (a pooler may hand B another idle session once; it rarely does three times)
                first = await _one(a, "SELECT pg_backend_pid()")
                asking: asyncio.Future[Any] | None = None
                try:
                    async with b.transaction():
                        held = await b.fetchval("SELECT pg_backend_pid()")
                        asking = asyncio.ensure_future(_one(a, "SELECT pg_backend_pid()"))
                        await asyncio.wait((asking,), timeout=patience)
                finally:
                    if asking is not None and not asking.done():  # (B's transaction is over: A is served now)
                        await asyncio.wait((asking,))
                again = await asking
                if held == first:
                    return Pooling("transaction", f"the server session of one client (backend {first}) was handed to "
                                                  "another client between its transactions")
                if again != first:
                    return Pooling("transaction", "one client connection's transactions ran on different server "
                                                  f"sessions (backends {first} and {again})")
        except asyncpg.PostgresError as exc:
            if "statement pooling" in str(exc).lower():
                return Pooling("statement", redact_text(str(exc)))
            raise
        port = await _one(a, "SELECT inet_server_port()")
        if url_port is not None and port is not None and port != url_port:
            return Pooling("session", f"each client keeps its server session, but the server listens on port {port} "
                                      f"and the URL names {url_port}: a pooler in session mode, or a proxy")
        return Pooling("none", "each client keeps a server session of its own"
                               + (", on the URL's port" if port is not None else " (a Unix socket)"))
    finally:
        await _close(a, b)


def pooling_line(p: Pooling) -> Line:
    """What today's agentguard makes of each pooling mode."""
    if p.mode == "none":
        return Line("pooler", OK, f"none detected: {p.evidence}")
    if p.mode == "session":
        return Line("pooler", WARN, f"session pooling or a proxy: {p.evidence}. Every connection of a worker (see "
                                    "connections) holds a server session while it is open, so the pooler's pool must "
                                    "hold all of them (workers × max_connections), or a connection it cannot seat "
                                    "is refused after connect_timeout")
    if p.mode == "transaction":
        return Line("pooler", OK, f"transaction pooling: {p.evidence}. agentguard finds this at start and works "
                                  "through it: it keeps no prepared statement, and its waiters poll (a LISTEN is "
                                  "not heard through transaction pooling)")
    return Line("pooler", FAIL, f"statement pooling: {p.evidence}",
                "agentguard needs transactions: use a pool in session mode, or Postgres directly")


def worker_connections(pool_size: int, budget: int | None = None) -> tuple[int, str]:
    """The most Postgres connections one worker process may open, and how: every connection it opens (each event
    loop's pool, sync tools' own, the listeners, the check at start) is within one budget, the guard's
    ``max_connections`` (``budget``; default ``3 × pool_size + 2``: ``_dialects.default_budget``)."""
    if budget is not None:
        return budget, "max_connections: every loop's pool, sync tools' own connections and the listeners together"
    from .stores._dialects import default_budget

    return default_budget(pool_size), ("max_connections, by default 3 × pool_size + 2: every loop's pool, sync "
                                       "tools' own connections and the listeners together")


def budget_line(*, pool_size: int, workers: int, max_connections: int, reserved: int, in_use: int,
                role_limit: int, db_limit: int, pooling: PoolMode, budget: int | None = None) -> Line:
    per, how = worker_connections(pool_size, budget)
    total = per * workers
    whom = f"{workers} workers" if workers > 1 else "one worker"
    found = (f"{whom} may open up to {total} (pool_size {pool_size}: {how}"
             + (f", × {workers}" if workers > 1 else "") + f"); max_connections {max_connections}, "
             f"{reserved} reserved, {in_use} in use now by other clients")
    if pooling != "none":
        return Line("connections", WARN if pooling == "session" else OK,
                    f"{found}. Behind a pooler the workers' connections are the pooler's clients (max_client_conn); "
                    f"its server pools must fit max_connections")
    room = max_connections - reserved
    limits = [(room, f"max_connections {max_connections} less {reserved} reserved", "max_connections")]
    if role_limit >= 0:
        limits.append((role_limit, f"the role's CONNECTION LIMIT {role_limit}", "the role's CONNECTION LIMIT"))
    if db_limit >= 0:
        limits.append((db_limit, f"the database's CONNECTION LIMIT {db_limit}", "the database's CONNECTION LIMIT"))
    cap, what, knob = min(limits)
    if total > cap:
        fits = cap // workers  # (the max_connections at which worker_connections fits)
        lower = f"lower max_connections to {fits}" if fits >= 1 else "run fewer workers"
        return Line("connections", FAIL, f"{found}: more than {what} allows",
                    f"{lower}, raise {knob}, or put a pooler in session mode in front")
    if total + in_use > room:
        return Line("connections", WARN, f"{found}: with the other clients' connections, more than the server "
                                         f"allows ({room})")
    return Line("connections", OK, found)


@dataclass(frozen=True)
class Who:
    """The session's role and database (quoted as identifiers), for advice that names them."""

    role: str
    database: str


def setting_fix(name: str, good: str, source: str, who: Who) -> str:
    """The statement that sets ``name`` to ``good`` where its value came from (``pg_settings.source``)."""
    if source == "database":
        return f"ALTER DATABASE {who.database} SET {name} = {good}"
    if source == "user":
        return f"ALTER ROLE {who.role} SET {name} = {good}"
    if source == "database user":
        return f"ALTER ROLE {who.role} IN DATABASE {who.database} SET {name} = {good}"
    if source == "client":
        return f"drop {name} from the connection's options"
    return f"ALTER ROLE {who.role} SET {name} = {good}"  # (over the server's configuration, for this role only)


def isolation_line(level: str, source: str, who: Who) -> Line:
    if level == "read committed":
        return Line("isolation", OK, "read committed (every decision is one statement; nothing stronger is needed)")
    from .stores._executor import CONFLICT_RETRIES

    fix = setting_fix("default_transaction_isolation", "'read committed'", source, who)
    return Line("isolation", WARN, f"{level} by default (from {source}): workers starting at once may be refused while "
                                   "they create the tables, and the store's statements meet serialization failures "
                                   f"(each run again, up to {CONFLICT_RETRIES} times; then the call is refused before "
                                   f"its body, and nothing runs twice); {fix} avoids both")


def read_only_line(version: str, version_num: int, in_recovery: bool, read_only: str, source: str,
                   who: Who) -> Line:
    found = f"PostgreSQL {version.split(' ')[0]}"
    if version_num < PG_MIN:
        return Line("server", FAIL, found, "agentguard needs PostgreSQL 12 or later: upgrade the server")
    if in_recovery:
        return Line("server", FAIL, f"{found}, a hot standby (read-only: every claim would be refused)",
                    "point the URL at the primary (your provider's writer endpoint, or target_session_attrs="
                    "read-write with libpq)")
    if read_only == "on":
        return Line("server", FAIL, f"{found}, sessions read-only (default_transaction_read_only = on, from "
                                    f"{source}): every claim would be refused",
                    # (the session running it is read-only too, where it was set for the database or the role)
                    "SET default_transaction_read_only = off; "
                    + setting_fix("default_transaction_read_only", "off", source, who))
    return Line("server", OK, f"{found}, a primary (read-write)")


@dataclass(frozen=True)
class TableFacts:
    """What the catalog says of one of agentguard's tables, for this role (``present`` False: none found)."""

    name: str
    present: bool
    schema: str = ""
    owned: bool = False
    rights: frozenset[str] = frozenset()  # of SELECT, INSERT, UPDATE, DELETE (and USAGE of its id sequence)
    missing_columns: tuple[str, ...] = ()
    sequence: str | None = None


TABLE_RIGHTS = ("SELECT", "INSERT", "UPDATE", "DELETE")
# Columns the store adds itself to a table made before them (as its owner): the watch, the ledger's chain.
ADDED_ON_USE = frozenset({"watched", "seq", "prev", "digest"})


def privileges_line(tables: Sequence[TableFacts], *, role: str, schema: str | None, search_path: str,
                    can_create: bool, first_schema: str | None = None) -> Line:
    """``schema``: the session's current schema (None: no schema of the search path exists that the role may use;
    ``first_schema``: then the first that exists). Each fix is SQL an administrator can run as it stands."""
    if schema is None:
        if first_schema is None:
            return Line("privileges", FAIL, f"no schema of the search_path ({search_path}) exists",
                        f"CREATE SCHEMA agentguard AUTHORIZATION {role}; "
                        f"ALTER ROLE {role} SET search_path = agentguard")
        return Line("privileges", FAIL, f"as {role}: no use of schema {first_schema}, the first on the search_path "
                                        f"({search_path})", f"GRANT USAGE, CREATE ON SCHEMA {first_schema} TO {role}")
    absent = [t.name for t in tables if not t.present]
    problems, fixes = [], []
    if absent and not can_create:
        problems.append(f"{', '.join(absent)} absent, and this role may not create tables in schema {schema} (nor "
                        "may a guard of it; a role that may can create them by running a guard once)")
        fixes.append(f"GRANT CREATE ON SCHEMA {schema} TO {role}")
    lacking: dict[str, list[str]] = {}
    for t in tables:
        if not t.present:
            continue
        for right in TABLE_RIGHTS:
            if right not in t.rights:
                lacking.setdefault(right, []).append(t.name)
        if t.sequence is not None and "USAGE" not in t.rights:
            problems.append(f"no USAGE of the sequence {t.sequence}")
            fixes.append(f"GRANT USAGE ON SEQUENCE {t.sequence} TO {role}")
        cols = [c for c in t.missing_columns if not (c in ADDED_ON_USE and t.owned)]
        if cols:
            problems.append(f"{t.name} lacks the column(s) {', '.join(cols)}")
            owner_only = set(cols) <= ADDED_ON_USE
            fixes.append(f"let the table's owner run a guard once (it adds {', '.join(cols)})" if owner_only else
                         f"{t.name} was made by something other than agentguard: move it aside")
    for right, names in lacking.items():
        problems.append(f"no {right} on {', '.join(names)}")
    if lacking:
        names = sorted({n for ns in lacking.values() for n in ns})
        fixes.append(f"GRANT {', '.join(r for r in TABLE_RIGHTS if r in lacking)} ON {', '.join(names)} TO {role}")
    if problems:
        return Line("privileges", FAIL, f"as {role}: " + "; ".join(problems), "; ".join(fixes))
    present = [t for t in tables if t.present]
    where = f"schema {schema}"
    if not present:
        return Line("privileges", OK, f"as {role}: no tables yet in {where}; this role may create them (LISTEN and "
                                      "NOTIFY need no right)")
    made = "" if not absent else f"; {', '.join(absent)} created on first use"
    return Line("privileges", OK, f"as {role}: {', '.join(TABLE_RIGHTS)} on the tables in "
                                  f"{present[0].schema or where}{made} (LISTEN and NOTIFY need no right)")


# ==================================================================================================================
# Postgres
# ==================================================================================================================


async def _one(conn: Any, sql: str, *args: Any) -> Any:
    """The first value of ``sql``'s first row, in a transaction of its own (see the module's docstring)."""
    async with conn.transaction():
        return await conn.fetchval(sql, *args)


async def _rows(conn: Any, sql: str, *args: Any) -> list[Any]:
    async with conn.transaction():
        return list(await conn.fetch(sql, *args))


async def _close(*conns: Any) -> None:
    for conn in conns:
        if conn is None or conn.is_closed():
            continue
        try:
            await asyncio.wait_for(conn.close(), 2.0)
        except Exception:  # (a connection the server or a pooler already dropped)
            conn.terminate()


class PG:
    """Plain asyncpg connections to the store's database, as the URL names it (its query's driver options
    included), marked ``agentguard-doctor`` in ``pg_stat_activity``."""

    def __init__(self, url: str, timeout: float) -> None:
        from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
        from sqlalchemy.engine import make_url

        self.url = make_url(url)
        _, params = PGDialect_asyncpg().create_connect_args(self.url)  # type: ignore[no-untyped-call]
        for sqlalchemy_only in ("prepared_statement_cache_size", "prepared_statement_name_func", "async_fallback"):
            params.pop(sqlalchemy_only, None)
        self.params = {**params, "timeout": timeout, "statement_cache_size": 0,
                       "server_settings": {"application_name": APP_NAME}}
        self.timeout = timeout
        self.where = f"{self.url.host or 'localhost'}:{self.url.port or 5432}"

    async def connect(self) -> Any:
        import asyncpg

        return await asyncpg.connect(**self.params)

    def refused(self, exc: BaseException) -> Line:
        """The ``store`` line for a connection that could not be made, with what to change."""
        import asyncpg

        db, user = self.url.database, self.url.username
        if isinstance(exc, asyncpg.InvalidCatalogNameError):
            return Line("store", FAIL, f"{self.where}: database {db!r} does not exist",
                        f"create it (CREATE DATABASE {db}) or fix the database named in the URL")
        if isinstance(exc, asyncpg.InvalidPasswordError):
            return Line("store", FAIL, f"{self.where}: password authentication failed for user {user!r}",
                        "fix the URL's user and password")
        if isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):
            return Line("store", FAIL, f"{self.where}: {redact_text(str(exc))}",
                        "fix the URL's user, or the server's pg_hba.conf for this client")
        if isinstance(exc, asyncpg.TooManyConnectionsError):
            return Line("store", FAIL, f"{self.where}: {redact_text(str(exc))}",
                        "the server is at its connection limit: see how many connections your workers hold")
        if isinstance(exc, asyncpg.CannotConnectNowError):
            return Line("store", FAIL, f"{self.where}: {redact_text(str(exc))}",
                        "the server is starting or shutting down: run the doctor again when it is up")
        if isinstance(exc, TimeoutError):
            return Line("store", FAIL, f"no answer from {self.where} within {self.timeout:g} s",
                        "check the URL's host and port, and firewalls between this machine and the server")
        if isinstance(exc, TypeError) and "unexpected keyword argument" in str(exc):
            # (SQLAlchemy hands the URL's query to asyncpg.connect() as it stands: libpq's names are refused)
            option = str(exc).rsplit(" ", 1)[-1].strip("'")
            return Line("store", FAIL, f"the URL's query option {option!r} is not one asyncpg takes",
                        "drop it, or spell it as asyncpg does (libpq's sslmode=require is ssl=require)")
        if isinstance(exc, OSError):
            why = exc.strerror or _why(exc)
            return Line("store", FAIL, f"cannot connect to {self.where}: {why}",
                        "check the URL's host and port, and that Postgres (or your pooler) is running there")
        return Line("store", FAIL, f"{self.where}: {_why(exc)}", "fix the URL (see the error)")


_FACTS = """
SELECT current_setting('server_version'), current_setting('server_version_num')::int, pg_is_in_recovery(),
       current_setting('default_transaction_read_only'), current_setting('default_transaction_isolation'),
       quote_ident(current_user), quote_ident(current_database()), quote_ident(current_schema()),
       current_setting('search_path'), current_setting('statement_timeout'),
       current_schema() IS NOT NULL AND has_schema_privilege(current_schema(), 'CREATE')
                                    AND has_schema_privilege(current_schema(), 'USAGE'),
       current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int,
       coalesce(current_setting('reserved_connections', true), '0')::int,
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
       (SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user),
       (SELECT datconnlimit FROM pg_database WHERE datname = current_database()),
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'
                                               AND application_name IS DISTINCT FROM $1)::int,
       (SELECT source FROM pg_settings WHERE name = 'default_transaction_read_only'),
       (SELECT source FROM pg_settings WHERE name = 'default_transaction_isolation')
"""

_TABLE = """
SELECT n.nspname, pg_has_role(c.relowner, 'MEMBER'),
       has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'),
       has_table_privilege(c.oid, 'UPDATE'), has_table_privilege(c.oid, 'DELETE'), c.oid::regclass::text,
       array(SELECT attname::text FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)
"""


def _expected_columns() -> dict[str, set[str]]:
    from .stores._attempts import attempts, ledger_keys
    from .stores._chain import chains
    from .stores._schema import calls, steps

    return {calls.name: {*calls.c.keys(), "watched"}, steps.name: set(steps.c.keys()),
            attempts.name: set(attempts.c.keys()), chains.name: set(chains.c.keys()),
            ledger_keys.name: set(ledger_keys.c.keys())}


async def _table_facts(conn: Any) -> list[TableFacts]:
    facts = []
    for name, expected in _expected_columns().items():
        rows = await _rows(conn, _TABLE, name)
        if not rows:
            facts.append(TableFacts(name, False))
            continue
        schema, owned, sel, ins, upd, dele, regclass, columns = rows[0]
        rights = {r for r, held in zip(TABLE_RIGHTS, (sel, ins, upd, dele), strict=True) if held}
        seq = await _one(conn, "SELECT pg_get_serial_sequence($1, 'id')", regclass) if "id" in columns else None
        if seq is not None and await _one(conn, "SELECT has_sequence_privilege($1, 'USAGE')", seq):
            rights.add("USAGE")
        facts.append(TableFacts(name, True, schema, owned, frozenset(rights),
                                tuple(sorted(expected - set(columns))), seq))
    return facts


async def _first_schema(conn: Any, search_path: str) -> str | None:
    """The first schema of ``search_path`` that exists (quoted), whether or not this role may use it."""
    names = [n.strip().strip('"') for n in search_path.split(",") if n.strip()]
    for name in names:
        if name == "$user":
            name = await _one(conn, "SELECT current_user")
        found = await _one(conn, "SELECT quote_ident(nspname) FROM pg_namespace WHERE nspname = $1", name)
        if found is not None:
            return str(found)
    return None


async def _clock(sample: Callable[[], Awaitable[float]]) -> Line:
    """The database clock against this worker's, from the round trip with the least uncertainty of five."""
    best: tuple[float, float] | None = None
    for _ in range(5):
        t0 = time.time()
        db = await sample()
        t1 = time.time()
        if best is None or t1 - t0 < best[1] * 2:
            best = (db - (t0 + t1) / 2, (t1 - t0) / 2)
    assert best is not None
    offset, error = best
    found = (f"{'+' if offset >= 0 else '-'}{_ms(abs(offset))} ± {_ms(error)} (the database's clock against this "
             "worker's). Leases and retention follow the database's clock alone, so an offset never breaks a "
             "guarantee; it matters when you compare the worker's log times with the store's")
    return Line("clock offset", WARN if abs(offset) > 1.0 else OK, found)


def _round_trip(samples: list[float], what: str) -> Line:
    median = statistics.median(samples)
    return Line("round trip", OK, f"{_ms(median)} (median of {len(samples)} {what}); a first call costs about two "
                                  "round trips in the store, a replay one")


async def _listen(pg: PG, pooling: PoolMode) -> Line:
    """A notification on a channel of the doctor's own, from one session to another: what waiters in other
    processes rely on to wake up at once (they poll every second otherwise). Through transaction pooling none
    can be heard (the LISTEN stays on a server session the client no longer holds): said at once. Otherwise the
    notification is waited for as long as a connection may take to open (``PG.timeout``): a healthy server
    delivers it within milliseconds, so the bound only matters where none comes, and a loaded machine's slow
    delivery is not taken for a missing one."""
    if pooling == "transaction":
        return Line("listen/notify", WARN, "not tried: a LISTEN is not heard through transaction pooling (see "
                                           "pooler), so waiters for another worker's call wake up by polling "
                                           "(every second)")
    channel = f"agentguard_doctor_{secrets.token_hex(4)}"
    listener = sender = None
    try:
        listener, sender = await pg.connect(), await pg.connect()
        heard = asyncio.Event()
        await listener.add_listener(channel, lambda *_: heard.set())
        t0 = time.perf_counter()
        await _one(sender, "SELECT pg_notify($1, 'ping')", channel)
        try:
            await asyncio.wait_for(heard.wait(), pg.timeout)
        except TimeoutError:
            return Line("listen/notify", WARN, f"no notification arrived within {pg.timeout:g} s: waiters for "
                                               "another worker's call wake up by polling (every second) instead. "
                                               "LISTEN does not work through transaction pooling")
        return Line("listen/notify", OK, f"a notification arrived in {_ms(time.perf_counter() - t0)}")
    except Exception as exc:
        return Line("listen/notify", WARN, f"LISTEN failed ({_why(exc)}): waiters poll instead")
    finally:
        await _close(listener, sender)


async def check_postgres(url: str, settings: Settings, report: Report) -> None:
    from sqlalchemy.engine import make_url

    pg = PG(url, settings.timeout)
    try:
        conn = await pg.connect()
    except Exception as exc:
        report.add(pg.refused(exc))
        return
    try:
        row = (await _rows(conn, _FACTS, APP_NAME))[0]
        (version, version_num, in_recovery, read_only, isolation, role, database, schema, search_path,
         statement_timeout, can_create, max_conn, su_reserved, reserved, superuser, role_limit, db_limit,
         in_use, read_only_source, isolation_source) = row
        who = Who(role, database)
        report.add(Line("store", OK, f"Postgres at {pg.where}, database {database}, as {role}"))
        report.add(read_only_line(version, version_num, in_recovery, read_only, read_only_source, who))
        try:
            u = make_url(url)
            pooling = await detect_pooling(pg.connect, (u.port or 5432) if u.host else None)
        except Exception as exc:
            pooling = Pooling("none", "")
            report.add(Line("pooler", WARN, f"could not tell ({_why(exc)})"))
        else:
            report.add(pooling_line(pooling))
        iso = isolation_line(isolation, isolation_source, who)
        if statement_timeout not in ("0", "0ms"):
            iso.found += f"; statement_timeout {statement_timeout} (a slower statement is refused, fail closed)"
        report.add(iso)
        report.add(await _clock(lambda: _one(conn, "SELECT extract(epoch from clock_timestamp())::float8")))
        first = None if schema is not None else await _first_schema(conn, search_path)
        report.add(privileges_line(await _table_facts(conn), role=role, schema=schema, search_path=search_path,
                                   can_create=bool(can_create or superuser), first_schema=first))
        report.add(await _listen(pg, pooling.mode))
        samples = []
        for _ in range(20):
            t0 = time.perf_counter()
            await conn.execute("SELECT 1")  # (the simple protocol: one round trip, whatever the pooler)
            samples.append(time.perf_counter() - t0)
        report.add(_round_trip(samples, "SELECT 1"))
        report.add(budget_line(pool_size=settings.pool_size, workers=settings.workers, max_connections=max_conn,
                               reserved=0 if superuser else su_reserved + reserved, in_use=in_use,
                               role_limit=-1 if superuser else role_limit, db_limit=db_limit, pooling=pooling.mode,
                               budget=settings.max_connections))
    except Exception as exc:
        report.add(Line("store", FAIL, f"a check failed: {_why(exc)}", "see the error"))
        return
    finally:
        await _close(conn)
    if _race_blocked(report, settings):
        return
    await _race_and_clean(url, settings, report, PGFault(pg), lambda scope: _pg_clean(pg, scope))


class PGFault:
    """On Postgres: the scratch record locked by a transaction of the doctor's while the body returns, so that the
    winner's completion waits on it; that waiting backend (found by ``pg_blocking_pids``, so never anybody
    else's) is terminated mid-statement, then the lock let go."""

    what = "its connection terminated mid-statement (pg_terminate_backend)"

    def __init__(self, pg: PG) -> None:
        self.pg = pg

    async def hold(self, scope: str, proceed: threading.Event, returned: threading.Event) -> dict[str, Any]:
        from .stores._schema import TABLE

        admin = killer = None
        try:
            admin, killer = await self.pg.connect(), await self.pg.connect()
            locked = admin.transaction()
            await locked.start()
            await admin.fetch(f"SELECT 1 FROM {TABLE} WHERE scope = $1 FOR UPDATE", scope)
            me = await admin.fetchval("SELECT pg_backend_pid()")
            proceed.set()
            killed: list[int] = []
            deadline = time.monotonic() + HOLD_SECONDS
            while not killed and time.monotonic() < deadline:
                # Behind our lock directly, or behind another backend queued for the same row (Postgres queues a
                # row's waiters behind the first one): only statements on the scratch record wait there.
                blocked = {pid: (query, set(by)) for pid, query, by in await _rows(
                    killer, "SELECT pid, query, pg_blocking_pids(pid) FROM pg_stat_activity"
                            " WHERE datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0")}
                behind, grew = {me}, True
                while grew:
                    more = {pid for pid, (_, by) in blocked.items() if by & behind} - behind
                    behind, grew = behind | more, bool(more)
                # (the completion sets the result; the heartbeat and a waiter's mark may wait here too: left be)
                killed = [pid for pid in behind - {me}
                          if "SET state" in blocked[pid][0] and "result =" in blocked[pid][0]]
                if not killed:
                    await asyncio.sleep(0.01)
            for pid in killed:
                await _one(killer, "SELECT pg_terminate_backend($1)", pid)
            while killed and time.monotonic() < deadline and await _one(  # noqa: ASYNC110 - the server's state
                    killer, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", killed):
                await asyncio.sleep(0.01)  # (gone before the lock is let go: killed while it waited)
            state = await admin.fetchval(f"SELECT state FROM {TABLE} WHERE scope = $1", scope)
            await locked.rollback()
            return {"caught": bool(killed), "state": state, "backends": killed}
        finally:
            proceed.set()
            await _close(admin, killer)


async def _pg_clean(pg: PG, scope: str) -> dict[str, int]:
    conn = await pg.connect()
    try:
        async with conn.transaction():
            return await _delete_scope(scope, lambda t: conn.fetchval("SELECT to_regclass($1) IS NOT NULL", t),
                                       lambda sql: conn.execute(sql, scope), "$1")
    finally:
        await _close(conn)


# ==================================================================================================================
# SQLite
# ==================================================================================================================


def _filesystem(path: Path) -> str | None:
    """The type of the filesystem ``path`` is on (Linux, from /proc/mounts), else None."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    best, kind = "", None
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3:
            point = parts[1].replace("\\040", " ")
            if (str(path) == point or str(path).startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, kind = point, parts[2]
    return kind


def _sqlite_file(path: Path, race: bool) -> tuple[Line | None, str]:
    """The ``store`` line of a SQLite file, from the filesystem (None: no file yet, and the race will make it),
    and how to name the file."""
    folder = path.parent
    fs = _filesystem(folder)
    named = f"SQLite file {path}" + (f" (on {fs})" if fs else "")
    if path.is_dir():
        return Line("store", FAIL, f"{path} is a folder", "name a database file in the URL"), named
    if fs in NETWORK_FILESYSTEMS:
        return Line("store", FAIL, named, "SQLite's locks are not reliable on a network filesystem: put the file on "
                                          "a local disk, or use Postgres for workers on several machines"), named
    if path.exists():
        return Line("store", OK, f"{named}, {path.stat().st_size:,} bytes"), named
    base = folder
    while not base.exists():  # (the guard makes the missing folders)
        base = base.parent
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        why = (f"{base} is not a folder" if not base.is_dir() else
               f"its folder {folder} is not writable" if base == folder else f"{base} is not writable")
        return Line("store", FAIL, f"no file at {path}: {why}", "give a path in a folder this user may write"), named
    if not race:
        return Line("store", WARN, f"no file at {path} yet: the first guard creates it (the folder is writable); "
                                   "nothing else to check (run without --no-race to make it)"), named
    return None, named


async def check_sqlite(url: str, path: Path, settings: Settings, report: Report) -> None:
    from .stores._dialects import SQLite

    line, named = _sqlite_file(path, settings.race)
    if line is None:
        from ._guard import Guard

        async with Guard(url) as guard:  # what the first guard would do
            await guard.ensure_schema()
        line = Line("store", OK, f"{named}: created it now (with empty tables), as the first guard would")
    report.add(line)
    if line.status != OK:
        return
    try:
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=5, isolation_level=None)
    except sqlite3.Error as exc:
        report.add(Line("privileges", FAIL, f"cannot open {path} for writing: {exc}",
                        "give this user read and write access to the file and its folder"))
        return
    try:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]  # (every guard's connection says so too)
        except sqlite3.DatabaseError as exc:
            report.add(Line("server", FAIL, f"{path}: {exc}", "name a SQLite database file (or a new path)"))
            return
        version = sqlite3.sqlite_version_info
        if version < SQLITE_MIN:
            report.add(Line("server", FAIL, f"SQLite {sqlite3.sqlite_version}",
                            "agentguard needs SQLite 3.35 or later (RETURNING): use a newer Python build"))
        elif mode != "wal":
            report.add(Line("server", FAIL, f"SQLite {sqlite3.sqlite_version}, journal mode {mode}: WAL refused here",
                            "put the file on a local disk in a writable folder (WAL needs its -wal and -shm files)"))
        else:
            report.add(Line("server", OK, f"SQLite {sqlite3.sqlite_version}, journal mode WAL (readers never wait "
                                          "for the writer)"))
        report.add(Line("pooler", NA, "none: an embedded file, shared by the processes of one machine"))
        report.add(Line("isolation", OK, "serializable: one writer at a time (a busy timeout of 30 s waits out "
                                         "other writers)"))

        async def now() -> float:
            return float(conn.execute(f"SELECT {SQLite.now}").fetchone()[0])

        report.add(await _clock(now))
        report.add(_sqlite_privileges(conn, path))
        report.add(Line("listen/notify", NA, "none on SQLite: a waiter for another process's call polls"))
        samples = []
        for _ in range(20):
            t0 = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            samples.append(time.perf_counter() - t0)
        report.add(_round_trip(samples, "SELECT 1, in this process"))
        report.add(Line("connections", NA, "none to budget: a file (at most 5 pooled connections per event loop, "
                                           "one writer at a time)"))
    finally:
        conn.close()
    if _race_blocked(report, settings):
        return
    await _race_and_clean(url, settings, report, SQLiteFault(path), lambda scope: _sqlite_clean(path, scope))


def _sqlite_privileges(conn: sqlite3.Connection, path: Path) -> Line:
    problems = []
    if not os.access(path, os.R_OK | os.W_OK):
        problems.append(f"the file {path} is not readable and writable by this user")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        problems.append(f"its folder {path.parent} is not writable (WAL keeps its -wal and -shm files there)")
    present = []
    for name, expected in _expected_columns().items():
        columns = {r[1] for r in conn.execute(f"PRAGMA table_info({name})")}
        if columns:
            present.append(name)
            lacking = sorted(expected - columns - ADDED_ON_USE)
            if lacking:
                problems.append(f"{name} lacks the column(s) {', '.join(lacking)}")
    if problems:
        return Line("privileges", FAIL, "; ".join(problems),
                    "give this user read and write access to the file and its folder; a table agentguard did not "
                    "make: use another file")
    tables = "the tables present" if len(present) == 3 else "no tables yet (created on first use)"
    return Line("privileges", OK, f"the file and its folder are writable; {tables}")


class SQLiteFault:
    """On SQLite: the file held locked (``BEGIN IMMEDIATE`` on a connection of the doctor's) while the body returns,
    so that the winner's completion meets a locked file and waits it out."""

    what = "the file locked by another connection"

    def __init__(self, path: Path) -> None:
        self.path = path

    async def hold(self, scope: str, proceed: threading.Event, returned: threading.Event) -> dict[str, Any]:
        from .stores._schema import TABLE

        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            await asyncio.to_thread(conn.execute, "BEGIN IMMEDIATE")
            proceed.set()
            caught = await asyncio.to_thread(returned.wait, HOLD_SECONDS)
            await asyncio.sleep(0.3)  # (the completion is the winner's next statement: it waits for the lock)
            row = conn.execute(f"SELECT state FROM {TABLE} WHERE scope = ?", (scope,)).fetchone()
            conn.execute("ROLLBACK")
            return {"caught": caught, "state": None if row is None else row[0], "backends": []}
        finally:
            proceed.set()
            conn.close()


async def _sqlite_clean(path: Path, scope: str) -> dict[str, int]:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")

        async def exists(table: str) -> bool:
            return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                (table,)).fetchone() is not None

        async def delete(sql: str) -> str:
            return f"DELETE {conn.execute(sql, (scope,)).rowcount}"

        done = await _delete_scope(scope, exists, delete, "?")
        conn.execute("COMMIT")
        return done
    finally:
        conn.close()


# ==================================================================================================================
# The live race, and cleaning up after it
# ==================================================================================================================


class Fault(Protocol):
    what: str

    async def hold(self, scope: str, proceed: threading.Event, returned: threading.Event) -> dict[str, Any]:
        """Make the store fail for the winner's completion: set ``proceed`` (the body returns, then sets
        ``returned``) once the fault is in place."""
        ...


@dataclass
class RaceResult:
    scope: str = ""
    key: str = ""  # the downstream key the body got
    callers: int = 0
    threads: int = 0
    coroutines: int = 0
    guards: int = 0
    executions: int = 0
    results: int = 0
    replayed: int = 0
    errors: list[str] = field(default_factory=list)  # clear refusals (GuardError)
    failures: list[str] = field(default_factory=list)  # anything else, or a refusal after the body ran
    replay_after: bool = False  # a call after the race replayed the stored result
    fault: dict[str, Any] = field(default_factory=dict)
    hung: bool = False


async def race(guards: Sequence[Guard], scope: str, fault: Fault | None, callers: int = CALLERS) -> RaceResult:
    """``callers`` callers of one operation with the same arguments, in ``scope``, alternating between coroutines
    and threads and across ``guards``; counts the body's executions. With ``fault``, the store is made to fail
    for the winner's completion once its body has run."""
    from ._errors import GuardError, StoreError

    lock, started, proceed, returned = threading.Lock(), threading.Event(), threading.Event(), threading.Event()
    executions = 0

    def ran() -> None:
        nonlocal executions
        with lock:
            executions += 1
        started.set()

    def body(key: str) -> dict[str, Any]:
        ran()
        proceed.wait(RACE_SECONDS)
        returned.set()
        return {"charged": 1, "key": key}

    async def abody(key: str) -> dict[str, Any]:
        ran()
        deadline = time.monotonic() + RACE_SECONDS
        while not proceed.is_set() and time.monotonic() < deadline:  # noqa: ASYNC110 - set from another thread
            await asyncio.sleep(0.005)
        returned.set()
        return {"charged": 1, "key": key}

    options: dict[str, Any] = {"arguments": {"amount": 1}, "task_id": "doctor-race", "scope": scope}
    loop = asyncio.get_running_loop()
    result = RaceResult(scope=scope, callers=callers, guards=len(guards))
    waits: list[asyncio.Future[Any]] = []
    for i in range(callers):
        guard = guards[i % len(guards)]
        if (i // len(guards)) % 2:  # (threads and coroutines on every guard)
            done: asyncio.Future[Any] = loop.create_future()

            def call(guard: Guard = guard, done: asyncio.Future[Any] = done) -> None:
                try:
                    outcome: Any = guard.run_sync("doctor_race", body, **options)
                except BaseException as exc:  # (handed to the loop, which classifies it)
                    outcome = exc
                def settle() -> None:
                    if not done.done():
                        done.set_result(outcome)

                loop.call_soon_threadsafe(settle)

            threading.Thread(target=call, name=f"agentguard-doctor-{i}", daemon=True).start()
            waits.append(done)
            result.threads += 1
        else:
            waits.append(asyncio.ensure_future(guard.run("doctor_race", abody, **options)))
            result.coroutines += 1
    try:
        async with asyncio.timeout(RACE_SECONDS):
            if fault is not None:
                while not started.is_set() and not all(w.done() for w in waits):  # noqa: ASYNC110 - threads set it
                    await asyncio.sleep(0.005)
                if started.is_set():
                    result.fault = await fault.hold(scope, proceed, returned)
            proceed.set()
            outcomes = await asyncio.gather(*waits, return_exceptions=True)
    except TimeoutError:
        proceed.set()
        result.hung, result.executions = True, executions
        for w in waits:
            w.cancel()
        return result
    values = []
    for o in outcomes:
        if isinstance(o, StoreError) and o.body_ran:
            result.failures.append(f"after the body ran: {_why(o)}")
        elif isinstance(o, GuardError):
            result.errors.append(_why(o))
        elif isinstance(o, BaseException):
            result.failures.append(_why(o))
        else:
            values.append(o.value)
            result.results += 1
            result.replayed += o.replayed
    if values and isinstance(values[0], dict):
        result.key = str(values[0].get("key", ""))
    if any(v != values[0] for v in values):
        result.failures.append(f"callers got different results: {sorted(map(str, values))}")
    if values and not result.failures:
        try:
            again = await guards[0].run("doctor_race", abody, **options)
            result.replay_after = again.replayed and again.value == values[0]
        except Exception as exc:
            result.failures.append(f"a call after the race: {_why(exc)}")
    result.executions = executions
    return result


def race_line(r: RaceResult, what: str | None) -> Line:
    who = (f"{r.callers} callers ({r.threads} threads, {r.coroutines} coroutines, on {r.guards} guards as two "
           "workers) on one key")
    if r.hung:
        return Line("live race", FAIL, f"{who}: not done within {RACE_SECONDS:g} s ({r.executions} executions by then)",
                    "callers hung: a pool (agentguard's or a pooler's) too small for them? see the pooler and "
                    "connections lines")
    fault = ""
    if what is not None and r.fault:
        fault = (f"; the winner's completion met {what} while the record was {r.fault.get('state')}, and landed"
                 if r.fault.get("caught") else
                 f"; the fault ({what}) did not catch the completion mid-statement")
    if r.executions != 1 or r.failures:
        why = "; ".join(r.failures + r.errors[:1]) or "no caller ran the body"
        fix = ("workers do not share one store, or the store does not hold its unique key: check that every worker's "
               "URL names this store" if r.executions > 1 else "fix the lines above; if they are all fine, report "
               "this output")
        return Line("live race", FAIL, f"{who}: {r.executions} execution{'s' if r.executions != 1 else ''}; {why}",
                    fix)
    got = f"1 execution; {r.results} of {r.callers} got its result ({r.replayed} as a replay)"
    after = ", a later call replayed it" if r.replay_after else ""
    if r.errors:
        return Line("live race", WARN, f"{who}: {got}, {len(r.errors)} a clear refusal ({r.errors[0]}){fault}{after}")
    if what is not None and r.fault and not r.fault.get("caught"):
        return Line("live race", WARN, f"{who}: {got}{fault}{after}")
    return Line("live race", OK, f"{who}: {got}{fault}{after}")


async def _delete_scope(scope: str, exists: Callable[[str], Awaitable[bool]],
                        delete: Callable[[str], Awaitable[str]], param: str) -> dict[str, int]:
    """Delete the scratch scope's rows, table by table (only ``scope``'s: its rows alone are the doctor's)."""
    from .stores._attempts import ATTEMPTS, KEYS
    from .stores._schema import STEPS, TABLE

    if not scope.startswith(SCRATCH):
        raise AssertionError(f"refusing to delete the rows of {scope!r}: not a scratch scope")
    counts = {}
    for table in (STEPS, ATTEMPTS, TABLE, KEYS):  # (the keys' rows last: the records' deletion writes them)
        if await exists(table):
            status = await delete(f"DELETE FROM {table} WHERE scope = {param}")
            counts[table] = int(status.split()[-1])
    return counts


def _race_blocked(report: Report, settings: Settings) -> bool:
    if not settings.race:
        report.add(Line("live race", NA, "skipped (--no-race): nothing was written"))
        return True
    if report.failed("store", "server", "privileges"):
        report.add(Line("live race", NA, "skipped: fix the failed lines above first"))
        return True
    return False


async def _race_and_clean(url: str, settings: Settings, report: Report, fault: Fault,
                          clean: Callable[[str], Awaitable[dict[str, int]]]) -> None:
    from ._guard import Guard

    scope = SCRATCH + secrets.token_hex(6)
    # Two guards as two workers, each with engines of its own; a short retention, so that whatever a crash of the
    # doctor itself left behind is swept soon.
    guards = [Guard(url, lease=10.0, retention=3600.0, pool_size=settings.pool_size,
                    max_connections=settings.max_connections, wait_timeout=60.0,
                    connect_timeout=settings.timeout) for _ in range(2)]
    try:
        result = await race(guards, scope, fault)
    except Exception as exc:
        report.add(Line("live race", FAIL, f"could not run: {_why(exc)}", "fix the lines above, or see the error"))
        result = None
    finally:
        for guard in guards:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(guard.aclose(), 10.0)
    if result is not None:
        report.race = asdict(result)
        report.add(race_line(result, fault.what))
    if settings.keep:
        report.add(Line("scratch scope", OK, f"kept what the race wrote in {scope} (--keep): `agentguard ls --scope "
                                             f"{scope}` shows it; it expires within the hour"))
        return
    try:
        counts = await clean(scope)
    except Exception as exc:
        report.add(Line("scratch scope", FAIL, f"could not delete what {scope} wrote: {_why(exc)}",
                        f"delete its rows yourself: DELETE FROM <each agentguard table> WHERE scope = '{scope}' "
                        "(they expire within the hour otherwise)"))
        return
    calls, entries = counts.get("agentguard_calls", 0), counts.get("agentguard_attempts", 0)
    report.add(Line("scratch scope", OK, f"deleted what the race wrote in {scope} ({calls} record"
                                         f"{'s' if calls != 1 else ''}, {entries} ledger entries); no other scope "
                                         "was touched"))


# ==================================================================================================================
# The command
# ==================================================================================================================


async def diagnose(url: str, settings: Settings) -> Report:
    from sqlalchemy.engine import make_url

    from ._storeconfig import sqlite_file
    from .stores._dialects import dialect_for

    report = Report(redact_url(url))
    try:
        backend = dialect_for(url).name
        path = sqlite_file(url)
    except ValueError as exc:
        report.add(Line("store", FAIL, str(exc), "give the store's URL: sqlite+aiosqlite:///path/to/file.db or "
                                                 "postgresql+asyncpg://user:password@host:5432/db"))
        return report
    if backend == "sqlite":
        assert path is not None
        await check_sqlite(url, path, settings, report)
    else:
        await check_postgres(make_url(url).set(drivername="postgresql+asyncpg").render_as_string(False), settings,
                             report)
    return report


def render(report: Report) -> str:
    width = max(len(line.check) for line in report.lines)
    out = [f"agentguard doctor: {report.url}", "", f"{'check'.ljust(width)}  status  found"]
    for line in report.lines:
        out.append(f"{line.check.ljust(width)}  {line.status.ljust(6)}  {line.found}")
        if line.fix:
            out.append(f"{''.ljust(width)}  {''.ljust(6)}  fix: {line.fix}")
    failed = [line.check for line in report.lines if line.status == FAIL]
    out.append("")
    out.append(f"{len(failed)} line{'s' if len(failed) != 1 else ''} failed ({', '.join(failed)}): change what "
               "each says, then run the doctor again" if failed else "every line is fine")
    return "\n".join(out)


def run(url: str, settings: Settings, *, as_json: bool = False) -> int:
    """Check the store at ``url``, print the table (or one JSON document), and return the exit status: 0 when
    no line failed, else 1."""
    report = asyncio.run(diagnose(url, settings))
    if as_json:
        print(json.dumps({"url": report.url, "ok": report.ok, "lines": [asdict(line) for line in report.lines],
                          "race": report.race}))
    else:
        print(render(report))
    sys.stdout.flush()
    return 0 if report.ok else 1
