"""The two tables, and the one row layout a call record is read in.

``ROW`` lists the columns of a read record, in order. Everything that knows that order is generated from it:
the read's SELECT list and :func:`record_from_row`, which turns a row into a :class:`Record` (whose fields are
``scope``, ``key`` and then ``ROW``, in that order).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

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
)
from sqlalchemy.ext.asyncio import AsyncConnection

TABLE = "agentguard_calls"
STEPS = "agentguard_steps"

RUNNING, SUCCEEDED, FAILED, RELEASED = "running", "succeeded", "failed", "released"
# The fingerprint of a released record whose body never started: it binds no arguments (no fingerprint is empty).
UNBOUND = ""
STARTED, DONE = "started", "done"  # step states

# The records' index of their task (below), and the one a store made before the task came first has.
TASK_INDEX, TASK_INDEX_COLUMNS = f"{TABLE}_by_task_idx", ("task_id", "scope", "created_at")
OLD_TASK_INDEX = f"{TABLE}_task_idx"  # (scope, task_id, created_at)


@dataclass(frozen=True)
class Replacement:
    """An index a store made by an earlier version has (``old``) and the one that replaces it (``name`` on
    ``table``'s ``columns``, only of the rows ``where`` says, if given), built by ``agentguard migrate``, never when
    a guard opens a store: a build that blocks writes would hold every writer for as long as it takes (Postgres
    builds it without blocking writes, ``_server.replace_index``). ``what``: the index, for a person."""

    table: str
    name: str
    columns: tuple[str, ...]
    old: str
    what: str
    where: str | None = None

    def create(self, concurrently: bool = False) -> str:
        how = " CONCURRENTLY" if concurrently else ""
        where = f" WHERE {self.where}" if self.where else ""
        return f"CREATE INDEX{how} IF NOT EXISTS {self.name} ON {self.table} ({', '.join(self.columns)}){where}"

    def drop_old(self, concurrently: bool = False) -> str:
        return f"DROP INDEX{' CONCURRENTLY' if concurrently else ''} IF EXISTS {self.old}"

    def ddl(self) -> list[str]:
        """The new index made where it is missing and the old one dropped (SQLite, under its write lock)."""
        return [self.create(), self.drop_old()]


TASK_REPLACEMENT = Replacement(TABLE, TASK_INDEX, TASK_INDEX_COLUMNS, OLD_TASK_INDEX, "the task index")

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
    # A person's reads (the console): a task's records, and the tasks in the order of their latest claim, read
    # from the index alone. Of the columns a call writes, only a claim's (and a takeover's) are in it: a
    # completion or a renewal on SQLite, or a renewal on Postgres (a HOT update), never writes to it. The task
    # comes first: an index that starts with the scope alone also serves ``scope = $1 AND key = $2`` (the one
    # scope's records, each compared with the key), and Postgres planned the read and the completion so while the
    # table was small and had no statistics, a generic plan it then kept for the connection's life: every call
    # read the whole scope (issue 34: 41 -> 234 us a read after 2,800 records; tests/whitebox/test_key_plans.py).
    # A store made with the scope first has it replaced by ``agentguard migrate`` (``SQLStore.replace_indexes``);
    # a Postgres one says so when opened.
    Index(TASK_INDEX, *TASK_INDEX_COLUMNS),
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


async def create_schema(conn: AsyncConnection, begin: str, lock: str | None, more: Sequence[str],
                        upgrade: Callable[[AsyncConnection], Awaitable[None]] | None = None) -> None:
    """Create the tables (if missing), run the ``more`` DDL and ``upgrade`` (what a store made by an earlier version
    lacks) in one explicit transaction, so that ``lock`` (taken first, if any) covers all of it; ``conn`` is in
    autocommit mode."""
    await conn.exec_driver_sql(begin)
    try:
        if lock:
            await conn.exec_driver_sql(lock)
        await conn.run_sync(metadata.create_all, checkfirst=True)
        for ddl in more:
            await conn.exec_driver_sql(ddl)
        if upgrade is not None:
            await upgrade(conn)
        await conn.exec_driver_sql("COMMIT")
    except BaseException:
        # The connection may be the failure (terminated, a server restarting): then the rollback fails too,
        # and must not hide the cause, which says whether the failure is an outage that may pass.
        with contextlib.suppress(Exception):
            await conn.exec_driver_sql("ROLLBACK")
        raise


def schema_ddl(dialect: Any, more: Sequence[str] = ()) -> list[str]:
    """The statements that make the store's tables and indexes where missing, in ``dialect`` (SQLAlchemy's), then
    ``more``: what ``create_schema`` runs, for an administrator to run (``agentguard migrate --sql``)."""
    from sqlalchemy.schema import CreateIndex, CreateTable

    out: list[str] = []
    for table in metadata.sorted_tables:
        out.append(str(CreateTable(table, if_not_exists=True).compile(dialect=dialect)).strip())
        out += [str(CreateIndex(index, if_not_exists=True).compile(dialect=dialect)).strip()
                for index in sorted(table.indexes, key=lambda i: str(i.name))]
    return out + [ddl.strip() for ddl in more]


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


# ``Record(*fields)`` without the NamedTuple's Python-level ``__new__`` (a record is built on every claim that
# meets one and on every completion): the fields in Record's order, already of their types. Equal to the
# general constructor; tests/whitebox/test_whitebox_store_layout.py proves it.
record_of = cast(Callable[[Iterable[Any]], Record], functools.partial(tuple.__new__, Record))


def live_sql(now: str, c: str = "") -> str:
    """SQL: the record is running and its lease has not expired (``c``: the table alias and a dot, or "")."""
    return f"({c}state = '{RUNNING}' AND {c}lease_until > {now})"


# A record whose outcome is held for a person (``agentguard ls --unknown``, ``resolve``, the console's "held"),
# in one of three ways (``HELD_KINDS``): its worker died inside a step (a started step of its current origin); its
# worker died inside the body and a caller whose key cannot reach the provider found it so (``HELD_LEASE``: the
# caller marks the lease so, and leaves the record otherwise as it was, so that a worker only stalled may still
# renew it and record its outcome); or the body ran and its result could not be stored (recorded as that error:
# ``agentguard.ResultNotStoredError``). A tool whose key reaches the provider takes a dead worker's record over
# on its next call, and never marks it.
HELD_STEP, HELD_BODY, HELD_NOT_STORED = "step", "body", "not_stored"
HELD_KINDS = (HELD_STEP, HELD_BODY, HELD_NOT_STORED)
HELD_LEASE = 0  # the lease_until of a running record held on its body: no claim's lease (now + lease) is ever 0
# The stored error's text starts so (``_codec.encode_error``); each "_" of a LIKE pattern matches any one
# character, the ":" included, which SQLAlchemy's text() would read as a parameter.
NOT_STORED_PREFIX = '{"type": "agentguard._errors:ResultNotStoredError"'
_NOT_STORED_LIKE = NOT_STORED_PREFIX.replace(":", "_") + "%"


def started_step_sql(c: str = "") -> str:
    """SQL: a step of the record's current origin started and never recorded its outcome."""
    return (f"EXISTS (SELECT 1 FROM {STEPS} s WHERE s.scope = {c}scope AND s.key = {c}key"
            f" AND s.origin = {c}origin AND s.state = '{STARTED}')")


def not_stored_sql(c: str = "") -> str:
    """SQL: the body ran and its result could not be stored (the error recorded in its place)."""
    return f"({c}state = '{FAILED}' AND {c}result LIKE '{_NOT_STORED_LIKE}')"


def held_body_sql(c: str = "") -> str:
    """SQL: a caller whose key cannot reach the provider found the record's worker gone inside the body."""
    return f"({c}state = '{RUNNING}' AND {c}lease_until = {HELD_LEASE})"


def held_kind_sql(now: str, c: str = "") -> str:
    """SQL: how the record is held (one of ``HELD_KINDS``), or NULL if it is not."""
    dead = f"NOT {live_sql(now, c)}"
    return (f"CASE WHEN {not_stored_sql(c)} THEN '{HELD_NOT_STORED}'"
            f" WHEN {c}state IN ('{RUNNING}', '{RELEASED}') AND {dead} AND {started_step_sql(c)} THEN '{HELD_STEP}'"
            f" WHEN {held_body_sql(c)} THEN '{HELD_BODY}' END")


def held_sql(now: str, c: str = "") -> str:
    """SQL: the record is held for a person, in any of the three ways."""
    return f"({held_kind_sql(now, c)} IS NOT NULL)"


class Col(NamedTuple):
    """One column of a read record."""

    name: str
    sql: str  # the expression; {c} is the table alias and a dot (or nothing), {now} the database clock
    flag: bool = False  # computed as 0 or 1 (SQLite has no boolean type); a Record holds a bool


ROW = (
    Col("state", "{c}state"),
    Col("fence", "{c}fence"),
    Col("fingerprint", "{c}fingerprint"),
    Col("arg_hashes", "{c}arg_hashes"),
    Col("result", "{c}result"),
    Col("attempts", "{c}attempts"),
    Col("owner", "{c}owner"),
    Col("task_id", "{c}task_id"),
    Col("operation", "{c}operation"),
    Col("live", "CASE WHEN {live} THEN 1 ELSE 0 END", flag=True),
    Col("expired", "CASE WHEN {c}expires_at < {now} THEN 1 ELSE 0 END", flag=True),
    Col("ttl", "{c}expires_at - {now}"),
    Col("origin", "{c}origin"),
)
if Record._fields != ("scope", "key", *(col.name for col in ROW)):
    raise AssertionError("Record's fields must be scope, key and then ROW's columns, in order")

_FLAGS = tuple(2 + i for i, col in enumerate(ROW) if col.flag)  # where a Record holds a 0/1 flag


def column_sql(col: Col, now: str, c: str = "") -> str:
    return col.sql.format(c=c, now=now, live=live_sql(now, c))


def select_list(now: str, c: str = "") -> str:
    """ROW as a SELECT list: each column, computed ones named."""
    return ", ".join(
        sql if sql == f"{c}{col.name}" else f"{sql} AS {col.name}"
        for col, sql in ((col, column_sql(col, now, c)) for col in ROW)
    )


def record_from_row(scope: str, key: str, row: Sequence[Any]) -> Record:
    """The record of ``(scope, key)`` from a row in ROW's layout. Both drivers give int for the integer
    columns and float for ttl (a REAL / float8 expression); only the 0/1 flags need converting."""
    fields = [scope, key, *row]
    for i in _FLAGS:
        fields[i] = bool(fields[i])
    return record_of(fields)


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


def listing_from_row(r: Sequence[Any]) -> Listing:
    """A listing from the listing statement's row (scope, key, task_id, operation, state, attempts, age,
    lease_left, audit)."""
    return Listing(
        scope=r[0], key=r[1], task_id=r[2], operation=r[3], state=r[4], attempts=int(r[5]), age=float(r[6]),
        lease_left=None if r[7] is None else float(r[7]), audit=None if r[8] is None else _audit(r[8]),
    )


def _audit(text_: str) -> dict[str, Any] | None:
    from .._codec import loads

    try:
        value = loads(text_)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
