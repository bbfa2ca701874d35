"""Every statement the store sends, written once and built once per store, and compiled once per driver
(:func:`compiler`: the one place a statement becomes the driver's SQL and positional arguments).

The claim's new row is described once (``NEW_ROW``, ``CLAIM_PARAMS``): the claim statement and its form for
many callers are both generated from it, as the read's columns are generated from the row layout
(``_schema.ROW``). A Postgres store made by an earlier version also holds a read-or-claim function
(``agentguard_calls_claim_v2``) that nothing calls any more: harmless, left in place.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import TextClause, text

from ._schema import (
    FAILED,
    HELD_BODY,
    HELD_LEASE,
    HELD_NOT_STORED,
    HELD_STEP,
    RELEASED,
    RUNNING,
    STARTED,
    STEPS,
    SUCCEEDED,
    TABLE,
    UNBOUND,
    held_body_sql,
    held_kind_sql,
    live_sql,
    not_stored_sql,
    select_list,
    started_step_sql,
)

# The claim's parameters, with their Postgres types (the arrays of the claim for many callers).
CLAIM_PARAMS = (
    ("scope", "text"), ("key", "text"), ("task_id", "text"), ("operation", "text"), ("fingerprint", "text"),
    ("arg_hashes", "text"), ("fence", "bigint"), ("tool", "text"), ("arguments", "text"), ("owner", "text"),
    ("lease", "float8"), ("retention", "float8"), ("audit", "text"),
)

# The row a claim inserts: (column, value), each value written with {p} before a parameter's name and {now}
# for the database clock. A new row's origin is its first fence.
NEW_ROW = (
    ("scope", "{p}scope"), ("key", "{p}key"), ("task_id", "{p}task_id"), ("operation", "{p}operation"),
    ("fingerprint", "{p}fingerprint"), ("arg_hashes", "{p}arg_hashes"), ("state", f"'{RUNNING}'"),
    ("fence", "{p}fence"), ("origin", "{p}fence"), ("tool", "{p}tool"), ("arguments", "{p}arguments"),
    ("attempts", "1"), ("owner", "{p}owner"), ("lease_until", "{now} + {p}lease"), ("created_at", "{now}"),
    ("updated_at", "{now}"), ("expires_at", "{now} + {p}retention"), ("audit", "{p}audit"),
)

# Postgres: the claims of many callers in one statement (``Executor.one``'s ``many``), their parameters as
# arrays, the rows inserted in the order of their keys: two such statements that share keys lock them in the same
# order, so neither waits for the other's key while holding one the other waits for (a deadlock).
# At most GATHER_MAX claims in one statement: a longer one holds its callers longer, and while every connection
# was busy with long ones (256 claims each), a caller that met an empty line cycled alone on a connection,
# making many times the median's calls (tests/whitebox/test_load.py's fairness; docs/benchmarks.md).
GATHER_MAX = 16


class Many:
    """A statement's form for many callers (``sql``: the driver's own, ``$1``..; ``names``: its parameters, in
    order), and each caller's answer from the rows: the row its own statement would have returned, or None
    (:meth:`answers`). Sent in one round trip and one transaction, as one of two kinds:

    - one statement over the callers' parameters as arrays (``pipelined`` False: the dialect's ``fetch_rows``);
    - the same statement once per caller, all in one pipeline (``pipelined``: the dialect's ``fetch_each``,
      asyncpg's ``fetchmany``), each planned as the single statement is."""

    __slots__ = ("names", "sql")
    pipelined = False

    def __init__(self, sql: str, names: tuple[str, ...]) -> None:
        self.sql = sql
        self.names = names

    def args(self, params: Sequence[dict[str, Any]]) -> Sequence[Sequence[Any]]:
        """What the dialect's fetch takes: one array per parameter (a pipelined form: one row per caller)."""
        return tuple([p[name] for p in params] for name in self.names)

    def joins(self, gathered: Iterable[dict[str, Any]], params: dict[str, Any]) -> bool:
        """Whether a caller with ``params`` may go in one statement with callers whose parameters are
        ``gathered`` (else it goes in the next)."""
        return True

    def answers(self, rows: Sequence[Sequence[Any]], params: Sequence[dict[str, Any]]) -> list[tuple[Any, ...] | None]:
        raise NotImplementedError


class Claims(Many):
    """Claims for many callers: rows of (owner, fence, ...). A caller whose owner token came back claimed its key
    (its fence, as the single statement's ``RETURNING fence``); the others found it taken (None, as that
    statement's no row). The same key twice: the insert's conflict decides, as between two statements. An owner
    token at most once a statement: it is how a row finds its caller (the machine's tokens are each claim's own;
    a caller of the store that passes one twice has the second claim go in the next statement, answered as its
    own statement would be, never with another's fence)."""

    __slots__ = ()

    def joins(self, gathered: Iterable[dict[str, Any]], params: dict[str, Any]) -> bool:
        owner = params["owner"]
        return not any(p["owner"] == owner for p in gathered)

    def answers(self, rows: Sequence[Sequence[Any]], params: Sequence[dict[str, Any]]) -> list[tuple[Any, ...] | None]:
        claimed = {row[0]: row[1] for row in rows}
        return [(claimed[p["owner"]],) if p["owner"] in claimed else None for p in params]


class Fenced(Many):
    """A fenced write for many callers, each caller's own statement in one pipeline: rows of (scope, key, fence),
    one per record written. A caller whose record came back with its own fence wrote (its fence, as the single
    statement's ``RETURNING fence``); the others wrote nothing (None), as their statements would not have. A key
    at most once a pipeline: its statements share one transaction, so a second write of a key would find the
    first's, where its own statement would not have (the machine never makes two such writes at once; a second
    one goes in the next pipeline)."""

    __slots__ = ()
    pipelined = True

    def args(self, params: Sequence[dict[str, Any]]) -> Sequence[Sequence[Any]]:
        return [tuple(p[name] for name in self.names) for p in params]

    def joins(self, gathered: Iterable[dict[str, Any]], params: dict[str, Any]) -> bool:
        scope, key = params["scope"], params["key"]
        return not any(p["key"] == key and p["scope"] == scope for p in gathered)

    def answers(self, rows: Sequence[Sequence[Any]], params: Sequence[dict[str, Any]]) -> list[tuple[Any, ...] | None]:
        written = {(row[0], row[1], row[2]) for row in rows}
        return [(p["fence"],) if (p["scope"], p["key"], p["fence"]) in written else None for p in params]


# The columns a claim's later writes need that its insert does not name (the completion's result), returned by
# every claim statement so that a store which lost one refuses the claim before the body runs.
CHECKED = "result"


def _arrays(params: Sequence[tuple[str, str]]) -> tuple[tuple[str, ...], str]:
    """The names of a statement's parameters, and their arrays as ``unnest``'s arguments (Postgres)."""
    return (tuple(name for name, _ in params),
            ", ".join(f"${i}::{pg_type}[]" for i, (_, pg_type) in enumerate(params, 1)))


def gathered_claim(now: str, unsynced: bool, checked: str = CHECKED) -> Many:
    """The claim statement for many callers at once (Postgres), generated from ``NEW_ROW`` as the single one is."""
    names, arrays = _arrays(CLAIM_PARAMS)
    columns = ", ".join(name for name, _ in NEW_ROW)
    values = ", ".join(value.format(p="v.", now=now) for _, value in NEW_ROW)
    return Claims(
        f"INSERT INTO {TABLE} ({columns}) SELECT {values} FROM unnest({arrays}) AS v({', '.join(names)})"
        f" ORDER BY v.scope, v.key ON CONFLICT (scope, key) DO NOTHING RETURNING owner, fence, {checked}"
        + (f", {UNSYNCED}" if unsynced else ""),
        names,
    )


def _insert(now: str, p: str) -> str:
    columns = ", ".join(name for name, _ in NEW_ROW)
    values = ", ".join(value.format(p=p, now=now) for _, value in NEW_ROW)
    return f"INSERT INTO {TABLE} ({columns}) VALUES ({values}) ON CONFLICT (scope, key) DO NOTHING"


# The completion: what it writes, and the record it writes it to — the claim's (its fence), running, or completed
# already with the same outcome (a recording redone after a cancellation finds its own earlier write) — each with
# {p} before a parameter's name, {t} before a column's, {now} for the database clock and {greatest} for the
# dialect's larger of two values. The completion statement and its form for many callers (the same statement, with
# the driver's placeholders in this order) are both generated from them.
#
# Its expiry only moves forward: to retention from now, where the claim's is earlier (a claim writes a margin past
# the retention: ``_machine.claim_retention``). A body that ends within that margin leaves the expiry as the claim
# wrote it, so the completion changes no indexed column and Postgres writes it as a HOT update, in the record's
# page alone, no index touched (docs/benchmarks.md, "The completion touches no index"). Either way a record is
# kept at least its retention after its outcome.
COMPLETE_PARAMS = ("scope", "key", "fence", "state", "result", "retention", "audit")
COMPLETED = (("state", "{p}state"), ("result", "{p}result"), ("lease_until", "NULL"), ("updated_at", "{now}"),
             ("expires_at", "{greatest}({t}expires_at, {now} + {p}retention)"),
             ("audit", "COALESCE({p}audit, {t}audit)"))
COMPLETES = ("{t}scope = {p}scope AND {t}key = {p}key AND {t}fence = {p}fence"
             f" AND ({{t}}state = '{RUNNING}' OR ({{t}}state = {{p}}state AND {{t}}result = {{p}}result))")


def _completion(now: str, greatest: str, p: str, t: str) -> tuple[str, str]:
    """The completion's SET list and its WHERE, with ``p`` before parameters and ``t`` before columns."""
    sets = (f"{column} = {value.format(p=p, t=t, now=now, greatest=greatest)}" for column, value in COMPLETED)
    return ", ".join(sets), COMPLETES.format(p=p, t=t)


def gathered_complete(now: str, greatest: str, announce: str | None) -> Many:
    """The completion for many callers at once (Postgres): the single completion, generated from ``COMPLETED``
    and ``COMPLETES`` as it is, returning (scope, key, fence) for the record written, and, where the store
    announces, each watched one announced; sent once per caller, in one pipeline (one round trip, one commit).

    Each caller's statement names one record by its key, so it is planned through the primary key whatever the
    planner knows of the table (tests/whitebox/test_key_plans.py). One ``UPDATE ... FROM unnest(...)`` was not:
    planned generically on a small table without statistics (a new store), it joined the callers to the table by
    hashing a sequential scan of it, and a prepared statement keeps its plan for the connection's life: 5.5 ms a
    statement at 30,000 records, a burst's throughput a quarter of a raw pool's (docs/benchmarks.md).

    Its rows need no order: a statement locks only the record whose fence its caller holds, so two pipelines
    wait for each other only where each holds a record the other's callers think theirs (a takeover crossing two
    stale workers' completions both ways at once); Postgres then aborts one after a second, and its callers are
    answered one by one (``Executor._send_gathered``)."""
    names = COMPLETE_PARAMS
    sets, where = _completion(now, greatest, ":", "")
    update = f"UPDATE {TABLE} SET {sets} WHERE {where} RETURNING scope, key, fence"
    if announce is not None:
        update = f"WITH done AS ({update}, watched) SELECT scope, key, fence, {_announcing(announce)} FROM done"
    # (the driver's own placeholders for the named ones, as the dialect compiles a statement; never a cast's ::)
    return Fenced(re.sub(r"(?<!:):([a-z_]+)\b", lambda m: f"${names.index(m.group(1)) + 1}", update), names)


# Postgres: whether a waiter in some process listens for the record's outcome (see _listen). Added to a table
# made before it existed, without locking the table when it is there already.
WATCHED_COLUMN = "watched boolean NOT NULL DEFAULT false"
# The table is found as the ALTER finds it, through the search path (``current_schema()`` names the path's first
# schema that exists, which may not be the one the table is in).
WATCHED_DDL = f"""
DO $ddl$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('{TABLE}') AND attname = 'watched'
                 AND NOT attisdropped) THEN
    ALTER TABLE {TABLE} ADD COLUMN {WATCHED_COLUMN};
  END IF;
END $ddl$"""


# Postgres, when asked (``pg_claim_unsynced``): the claim's transaction commits without waiting for its WAL to
# reach disk. The completion's commit is synced and flushes every earlier WAL record, the claim's included; a
# server crash between the two loses only the claim, and the retry runs the body again with the same downstream
# key, as a takeover after a worker's crash does. Safe only where the provider honours that key.
UNSYNCED = "set_config('synchronous_commit', 'off', true)"


def _announcing(channel: str) -> str:
    """A column of a written record's (``watched``, ``scope``, ``key``): announced on ``channel`` if a waiter
    watches it."""
    return (f"CASE WHEN watched THEN CAST(pg_notify('{channel}', CAST(json_build_array(scope, key) AS text)) AS text)"
            " END")


def announced(update: str, channel: str) -> str:
    """``update`` (an UPDATE ... RETURNING fence) that also announces the record on ``channel`` if a waiter
    watches it: the notification is sent when the statement commits, and only then."""
    return f"WITH done AS ({update}, watched, scope, key) SELECT fence, {_announcing(channel)} FROM done"


class Statements:
    """The store's statements, for one database clock (``now``, the dialect's SQL for seconds since the
    epoch). ``announce``: the channel on which completions and releases of watched records are announced (Postgres),
    and the statement that marks a record watched. ``unsynced_claim``: a claim's (and a takeover's) transaction
    commits with ``synchronous_commit`` off (Postgres; see ``UNSYNCED``). ``gather``: also the claim and the
    completion for many callers at once (``claim_many``, ``complete_many``, Postgres). ``row_id``,
    ``rows_by_id``: the dialect's physical row address and its test of membership in a sub-select
    (``Dialect.rows_by_id``); ``greatest``: its two-argument maximum (``Dialect.greatest``)."""

    def __init__(
        self, now: str, *, announce: str | None = None, unsynced_claim: bool = False, gather: bool = False,
        row_id: str = "rowid", rows_by_id: str = "rowid IN ({})", greatest: str = "max",
    ) -> None:
        live = live_sql(now)
        where_fenced = "scope = :scope AND key = :key AND fence = :fence"
        # The claim returns, beside the fence, every column a later write of the claim needs that the insert does
        # not name (``CHECKED``): a store changed under a running guard (a column dropped by a migration gone
        # wrong) refuses the claim, before the body runs, rather than the completion after it.
        checked = CHECKED + (", watched" if announce is not None else "")
        self.claim = text(f"{_insert(now, ':')} RETURNING fence, {checked}"
                          + (f", {UNSYNCED}" if unsynced_claim else ""))
        self.claim_many = gathered_claim(now, unsynced_claim, checked) if gather else None
        self.complete_many = gathered_complete(now, greatest, announce) if gather else None
        self.read = text(f"SELECT {select_list(now)} FROM {TABLE} WHERE scope = :scope AND key = :key")
        # A takeover needs the fence it saw (so exactly one taker wins) and a record that is not live:
        # released or lease expired (reset = 0: the same operation goes on, with its steps), or past retention
        # by the database clock now (reset = 1: it restarts as a new operation, with a new origin). The caller's
        # reset comes from an earlier read, so the statement checks it again: a completed record is only ever
        # restarted, never continued (model/agentguard.pml found a taker stalled between its read and this
        # statement continuing a completed, expired operation with that operation's steps).
        self.take_over = text(
            f"UPDATE {TABLE} SET fence = fence + 1, state = '{RUNNING}', owner = :owner,"
            f" lease_until = {now} + :lease, updated_at = {now}, expires_at = {now} + :retention,"
            " attempts = CASE WHEN :reset = 1 THEN 1 ELSE attempts + 1 END,"
            f" created_at = CASE WHEN :reset = 1 THEN {now} ELSE created_at END,"
            " fingerprint = :fingerprint, arg_hashes = :arg_hashes, task_id = :task_id,"
            " operation = :operation, result = NULL, audit = COALESCE(:audit, audit), tool = :tool,"
            " arguments = COALESCE(:arguments, arguments),"
            " origin = CASE WHEN :reset = 1 THEN fence + 1 ELSE origin END"
            f" WHERE {where_fenced} AND NOT {live} AND CASE WHEN :reset = 1 THEN expires_at < {now}"
            f" ELSE state IN ('{RUNNING}', '{RELEASED}') END"
            " RETURNING fence, origin" + (f", {UNSYNCED}" if unsynced_claim else "")
        )
        # A released record keeps binding its arguments (a body that ran and raised: the provider may have seen
        # them), unless its body never started (UNBOUND: a claim undone while it was made, a body that said so):
        # then the next call runs with its own. ``result`` keeps what the body raised, for the refusal's text.
        self.release_owned = text(
            f"UPDATE {TABLE} SET state = '{RELEASED}', lease_until = NULL, updated_at = {now},"
            f" expires_at = {now} + :retention, fingerprint = '{UNBOUND}' WHERE scope = :scope AND key = :key"
            f" AND owner = :owner AND state = '{RUNNING}' RETURNING fence"
        )
        self.renew = text(
            f"UPDATE {TABLE} SET lease_until = {now} + :lease, updated_at = {now}"
            f" WHERE {where_fenced} AND state = '{RUNNING}' RETURNING fence"
        )
        # Both are idempotent for the fence that holds the claim (a recording redone after a cancellation
        # finds its own earlier write), and refuse any other fence.
        sets, completes = _completion(now, greatest, ":", "")
        complete = f"UPDATE {TABLE} SET {sets} WHERE {completes} RETURNING fence"
        release = (
            f"UPDATE {TABLE} SET state = '{RELEASED}', lease_until = NULL, updated_at = {now},"
            f" expires_at = {now} + :retention, audit = COALESCE(:audit, audit), result = :raised,"
            f" fingerprint = CASE WHEN :bound = 1 THEN fingerprint ELSE '{UNBOUND}' END WHERE {where_fenced}"
            f" AND state IN ('{RUNNING}', '{RELEASED}') RETURNING fence"
        )
        self.watch: TextClause | None = None
        if announce is not None:
            complete, release = announced(complete, announce), announced(release, announce)
            self.release_owned = text(announced(str(self.release_owned), announce))
            # Marked by a waiter's process once it listens; never unmarked (an extra announcement is harmless).
            self.watch = text(
                f"UPDATE {TABLE} SET watched = true WHERE scope = :scope AND key = :key AND state = '{RUNNING}'"
                " RETURNING fence"
            )
        self.complete, self.release = text(complete), text(release)
        # Bounded batches, oldest first; the outer predicate is re-checked on rows changed meanwhile (a takeover
        # between the sub-select and the delete refreshes expires_at, so it is not deleted). The plan must not
        # depend on the planner's guess of how many records are expired (tests/stores/test_sweep_plans.py):
        # - the clock is read once per statement, as a sub-select: compared with a volatile clock call, Postgres
        #   cannot use the expires_at index at all;
        # - ORDER BY expires_at: the index's order serves the LIMIT, so the index is the plan whatever the guess
        #   (with none, Postgres guesses a third of the table; a scan that stops after LIMIT of those looked
        #   cheaper, and an empty sweep read all 300,000 rows of a table to find none);
        # - the rows found are deleted by their address (a TID scan on Postgres), never by a join on
        #   (scope, key), which Postgres hashed against every expired record: each batch of 1,000 read all of them.
        once = f"(SELECT {now})"
        dead = f"expires_at < {once} AND NOT (state = '{RUNNING}' AND lease_until > {once})"
        batch = f"SELECT {row_id} FROM {TABLE} WHERE {dead} ORDER BY expires_at LIMIT :batch"
        self.sweep = text(f"DELETE FROM {TABLE} WHERE {rows_by_id.format(batch)} AND {dead}")
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
        # -- an operator's view and settling of operations held for a person (``_schema.held_kind_sql``): a
        #    worker died inside a step or the body, or the body's result could not be stored.
        # One row per held record, newest change first, with how many there are (the last column): those held on
        # a step from the few started steps (each with the first one started: the step a decision settles), the
        # others by a plain predicate — two scans with the clock read once, not a subquery per record (a
        # Postgres store of 400,000 records answered in 0.3 s so, in 0.05 s this way: benchmarks/console_reads).
        # Each row carries what a record's revision is made of (``_decisions``): state, fence, last change.
        clock = f"clock AS (SELECT {now} AS now)"
        in_scope = "(CAST(:scope AS VARCHAR) IS NULL OR c.scope = :scope)"
        self.unknown = text(
            f"WITH {clock} SELECT scope, key, task_id, operation, step, attempts, age, kind, state, fence, updated_at,"
            " COUNT(*) OVER () FROM ("
            f"SELECT c.scope, c.key, c.task_id, c.operation, s.name AS step, c.attempts, clock.now - c.created_at"
            f" AS age, '{HELD_STEP}' AS kind, c.state, c.fence, c.updated_at FROM {STEPS} s JOIN {TABLE} c"
            " ON c.scope = s.scope AND c.key = s.key AND c.origin = s.origin CROSS JOIN clock"
            f" WHERE s.state = '{STARTED}' AND c.state IN ('{RUNNING}', '{RELEASED}')"
            f" AND NOT {live_sql('clock.now', 'c.')} AND {in_scope} AND NOT EXISTS (SELECT 1 FROM {STEPS} e"
            f" WHERE e.scope = s.scope AND e.key = s.key AND e.origin = s.origin AND e.state = '{STARTED}'"
            " AND e.seq < s.seq)"
            f" UNION ALL SELECT c.scope, c.key, c.task_id, c.operation, NULL, c.attempts, clock.now - c.created_at,"
            f" CASE WHEN {not_stored_sql('c.')} THEN '{HELD_NOT_STORED}' ELSE '{HELD_BODY}' END, c.state, c.fence,"
            f" c.updated_at FROM {TABLE} c CROSS JOIN clock WHERE ({not_stored_sql('c.')}"
            f" OR ({held_body_sql('c.')} AND NOT {started_step_sql('c.')})) AND {in_scope}"
            ") AS h ORDER BY updated_at DESC, scope, key LIMIT :limit OFFSET :offset"
        )
        # A caller whose key cannot reach the provider found the record's worker gone inside the body: marked so
        # for a person (``_schema.HELD_LEASE``), nothing else changed — the fence stays, so a worker that was only
        # stalled may renew its lease and record its outcome.
        self.hold = text(
            f"UPDATE {TABLE} SET lease_until = {HELD_LEASE} WHERE {where_fenced} AND state = '{RUNNING}'"
            f" AND lease_until <= {now} RETURNING fence"
        )
        # A record held on its body (its worker died inside it, or its result could not be stored), settled as a
        # person says: a result recorded in its place, or released so that its next call runs it again.
        # (Its columns named with the table's: inside the started steps' sub-select, a bare ``scope`` is the
        # step's own, and every started step of the store counted as this record's.)
        body_held = (f"scope = :scope AND key = :key AND {held_kind_sql(now, f'{TABLE}.')}"
                     f" IN ('{HELD_BODY}', '{HELD_NOT_STORED}')")
        self.settle = text(
            f"UPDATE {TABLE} SET state = '{SUCCEEDED}', result = :result, lease_until = NULL, updated_at = {now},"
            f" expires_at = {now} + :retention WHERE {body_held} RETURNING fence"
        )
        self.release_held = text(
            f"UPDATE {TABLE} SET state = '{RELEASED}', result = NULL, lease_until = NULL, updated_at = {now},"
            f" expires_at = {now} + :retention WHERE {body_held} RETURNING fence"
        )
        # A started step of the record's current origin: recorded done (held by nobody), or cleared so the
        # next attempt runs it again.
        current_origin = f"SELECT origin FROM {TABLE} WHERE scope = :scope AND key = :key"
        self.resolve_step = text(
            f"UPDATE {STEPS} SET state = :state, result = :result, updated_at = {now}"
            f" WHERE scope = :scope AND key = :key AND name = :name AND state = '{STARTED}'"
            f" AND origin = ({current_origin} AND NOT {live})"
        )
        self.retry_step = text(
            f"DELETE FROM {STEPS} WHERE scope = :scope AND key = :key AND origin = ({current_origin})"
            f" AND name = :name AND state = '{STARTED}'"
        )
        self.abandon = text(
            f"UPDATE {TABLE} SET state = '{FAILED}', result = :result, lease_until = NULL, updated_at = {now},"
            f" expires_at = {now} + :retention WHERE scope = :scope AND key = :key AND ((NOT {live}"
            f" AND state IN ('{RUNNING}', '{RELEASED}')) OR {not_stored_sql()}) RETURNING fence"
        )
        # A person's decision (``_decisions``) first locks the record: a write to its row, which every worker's
        # write to the record waits for (a step's too: its transaction begins with one). Then it reads what the
        # record's revision is made of, and the steps of its origin (``load_steps``).
        self.lock_record = text(f"UPDATE {TABLE} SET updated_at = updated_at WHERE scope = :scope AND key = :key")
        self.version = text(
            f"SELECT c.state, c.fence, c.updated_at, {held_kind_sql(now, 'c.')}, CASE WHEN {live_sql(now, 'c.')}"
            f" THEN 1 ELSE 0 END, c.attempts, c.result, c.origin FROM {TABLE} c WHERE c.scope = :scope AND c.key = :key"
        )
        # A step settled by a person is a change of its record: its last change, and so its revision, moves on.
        self.touch = text(f"UPDATE {TABLE} SET updated_at = {now} WHERE scope = :scope AND key = :key")
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
            " AND (CAST(:state AS VARCHAR) IS NULL OR state = :state)"
            " ORDER BY updated_at DESC LIMIT :limit"
        )


Compiled = tuple[str, Callable[[dict[str, Any]], Sequence[Any]]]


def compiler(dialect: Any) -> Callable[[Any], Compiled]:
    """The store's statements for one driver (``dialect``: SQLAlchemy's dialect of it): each statement's SQL and a
    getter of its positional arguments from the named parameters, compiled once and kept (by the statement's
    identity: a store's statements live as long as the store)."""
    memo: dict[int, Compiled] = {}

    def compiled(stmt: Any) -> Compiled:
        found = memo.get(id(stmt))
        if found is None:
            c = stmt.compile(dialect=dialect)
            names = tuple(c.positiontup or ())
            getter = operator.itemgetter(*names) if len(names) > 1 else (lambda p: tuple(p[n] for n in names))
            found = memo[id(stmt)] = (c.string, getter)
        return found

    return compiled
