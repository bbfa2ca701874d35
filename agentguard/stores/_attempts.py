"""The ledger of attempts: one row per time a caller came to the guard (it ran the body, replayed, was refused,
took over, released, lost its lease, was held on an unknown outcome), per attempt whose worker went away, and per
operator's act (resolved, forgotten). Written in batches off the caller's path (``agentguard._ledger``), each
entry in its scope's hash chain (``_chain``); read by ``agentguard show``, ``timeline`` and ``stats``, and by
anything built on :class:`Attempt` (a console's task timeline).

An attempt whose process died before its entry was written is still read: a record still ``running`` whose
lease ran out, with no entry for its attempt, is read as a ``went_away`` entry derived from the record (id 0);
the caller that takes it over, holds it for a person, or an operator who settles it, writes that entry.

The table is created with the records' tables (an older store gets it, and the chain's columns, on first use,
under the schema lock). Its rows carry their own ``expires_at`` (the guard's retention) and are swept with the
records, each chain from its start (``_chain``).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Column, Double, Index, Integer, PrimaryKeyConstraint, String, Table, Text, text
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import StoreError
from . import _chain
from ._aiosqlite import on_thread
from ._chain import CHAIN_COLUMNS, CHAINS, Chain, ChainCheck
from ._schema import HELD_LEASE, RUNNING, STEPS, TABLE, Replacement, metadata
from ._sweep import paced

if TYPE_CHECKING:
    from ._executor import Executor

log = logging.getLogger("agentguard")

ATTEMPTS = "agentguard_attempts"

# What an attempt came to (the ``kind`` column).
RAN, REPLAYED, REFUSED, TOOK_OVER = "ran", "replayed", "refused", "took_over"
RELEASED_KIND, LEASE_LOST, UNKNOWN, NOT_STORED = "released", "lease_lost", "unknown", "not_stored"
RESOLVED, FORGOTTEN, DROPPED = "resolved", "forgotten", "dropped"
WENT_AWAY = "went_away"  # an attempt whose worker went away (its lease ran out) before it recorded an outcome
KINDS = (RAN, REPLAYED, REFUSED, TOOK_OVER, RELEASED_KIND, LEASE_LOST, UNKNOWN, NOT_STORED, RESOLVED, FORGOTTEN,
         DROPPED, WENT_AWAY)
# The kinds that end a claimed attempt, written by the attempt's own process (or, went_away, by whoever found it
# gone): a running record whose lease ran out and whose attempt has none of them is read as gone.
ENDED = (RAN, TOOK_OVER, RELEASED_KIND, LEASE_LOST, NOT_STORED, WENT_AWAY)
# Entries of a record's current life are those at or after its creation, by the database's clock, less this margin
# for the callers' clocks (an earlier life's last entries are a whole retention older).
SKEW = 60.0

# The expiry index holds only the entries outside any chain (written before the store had one), which the sweep
# deletes by their expiry; a chained entry is swept by its place, from its chain's start (``_chain``), so an index
# of every entry's expiry was upkeep for nothing on each entry written (about 1 us of the 7 to 9 a Postgres COPY
# costs a row: docs/benchmarks.md, "The ledger's expiry index holds only the entries outside a chain"). A store
# made before has that index: ``agentguard migrate`` replaces it (``SQLStore.replace_indexes``).
UNCHAINED, UNCHAINED_INDEX = "seq IS NULL", f"{ATTEMPTS}_unchained_idx"
UNCHAINED_REPLACEMENT = Replacement(ATTEMPTS, UNCHAINED_INDEX, ("expires_at",), f"{ATTEMPTS}_expires_idx",
                                    "the ledger's expiry index", UNCHAINED)

attempts = Table(
    ATTEMPTS,
    metadata,
    # SQLite's INTEGER PRIMARY KEY is the rowid (increasing); Postgres' a bigserial.
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("scope", String(255), nullable=False),
    Column("key", String(64), nullable=False),
    Column("task_id", Text, nullable=False),
    Column("operation", Text, nullable=False),
    Column("tool", Text, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("detail", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("call_id", Text),  # the host's id of the invocation (MCP _meta, a framework's tool call id)
    Column("process", Text, nullable=False),  # host:pid of the caller
    Column("at", Double, nullable=False),  # seconds since the epoch, by the caller's clock, when it ended
    Column("guard_ms", Double),  # the guard's own time in this attempt (not the body's, not waiting)
    Column("wait_ms", Double),  # time spent waiting for another caller of the same key
    Column("expires_at", Double, nullable=False),
    # The entry's place in its scope's hash chain, the digest of the entry before it, its own (``_chain``); NULL in
    # an entry written before the store had the chain.
    Column("seq", BigInteger),
    Column("prev", String(64)),
    Column("digest", String(64)),
    Index(f"{ATTEMPTS}_task_idx", "task_id", "at"),
    Index(f"{ATTEMPTS}_at_idx", "at"),
    Index(UNCHAINED_INDEX, "expires_at", sqlite_where=text(UNCHAINED), postgresql_where=text(UNCHAINED)),
    # One entry per place (whatever a writer's lock did); a chain is walked, and cut, in order of place.
    Index(f"{ATTEMPTS}_chain_idx", "scope", "seq", unique=True),
)
# A key's entries are read through the task index: a key is derived from its scope, task and operation, so it
# names one task, found in the key's record (its primary key) while there is one, and afterwards in
# ``agentguard_ledger_keys`` (below). No index of the keys themselves: a key is random, so its entry would land on
# a page of its own in one, the upkeep of every entry (about half a SQLite entry's insert, and the writer's lock
# held longer as the table grows: docs/benchmarks.md, "The ledger without a key index"). A store made before has
# such an index (of the key's first characters, or older, of ``(key, at)``): the upgrade fills the keys' table
# from the ledger and drops it (``keys_ddl``, ``KEYS_FILL``).
OLD_KEY_INDEXES = (f"{ATTEMPTS}_key_prefix_idx", f"{ATTEMPTS}_key_idx")

# A key's task once its record is gone: a row per key whose record was deleted (swept, forgotten, by anyone: a
# trigger on the records' table writes it, ``keys_ddl``) or that an entry names with no record to find it by (a
# refusal: the store may have been down; an entry written ``LATE``), kept while an entry of the key is (the
# ledger's sweep deletes a row past its ``expires_at`` only when no entry of its key is left, and moves it on
# otherwise).
KEYS = "agentguard_ledger_keys"
ledger_keys = Table(
    KEYS,
    metadata,
    Column("key", String(64), nullable=False),
    Column("scope", String(255), nullable=False),
    Column("task_id", Text, nullable=False),
    Column("expires_at", Double, nullable=False),
    PrimaryKeyConstraint("key", "scope", name=f"{KEYS}_pkey"),  # (the key first: read without a scope too)
    Index(f"{KEYS}_expires_idx", "expires_at"),
)
KEYS_TRIGGER = "agentguard_calls_leave_keys"
# Seconds a deleted record's key row outlives the record's own expiry at least (an entry written late, by a
# writer behind its callers, is still found through it).
KEPT_AFTER = 3600.0
# An entry written this long after its call ended is written with its key's row (``_write_attempts``): later
# than ``KEPT_AFTER``, that row may have been swept with no entry of its key left to keep it.
LATE = KEPT_AFTER / 2


# A key's row written, or moved on to the later expiry where it is there: the one upsert of each dialect, run by the
# records' trigger and by the ledger's writer alike.
_MOVED_ON = {True: "ON CONFLICT (key, scope) DO UPDATE SET expires_at = max(expires_at, excluded.expires_at)",
             False: "ON CONFLICT (key, scope) DO UPDATE SET expires_at = GREATEST(k.expires_at, EXCLUDED.expires_at)"}


def keys_ddl(sqlite: bool) -> list[str]:
    """The trigger that leaves a deleted record's key row, and the upgrade of a store that has a key index (its
    keys' tasks copied from the ledger, the index dropped): run under the schema lock, each a no-op where done."""
    kept, columns = f"OLD.expires_at + {KEPT_AFTER}", "key, scope, task_id, expires_at"
    if sqlite:
        return [
            f"CREATE TRIGGER IF NOT EXISTS {KEYS_TRIGGER} AFTER DELETE ON {TABLE} BEGIN"
            f" INSERT INTO {KEYS} ({columns}) VALUES (OLD.key, OLD.scope, OLD.task_id, {kept}) {_MOVED_ON[True]};"
            " END",
        ]
    old = " OR ".join(f"to_regclass('{name}') IS NOT NULL" for name in OLD_KEY_INDEXES)
    drops = " ".join(f"DROP INDEX IF EXISTS {name};" for name in OLD_KEY_INDEXES)
    return [
        # (a statement's deleted rows at once: a sweep's batch is one INSERT; in the keys' order, as the ledger's
        # writer writes its key rows: ``kept_keys``)
        f"CREATE OR REPLACE FUNCTION {KEYS_TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $fn$ BEGIN"
        f" INSERT INTO {KEYS} AS k ({columns}) SELECT key, scope, task_id, expires_at + {KEPT_AFTER} FROM gone"
        f" ORDER BY key, scope {_MOVED_ON[False]}; RETURN NULL; END $fn$",
        "DO $ddl$ BEGIN"
        f" IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('{TABLE}')"
        f" AND tgname = '{KEYS_TRIGGER}') THEN"
        f" CREATE TRIGGER {KEYS_TRIGGER} AFTER DELETE ON {TABLE} REFERENCING OLD TABLE AS gone"
        f" FOR EACH STATEMENT EXECUTE FUNCTION {KEYS_TRIGGER}();"
        " END IF; END $ddl$",
        f"DO $ddl$ BEGIN IF {old} THEN {KEYS_FILL}; {drops} END IF; END $ddl$",
    ]


# A key's row written beside a refusal's or a late entry (key, scope, task id, the entry's expiry), by each driver.
# Every statement that writes keys' rows takes them in the keys' order (``kept_keys``, the records' trigger, the keys'
# sweep), so that two transactions that write the same keys never each hold one the other waits for: on Postgres a
# ledger batch and a sweep's (or a forget's) deletion of the same records, crosswise, were a deadlock, one aborted.
_KEEP_KEY = {True: f"INSERT INTO {KEYS} (key, scope, task_id, expires_at) VALUES (?, ?, ?, ?) {_MOVED_ON[True]}",
             False: f"INSERT INTO {KEYS} AS k (key, scope, task_id, expires_at) VALUES ($1, $2, $3, $4)"
                    f" {_MOVED_ON[False]}"}


def kept_keys(entries: Sequence[Sequence[Any]], late: float) -> list[tuple[str, str, str, float]]:
    """The key rows a batch of entries (values of ``WRITTEN``) writes beside them, in the keys' order, one per key
    (its latest expiry): a refusal's (its call may have left no record: the store was down) and a late entry's (its
    record and its key row may both be gone), ``late`` the time before which an entry is late."""
    keyed: dict[tuple[str, str], tuple[str, str, str, float]] = {}
    for v in entries:
        if v[1] and (v[5] == REFUSED or v[10] < late):
            held = keyed.get((v[1], v[0]))
            if held is None or v[13] > held[3]:
                keyed[(v[1], v[0])] = (v[1], v[0], v[2], v[13])
    return [keyed[k] for k in sorted(keyed)]


# The keys' tasks of a store that had a key index, copied from its ledger (once, as the index is dropped).
KEYS_FILL = (f"INSERT INTO {KEYS} (key, scope, task_id, expires_at) SELECT key, scope, min(task_id), max(expires_at)"
             f" FROM {ATTEMPTS} WHERE key <> '' GROUP BY key, scope ON CONFLICT (key, scope) DO NOTHING")


# The columns an entry is written with and read in, in order (``Attempt``'s fields after ``id``).
COLUMNS = ("scope", "key", "task_id", "operation", "tool", "kind", "detail", "attempt", "call_id", "process", "at",
           "guard_ms", "wait_ms")
WRITTEN = (*COLUMNS, "expires_at")  # an entry as it is written: its values, then when it expires

CALL_ID_MAX = 255  # characters of a host's id of an invocation the ledger keeps
# Host ids of an invocation, in the order one is picked for ``call_id`` (the audit the adapters store).
CALL_IDS = ("tool_call_id", "claudecode/toolUseId", "callId", "itemId", "request_id")


def call_id_of(audit: str | None, names: tuple[str, ...] = CALL_IDS) -> str | None:
    """The host's id of an invocation, from an audit (a JSON object), at most ``CALL_ID_MAX`` characters (the
    store keeps it as every store can hold it: :func:`storable`). ``names``: the ids to look for, in order."""
    if not audit:
        return None
    try:
        ids = json.loads(audit)
    except ValueError:
        return None
    if isinstance(ids, dict):
        for name in names:
            if isinstance(ids.get(name), str | int):
                return str(ids[name])[:CALL_ID_MAX]
    return None


def owner_process(owner: str | None) -> str:
    """``host:pid`` of the process that made a claim, from its owner token (``agentguard._lease``: ``host:pid/``
    and a random part); "" for a token of an earlier version, which names none."""
    head, slash, _ = (owner or "").rpartition("/")
    return head if slash and ":" in head else ""


def went_away_detail(owner: str | None, then: str, *, held: bool = False) -> str:
    """A ``went_away`` entry's detail: what is known of the attempt, and ``then`` (what became of it)."""
    where = " inside the body" if held else ""
    return f"its lease ran out{where} with no outcome recorded (owner {owner or 'unknown'}); {then}"

TEXT_MAX = 4000  # characters of any other text column's value (an entry is a line for a person)
# (position in WRITTEN, characters kept) of each text column: a VARCHAR's length, else the above.
_TEXTS = tuple(
    (i, CALL_ID_MAX if name == "call_id" else attempts.c[name].type.length or TEXT_MAX)  # type: ignore[attr-defined]
    for i, name in enumerate(WRITTEN) if isinstance(attempts.c[name].type, String)
)
# A NUL (Postgres' text holds none) and every surrogate (in a str, always a lone one, which no store can encode).
_UNHELD = dict.fromkeys([0, *range(0xD800, 0xE000)], "\ufffd")


def storable(value: str, limit: int) -> str:
    """``value`` as every store holds it: a NUL or a lone surrogate (JSON can carry both) replaced by U+FFFD, at
    most ``limit`` characters."""
    if "\x00" in value or not value.isascii():
        value = value.translate(_UNHELD)
    return value[:limit]


def _held(rows: Sequence[Sequence[Any]]) -> bool:
    """Whether every text of ``rows`` is held by every store as it is (a column at a time: the ledger's writer
    pays this for every entry)."""
    for i, limit in _TEXTS:
        col = [row[i] for row in rows]
        try:
            joined = "".join(col)
        except TypeError:  # (a None: no call id)
            col = [v for v in col if type(v) is str]
            joined = "".join(col)
        if ("\x00" in joined or (not joined.isascii() and not _encodes(joined))
                or (len(joined) > limit and max(map(len, col)) > limit)):
            return False
    return True


def _encodes(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def storable_rows(rows: Sequence[Sequence[Any]]) -> Sequence[Sequence[Any]]:
    """``rows`` (values of ``WRITTEN``) with every text as every store holds it (:func:`storable`): one entry
    the store refused would take its whole batch with it."""
    if _held(rows):
        return rows
    out = []
    for row in rows:
        if not _held((row,)):
            cleaned = list(row)
            for i, limit in _TEXTS:
                if type(cleaned[i]) is str:
                    cleaned[i] = storable(cleaned[i], limit)
            row = tuple(cleaned)
        out.append(row)
    return out


@dataclass(frozen=True, slots=True)
class Attempt:
    """One entry of the ledger: what one call of a guarded operation came to, or an operator's act on it.

    A stable read API (``Guard.attempts``, ``Guard.timeline``; ``agentguard show``/``timeline --json``):

    - ``kind``: ``ran`` (claimed, the body ran, its outcome stored: ``detail`` says ``succeeded`` or the cached
      error), ``took_over`` (ran after taking over a claim whose worker went away; ``detail`` also says what
      was there before), ``went_away`` (an attempt whose worker went away — its process died or stalled past
      its lease — before it recorded an outcome: ``process`` is that worker's, ``detail`` names its owner token
      and what became of it; ``id`` 0 when it is read from its record, still running, rather than written),
      ``replayed`` (``detail``: ``cache`` or ``store``), ``refused`` (``detail`` starts
      with ``reuse``, ``in progress``, ``missing task`` or ``store``: the body did not run), ``released`` (the
      body raised; the claim was released for a retry), ``lease_lost`` (the result was refused: another worker
      had taken over), ``unknown`` (held on a step of unknown outcome), ``not_stored`` (the result could not be
      encoded), ``resolved`` and ``forgotten`` (an operator's acts), ``dropped`` (``detail``: how many entries
      this process dropped because the store could not keep up; the entry is not about one call);
    - ``attempt``: the record's attempt number (1 for the first claim, +1 for each retry or takeover; a replay
      carries the attempt that produced the outcome; ``went_away``: the attempt that went away);
    - ``call_id``: the host's id of this invocation where there is one (MCP ``_meta``, request id), else None;
    - ``process``: ``host:pid`` of the caller; ``at``: when the attempt ended (seconds since the epoch;
      ``went_away``: when it was found gone, or, read from its record, when its lease ran out);
    - ``guard_ms`` / ``wait_ms``: the guard's own time (excluding the body and waiting) and the time spent
      waiting for another caller of the key, in milliseconds (None for an operator's act).
    """

    id: int
    scope: str
    key: str
    task_id: str
    operation: str
    tool: str
    kind: str
    detail: str
    attempt: int
    call_id: str | None
    process: str
    at: float
    guard_ms: float | None
    wait_ms: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, **{name: getattr(self, name) for name in COLUMNS}}


def attempt_from_row(r: Sequence[Any]) -> Attempt:
    return Attempt(int(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], r[7], int(r[8]), r[9], r[10], float(r[11]),
                   None if r[12] is None else float(r[12]), None if r[13] is None else float(r[13]))


def _went_away(r: Sequence[Any]) -> Attempt:
    """A ``went_away`` entry read from a running record whose lease ran out (a row of the ``gone`` statements)."""
    held = bool(r[9])
    then = "from its record, held for a person" if held else "from its record, still running"
    return Attempt(0, r[0], r[1], r[2], r[3], r[4], WENT_AWAY, went_away_detail(r[6], then, held=held), int(r[5]),
                   call_id_of(r[7]), owner_process(r[6]), float(r[8]), None, None)



@dataclass(frozen=True, slots=True)
class RecordDetail:
    """One record in full, for a person (``agentguard show``): what ``Listing`` shows, and the rest."""

    scope: str
    key: str
    task_id: str
    operation: str
    tool: str
    state: str
    attempts: int
    fence: int
    age: float
    updated_ago: float
    expires_in: float
    lease_left: float | None
    result: str | None
    audit: str | None
    steps: tuple[tuple[str, int, str, str | None], ...] = ()


class AttemptStatements:
    """The ledger's statements, for one database clock (``now``)."""

    def __init__(self, now: str) -> None:
        cols = ", ".join(("id", *COLUMNS))
        where = ("(CAST(:scope AS VARCHAR) IS NULL OR scope = :scope)"
                 " AND (CAST(:since AS DOUBLE PRECISION) IS NULL OR at >= :since)")
        # One entry through SQLAlchemy: what a batch handed to the driver whole stores alike
        # (tests/whitebox/test_ledger.py).
        self.insert = text(
            f"INSERT INTO {ATTEMPTS} ({', '.join(WRITTEN)}) VALUES ({', '.join(':' + c for c in WRITTEN)})"
        )
        # A key's task, from its record (in each scope that has a chain: every scope with entries), else from its
        # row in the keys' table; its entries then through the task index.
        tasks = (f"SELECT c.task_id FROM {TABLE} c WHERE c.key = :key AND c.scope IN (SELECT h.scope FROM {CHAINS} h"
                 " WHERE CAST(:scope AS VARCHAR) IS NULL OR h.scope = :scope)"
                 f" UNION SELECT k.task_id FROM {KEYS} k WHERE k.key = :key"
                 " AND (CAST(:scope AS VARCHAR) IS NULL OR k.scope = :scope)")
        self.by_key = text(
            f"SELECT {cols} FROM {ATTEMPTS} WHERE task_id IN ({tasks}) AND key = :key AND {where}"
            " ORDER BY at, id LIMIT :limit"
        )
        # The keys' rows past their expiry (whether an entry of the key is left, through the task index); each
        # deleted if none is (checked again as it is deleted), else moved on to its entries' latest expiry (at
        # least ``KEPT_AFTER`` ahead, so that a row is not looked at again before then).
        once = f"(SELECT {now})"
        entries_of = (f"FROM {ATTEMPTS} a WHERE a.task_id = {{0}}.task_id AND a.key = {{0}}.key"
                      " AND a.scope = {0}.scope")
        self.expired_keys = text(
            f"SELECT k.key, k.scope, EXISTS (SELECT 1 {entries_of.format('k')}) FROM {KEYS} k"
            f" WHERE k.expires_at < {once} ORDER BY k.expires_at LIMIT :batch"
        )
        self.drop_key = text(
            f"DELETE FROM {KEYS} WHERE key = :key AND scope = :scope AND expires_at < {once}"
            f" AND NOT EXISTS (SELECT 1 {entries_of.format(KEYS)})"
        )
        self.keep_key = text(
            f"UPDATE {KEYS} SET expires_at = COALESCE((SELECT max(a.expires_at) {entries_of.format(KEYS)}"
            f" AND a.expires_at > {once} + {KEPT_AFTER}), {once} + {KEPT_AFTER}) WHERE key = :key AND scope = :scope"
        )
        self.by_task = text(
            f"SELECT {cols} FROM {ATTEMPTS} WHERE task_id = :task_id AND {where} ORDER BY at, id LIMIT :limit"
        )
        self.since = text(f"SELECT {cols} FROM {ATTEMPTS} WHERE {where} ORDER BY at, id LIMIT :limit")
        # Running records whose lease ran out (or that are held for a person on their body) with no entry that ends
        # their attempt: attempts whose worker went away before anything was written (read as ``went_away``). No
        # index serves it: an index of running records costs every first call its upkeep, where this read, a
        # person's, scans the records (docs/benchmarks.md, "Every attempt kept").
        ended = f"CASE WHEN c.lease_until = {HELD_LEASE} THEN c.updated_at ELSE c.lease_until END"
        kinds = ", ".join(f"'{k}'" for k in ENDED)

        def gone(scope: str) -> str:
            return (
                f"SELECT c.scope, c.key, c.task_id, c.operation, c.tool, c.attempts, c.owner, c.audit,"
                f" {ended} AS ended, CASE WHEN c.lease_until = {HELD_LEASE} THEN 1 ELSE 0 END AS held"
                f" FROM {TABLE} c WHERE c.state = '{RUNNING}' AND c.lease_until <= {now} AND {scope}"
                f" AND (CAST(:since AS DOUBLE PRECISION) IS NULL OR {ended} >= :since)"
                f" AND NOT EXISTS (SELECT 1 FROM {ATTEMPTS} a WHERE a.task_id = c.task_id AND a.key = c.key"
                " AND a.scope = c.scope AND a.attempt = c.attempts"
                f" AND a.kind IN ({kinds}) AND a.at >= c.created_at - {SKEW})"
            )

        # Of one key or one task in a scope (the console's reads, each a page's): through the records' primary
        # key or their task index. In any scope, or of all tasks: a scan of the records (a command's one read).
        anywhere, scoped = gone("(CAST(:scope AS VARCHAR) IS NULL OR c.scope = :scope)"), gone("c.scope = :scope")
        order = " ORDER BY ended LIMIT :limit"
        self.gone_by_key = text(f"{anywhere} AND c.key = :key{order}")
        self.gone_by_key_in_scope = text(f"{scoped} AND c.key = :key{order}")
        self.gone_by_task = text(f"{anywhere} AND c.task_id = :task_id{order}")
        self.gone_by_task_in_scope = text(f"{scoped} AND c.task_id = :task_id{order}")
        self.gone_since = text(f"{anywhere}{order}")
        self.detail = text(
            f"SELECT scope, key, task_id, operation, tool, state, attempts, fence, {now} - created_at,"
            f" {now} - updated_at, expires_at - {now},"
            f" CASE WHEN state = '{RUNNING}' THEN lease_until - {now} END, result, audit, origin"
            f" FROM {TABLE} WHERE key = :key AND (CAST(:scope AS VARCHAR) IS NULL OR scope = :scope)"
            " ORDER BY scope LIMIT 10"
        )
        self.steps = text(
            f"SELECT name, seq, state, result FROM {STEPS} WHERE scope = :scope AND key = :key AND origin = :origin"
            " ORDER BY seq"
        )
        # An operator's deliberate delete: never a running claim (live or not: a takeover decides that one).
        self.forget = text(
            f"DELETE FROM {TABLE} WHERE scope = :scope AND key = :key AND state <> '{RUNNING}'"
        )
        self.forget_steps = text(f"DELETE FROM {STEPS} WHERE scope = :scope AND key = :key")
        self.task_known = text(f"SELECT 1 FROM {TABLE} WHERE task_id = :task_id LIMIT 1")


# Postgres: the chain's columns and index, added to a ledger made before them, without locking the table when they
# are there already (run under the schema lock, after the tables are made).
CHAIN_DDL = f"""
DO $ddl$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('{ATTEMPTS}') AND attname = 'seq'
                 AND NOT attisdropped) THEN
    ALTER TABLE {ATTEMPTS} ADD COLUMN seq bigint, ADD COLUMN prev varchar(64), ADD COLUMN digest varchar(64);
    CREATE UNIQUE INDEX IF NOT EXISTS {ATTEMPTS}_chain_idx ON {ATTEMPTS} (scope, seq);
  END IF;
END $ddl$"""


async def upgrade(conn: AsyncConnection, sqlite: bool) -> None:
    """What a ledger made by an earlier version lacks, inside the schema's transaction (under its lock: SQLite's
    write lock, Postgres' advisory one), each only if it is missing (a read, otherwise): the chain's columns and
    index; the trigger that leaves a deleted record's key row, and in place of a key index the keys' rows
    (``keys_ddl``)."""
    if not sqlite:
        await conn.exec_driver_sql(CHAIN_DDL)
        for ddl in keys_ddl(sqlite=False):
            await conn.exec_driver_sql(ddl)
        return
    if not any(tuple(r)[1] == "seq" for r in await conn.exec_driver_sql(f"PRAGMA table_info({ATTEMPTS})")):
        for name, sql_type in zip(CHAIN_COLUMNS, ("BIGINT", "VARCHAR(64)", "VARCHAR(64)"), strict=True):
            await conn.exec_driver_sql(f"ALTER TABLE {ATTEMPTS} ADD COLUMN {name} {sql_type}")
        await conn.exec_driver_sql(
            f"CREATE UNIQUE INDEX IF NOT EXISTS {ATTEMPTS}_chain_idx ON {ATTEMPTS} (scope, seq)")
    for ddl in keys_ddl(sqlite=True):
        await conn.exec_driver_sql(ddl)
    names = ", ".join(f"'{name}'" for name in OLD_KEY_INDEXES)
    if list(await conn.exec_driver_sql(f"SELECT name FROM sqlite_master WHERE type = 'index' AND name IN ({names})")):
        await conn.exec_driver_sql(KEYS_FILL)
        for name in OLD_KEY_INDEXES:
            await conn.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")


class AttemptLedger:
    """The ledger's verbs over one store's executor: what ``SQLStore`` answers the ``LedgerStore`` protocol with
    (it holds one, ``SQLStore.ledger``). The statements are made on first use (a store that never reads its
    ledger never builds them)."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._chained_scopes: set[str] = set()  # Postgres: scopes whose chain row this store has seen made

    @functools.cached_property
    def sql(self) -> AttemptStatements:
        return AttemptStatements(self._executor.dialect.now)

    @functools.cached_property
    def chain(self) -> Chain:
        return Chain(ATTEMPTS, WRITTEN, self._executor.dialect.now)

    async def write_attempts(self, rows: Sequence[Sequence[Any]]) -> int:
        """Insert ledger entries (each the values of ``WRITTEN``, in order), every text as every store holds it
        (:func:`storable`). If the database refuses the batch for an entry's value, the entries go again one by
        one, so that only the refused ones are lost: returns how many were left out (0: all written). Raises
        ``StoreError`` when the store failed (down, or unusable), nothing written."""
        if not rows:
            return 0
        rows = storable_rows(rows)
        refuses_row = self._executor.dialect.refuses_row
        try:
            await self._write_attempts(rows)
            return 0
        except StoreError as exc:
            if not refuses_row(exc):
                raise
            if len(rows) == 1:
                log.warning("the store refused an entry of the attempt ledger: %s", exc)
                return 1
        left_out, why = 0, None
        for n, row in enumerate(rows):
            try:
                await self._write_attempts([row])
            except StoreError as exc:
                if not refuses_row(exc):  # the store failed meanwhile: the rest is not written either
                    log.warning("writing the attempt ledger's entries one by one stopped: %s", exc)
                    return left_out + len(rows) - n
                left_out += 1
                why = why or exc
        if why is not None:
            log.warning("the store refused %d of %d entries of the attempt ledger (the others were written): %s",
                        left_out, len(rows), why)
        return left_out

    async def _write_attempts(self, rows: Sequence[Sequence[Any]]) -> None:
        """Insert ``rows``, all or none, each placed in its scope's hash chain (``_chain``): the batch handed to
        the driver whole, in one transaction with the chains' heads (Postgres: COPY; SQLite: one hop, the rows
        bound by sqlite3 on aiosqlite's thread, unsynced at ``FULL`` as a claim is). A value that cannot be
        hashed as the store keeps it is refused as the database refuses one (``Dialect.refuses_row``)."""
        dialect, chain, known = self._executor.dialect, self.chain, self._chained_scopes
        sqlite = dialect.name == "sqlite"

        async def write(drv: Any) -> None:
            entries = _chain.prepared(rows)  # (hashed before the heads are locked)
            # A key's row, in the same transaction, where its record may not find it: a refusal's key may have no
            # record (the store was down), and an entry written late may find its record and its row both gone.
            keyed = kept_keys([v for v, _ in entries], time.time() - LATE)
            also = [(_KEEP_KEY[sqlite], keyed)] if keyed else []
            if sqlite:
                await on_thread(drv, _chain.sqlite_append, chain, entries, dialect.claim_unsynced, also,
                                dialect.waiters)
            else:
                await _chain.pg_append(drv, chain, entries, known, also)

        await self._executor.on_driver("writing the attempt ledger", write, body_ran=None)

    async def read_attempts(
        self, *, key: str | None = None, task_id: str | None = None, scope: str | None = None,
        since: float | None = None, limit: int = 1000,
    ) -> list[Attempt]:
        """Entries in the order they happened (``at``, then id): of one key, of one task, or all since ``since``."""
        sql = self.sql
        params: dict[str, Any] = {"scope": scope, "since": since, "limit": limit}
        if key is not None:
            stmt, params["key"] = sql.by_key, key  # (its plan: tests/whitebox/test_ledger.py)
        elif task_id is not None:
            stmt, params["task_id"] = sql.by_task, task_id
        else:
            stmt = sql.since

        if key is not None:
            gone = sql.gone_by_key if scope is None else sql.gone_by_key_in_scope
        elif task_id is not None:
            gone = sql.gone_by_task if scope is None else sql.gone_by_task_in_scope
        else:
            gone = sql.gone_since

        async def run(conn: AsyncConnection) -> list[Attempt]:
            written = [attempt_from_row(r) for r in await conn.execute(stmt, params)]
            derived = [_went_away(r) for r in await conn.execute(gone, params)]
            if not derived:
                return written
            return sorted([*written, *derived], key=lambda e: (e.at, e.id))[:limit]

        return await self._executor.run("reading the attempt ledger", run, body_ran=None)

    async def sweep_attempts(self, batch: int = 1000) -> int:
        """Delete ledger entries past their retention, in short batches of at most ``batch``, paced as the
        records' sweep is (``_sweep``): each scope's chain from its start, the anchor moved where it is cut
        (``_chain.sweep``); then the keys' rows no entry needs any more. Returns how many entries it deleted."""
        deleted = await _chain.sweep(self._executor, self.chain, batch, paced)
        sql = self.sql

        async def keys(size: int) -> int:
            async def one(conn: AsyncConnection) -> int:
                rows = sorted(tuple(r) for r in await conn.execute(sql.expired_keys, {"batch": size}))
                # each row dropped or moved on in the keys' order (see ``kept_keys``), runs of either in one call
                for entries_left, run in itertools.groupby(rows, key=lambda r: bool(r[2])):
                    await conn.execute(sql.keep_key if entries_left else sql.drop_key,
                                       [{"key": r[0], "scope": r[1]} for r in run])
                return len(rows)

            return await self._executor.run("sweeping the ledger's keys", one, body_ran=None, transaction=True)

        await paced(keys, batch)
        return deleted

    async def verify_ledger(self, scope: str | None = None) -> list[ChainCheck]:
        """Walk each scope's hash chain (or ``scope``'s) in one snapshot: what verified, and the first entry
        that was edited, deleted or moved, if any."""
        return await _chain.verify(self._executor, self.chain, scope)

    async def record_details(self, key: str, scope: str | None = None) -> list[RecordDetail]:
        """The records with ``key`` (one per scope that has it), each with its current steps."""
        sql = self.sql

        async def run(conn: AsyncConnection) -> list[RecordDetail]:
            out = []
            for r in list(await conn.execute(sql.detail, {"key": key, "scope": scope})):
                steps = [(s[0], int(s[1]), s[2], s[3]) for s in
                         await conn.execute(sql.steps, {"scope": r[0], "key": r[1], "origin": r[14]})]
                out.append(RecordDetail(
                    r[0], r[1], r[2], r[3], r[4], r[5], int(r[6]), int(r[7]), float(r[8]), float(r[9]),
                    float(r[10]), None if r[11] is None else float(r[11]), r[12], r[13], tuple(steps)))
            return out

        return await self._executor.run("reading the record", run, body_ran=None)

    async def forget(self, scope: str, key: str) -> bool:
        """Delete a record that is not running (and its steps), deliberately: the next call runs again."""
        sql = self.sql

        async def run(conn: AsyncConnection) -> bool:
            gone = bool((await conn.execute(sql.forget, {"scope": scope, "key": key})).rowcount)
            if gone:
                await conn.execute(sql.forget_steps, {"scope": scope, "key": key})
            return gone

        return await self._executor.run("forgetting the record", run, body_ran=None, transaction=True)

    async def task_known(self, task_id: str) -> bool:
        """Whether any record or ledger entry names ``task_id``."""
        sql = self.sql

        async def run(conn: AsyncConnection) -> bool:
            return (await conn.execute(sql.task_known, {"task_id": task_id})).first() is not None

        return await self._executor.run("reading the records", run, body_ran=None)
