"""What a person reads in the console: tasks, a task's records and steps, one record in full.

Read-only statements, off the hot path, through the executor's general path (so a failure is a ``StoreError``
that says what failed). Times are seconds since the epoch by the database's clock (the clock that decides
leases), and each answer carries that clock's ``now`` so ages and live leases are computed against it.

A record is *held* when a person must settle it (``agentguard resolve``): its worker died inside a step or the
body, or its result could not be stored — ``_schema.held_sql``, the condition of the ``unknown`` statement too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from ._schema import (
    FAILED,
    RELEASED,
    RUNNING,
    STARTED,
    STEPS,
    SUCCEEDED,
    TABLE,
    held_body_sql,
    held_sql,
    live_sql,
    not_stored_sql,
)

if TYPE_CHECKING:
    from ._store import SQLStore

HELD = "held"  # not a record state: a record held for a person on an unknown outcome
STATES = (RUNNING, SUCCEEDED, FAILED, RELEASED, HELD)


@dataclass(frozen=True, slots=True)
class TaskRow:
    scope: str
    task_id: str
    operations: int
    first: float  # when its first record was claimed
    last: float  # when one of its records last changed
    states: dict[str, int]  # running, succeeded, failed, released, held: how many records


@dataclass(frozen=True, slots=True)
class StepRow:
    name: str
    seq: int
    state: str  # started or done
    at: float  # when it was last written
    result: str | None  # only read for one record (``record``), never for a task's page


@dataclass(frozen=True, slots=True)
class RecordRow:
    scope: str
    key: str
    task_id: str
    operation: str
    tool: str
    state: str
    attempts: int
    created: float
    updated: float
    lease_until: float | None
    expires: float
    live: bool
    held: bool
    steps: tuple[StepRow, ...]
    # Values: read only when one record is opened (``record``), else None.
    result: str | None = None
    arguments: str | None = None
    audit: str | None = None


async def tasks(
    store: SQLStore, *, scope: str | None = None, state: str | None = None, operation: str | None = None,
    limit: int = 100,
) -> tuple[float, list[TaskRow]]:
    """The tasks, most recently changed first: those with a record in ``state`` (``held``, or a state of the
    records not held) and one whose operation starts with ``operation``, if given."""
    # The clock read once (Postgres' clock_timestamp() is volatile: per row it would be read per row), and the
    # held records found once — those held on a step from the few started steps, the others by a plain
    # predicate — then joined: not a subquery per record. (``_schema.held_kind_sql``, written as a join.)
    clock = f"clock AS (SELECT {store.dialect.now} AS now)"
    held_keys = (
        f"held AS (SELECT c.scope, c.key FROM {TABLE} c JOIN {STEPS} s ON s.scope = c.scope"
        f" AND s.key = c.key AND s.origin = c.origin CROSS JOIN clock WHERE s.state = '{STARTED}'"
        f" AND c.state IN ('{RUNNING}', '{RELEASED}') AND NOT {live_sql('clock.now', 'c.')}"
        f" UNION SELECT c.scope, c.key FROM {TABLE} c WHERE {not_stored_sql('c.')} OR {held_body_sql('c.')})"
    )
    is_held = "h.key IS NOT NULL"
    # a held record counts as held, not as running or released
    counts = ", ".join(f"SUM(CASE WHEN c.state = '{s}' AND h.key IS NULL THEN 1 ELSE 0 END)"
                       for s in (RUNNING, SUCCEEDED, FAILED, RELEASED))
    where: list[str] = []
    having: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    if scope is not None:
        where.append("c.scope = :scope")
        params["scope"] = scope
    if state == HELD:
        having.append(f"SUM(CASE WHEN {is_held} THEN 1 ELSE 0 END) > 0")
    elif state is not None:
        having.append("SUM(CASE WHEN c.state = :state AND h.key IS NULL THEN 1 ELSE 0 END) > 0")
        params["state"] = state
    if operation is not None:  # a prefix, compared exactly on both databases (LIKE's case rules differ)
        having.append("SUM(CASE WHEN substr(c.operation, 1, :oplen) = :op THEN 1 ELSE 0 END) > 0")
        params.update(op=operation, oplen=len(operation))
    stmt = text(
        f"WITH {clock}, {held_keys}"
        f" SELECT c.scope, c.task_id, COUNT(*), MIN(c.created_at), MAX(c.updated_at), {counts},"
        f" SUM(CASE WHEN {is_held} THEN 1 ELSE 0 END), MAX(clock.now) FROM {TABLE} c CROSS JOIN clock"
        " LEFT JOIN held h ON h.scope = c.scope AND h.key = c.key"
        + (" WHERE " + " AND ".join(where) if where else "")
        + " GROUP BY c.scope, c.task_id"
        + (" HAVING " + " AND ".join(having) if having else "")
        + " ORDER BY MAX(c.updated_at) DESC, c.scope, c.task_id LIMIT :limit"
    )
    now = store.dialect.now

    async def run(conn: AsyncConnection) -> tuple[float, list[TaskRow]]:
        rows = list(await conn.execute(stmt, params))
        clock = float(rows[0][10]) if rows else await _now(conn, now)
        names = (RUNNING, SUCCEEDED, FAILED, RELEASED, HELD)
        return clock, [
            TaskRow(r[0], r[1], int(r[2]), float(r[3]), float(r[4]), dict(zip(names, map(int, r[5:10]), strict=True)))
            for r in rows
        ]

    return await store._executor.run("listing tasks", run, body_ran=None)


_RECORD_COLUMNS = ("c.scope, c.key, c.task_id, c.operation, c.tool, c.state, c.attempts, c.created_at, c.updated_at,"
                   " c.lease_until, c.expires_at")


async def task(store: SQLStore, scope: str, task_id: str) -> tuple[float, list[RecordRow]]:
    """A task's records, first claimed first, each with its steps (names and states, never their results)."""
    now = store.dialect.now
    records = text(
        f"SELECT {_RECORD_COLUMNS}, CASE WHEN {live_sql(now, 'c.')} THEN 1 ELSE 0 END,"
        f" CASE WHEN {held_sql(now, 'c.')} THEN 1 ELSE 0 END, c.origin, {now}"
        f" FROM {TABLE} c WHERE c.scope = :scope AND c.task_id = :task_id ORDER BY c.created_at, c.key"
    )
    steps = text(
        f"SELECT s.key, s.name, s.seq, s.state, s.updated_at FROM {STEPS} s JOIN {TABLE} c"
        " ON s.scope = c.scope AND s.key = c.key AND s.origin = c.origin"
        " WHERE c.scope = :scope AND c.task_id = :task_id ORDER BY s.key, s.seq"
    )

    async def run(conn: AsyncConnection) -> tuple[float, list[RecordRow]]:
        params = {"scope": scope, "task_id": task_id}
        rows = list(await conn.execute(records, params))
        by_key: dict[str, list[StepRow]] = {}
        for s in await conn.execute(steps, params):
            by_key.setdefault(s[0], []).append(StepRow(s[1], int(s[2]), s[3], float(s[4]), None))
        clock = float(rows[0][14]) if rows else await _now(conn, now)
        return clock, [_record(r, tuple(by_key.get(r[1], ()))) for r in rows]

    return await store._executor.run("reading a task", run, body_ran=None)


async def record(store: SQLStore, scope: str, key: str) -> tuple[float, RecordRow | None]:
    """One record in full: its values (result, stored arguments, audit) and its steps' results."""
    now = store.dialect.now
    one = text(
        f"SELECT {_RECORD_COLUMNS}, CASE WHEN {live_sql(now, 'c.')} THEN 1 ELSE 0 END,"
        f" CASE WHEN {held_sql(now, 'c.')} THEN 1 ELSE 0 END, c.origin, {now}, c.result, c.arguments, c.audit"
        f" FROM {TABLE} c WHERE c.scope = :scope AND c.key = :key"
    )
    steps = text(
        f"SELECT name, seq, state, updated_at, result FROM {STEPS}"
        " WHERE scope = :scope AND key = :key AND origin = :origin ORDER BY seq"
    )

    async def run(conn: AsyncConnection) -> tuple[float, RecordRow | None]:
        r = (await conn.execute(one, {"scope": scope, "key": key})).first()
        if r is None:
            return await _now(conn, now), None
        found = await conn.execute(steps, {"scope": scope, "key": key, "origin": r[13]})
        rows = tuple(StepRow(s[0], int(s[1]), s[2], float(s[3]), s[4]) for s in found)
        return float(r[14]), _record(r, rows, values=(r[15], r[16], r[17]))

    return await store._executor.run("reading a record", run, body_ran=None)


def _record(r: Any, steps: tuple[StepRow, ...], values: tuple[Any, Any, Any] = (None, None, None)) -> RecordRow:
    return RecordRow(
        scope=r[0], key=r[1], task_id=r[2], operation=r[3], tool=r[4], state=r[5], attempts=int(r[6]),
        created=float(r[7]), updated=float(r[8]), lease_until=None if r[9] is None else float(r[9]),
        expires=float(r[10]), live=bool(r[11]), held=bool(r[12]), steps=steps,
        result=values[0], arguments=values[1], audit=values[2],
    )


async def _now(conn: AsyncConnection, now: str) -> float:
    return float((await conn.execute(text(f"SELECT {now}"))).scalar_one())
