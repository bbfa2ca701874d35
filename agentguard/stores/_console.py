"""What a person reads in the console: tasks, a task's records and steps, one record in full.

Read-only statements, off the hot path, through the executor's general path (so a failure is a ``StoreError``
that says what failed). Times are seconds since the epoch by the database's clock (the clock that decides
leases), and each answer carries that clock's ``now`` so ages and live leases are computed against it.

A record is *held* when a person must settle it (``agentguard resolve``): its worker died inside a step or the
body, or its result could not be stored — ``_schema.held_sql``, the condition of the ``unknown`` statement too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection

from ._decisions import revision
from ._schema import (
    FAILED,
    HELD_STEP,
    RELEASED,
    RUNNING,
    STARTED,
    STEPS,
    SUCCEEDED,
    TABLE,
    held_kind_sql,
    held_sql,
    live_sql,
)

if TYPE_CHECKING:
    from ._store import SQLStore

HELD = "held"  # not a record state: a record held for a person on an unknown outcome
STATES = (RUNNING, SUCCEEDED, FAILED, RELEASED, HELD)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a longer list: its rows, where it starts in the list and how long the list is; ``now``, the
    database clock when it was read."""

    now: float
    total: int
    offset: int
    rows: list[T]


@dataclass(frozen=True, slots=True)
class TaskRow:
    scope: str
    task_id: str
    operations: int
    first: float  # when its first record was claimed
    last: float  # when one of its records last changed
    latest: float  # the latest claim among its records that the list's filters matched (the list's order)
    states: dict[str, int]  # running, succeeded, failed, released, held: how many records


@dataclass(frozen=True, slots=True)
class HeldRow:
    """A record held for a person (``Guard.unknown``'s fields)."""

    scope: str
    key: str
    task_id: str
    operation: str
    step: str | None  # the first started step, for one held on a step
    attempts: int
    age: float  # seconds since its claim
    held: str  # how: one of ``_schema.HELD_KINDS``
    revision: str


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
    fence: int = 0
    held_kind: str = ""  # how it is held (``_schema.HELD_KINDS``), or ""
    # Values: read only when one record is opened (``record``), else None.
    result: str | None = None
    arguments: str | None = None
    audit: str | None = None

    @property
    def step(self) -> str | None:
        """The step a decision settles: the first one started, for a record held on a step."""
        if self.held_kind != HELD_STEP:
            return None
        return next((s.name for s in self.steps if s.state == STARTED), None)

    @property
    def revision(self) -> str:
        """What a person's decision on it is made on (``_decisions``)."""
        return revision(self.fence, self.updated, self.state, self.held_kind, self.step)


def _where(conditions: list[str]) -> str:
    return " WHERE " + " AND ".join(conditions) if conditions else ""


async def tasks(
    store: SQLStore, *, scope: str | None = None, state: str | None = None, operation: str | None = None,
    task: str | None = None, offset: int = 0, limit: int = 100,
) -> Page[TaskRow]:
    """A page of the tasks that have a record matching every filter given — in ``scope``, in ``state``
    (``held``, or a state of the records not held), whose operation starts with ``operation``, of a task whose
    id starts with ``task`` — the latest claim among those records first; with how many tasks match.

    One statement: the page is found first — without a filter on the records' state or operation, from the
    index of (task id, scope, claim time) alone (``_schema``); with one, by one scan of the records — then only
    the page's tasks are read in full, through that index. The clock is read once (Postgres' clock_timestamp()
    is volatile: per row it would be read per row)."""
    now = store.dialect.now
    is_held = held_sql("clock.now", "c.")
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit, "offset": offset}
    if scope is not None:
        where.append("c.scope = :scope")
        params["scope"] = scope
    if task is not None:  # a prefix, compared exactly on both databases (LIKE's case rules differ, and "_")
        where.append("substr(c.task_id, 1, :tlen) = :task")
        params.update(task=task, tlen=len(task))
    if operation is not None:
        where.append("substr(c.operation, 1, :oplen) = :op")
        params.update(op=operation, oplen=len(operation))
    if state == HELD:
        where.append(is_held)
    elif state is not None:  # a held record counts as held, not as running or released
        where.append(f"c.state = :state AND NOT {is_held}")
        params["state"] = state
    matching = (f"FROM {TABLE} c" + (" CROSS JOIN clock" if state is not None else "") + _where(where)
                + " GROUP BY c.task_id, c.scope")
    counts = ", ".join(f"SUM(CASE WHEN state = '{s}' AND h = 0 THEN 1 ELSE 0 END)"
                       for s in (RUNNING, SUCCEEDED, FAILED, RELEASED))
    stmt = text(
        f"WITH clock AS (SELECT {now} AS now),"
        f" page AS (SELECT c.scope, c.task_id, MAX(c.created_at) AS latest, COUNT(*) OVER () AS total {matching}"
        " ORDER BY latest DESC, c.scope, c.task_id LIMIT :limit OFFSET :offset),"
        " recs AS (SELECT p.scope, p.task_id, p.total, p.latest, c.state, c.created_at, c.updated_at,"
        f" CASE WHEN {is_held} THEN 1 ELSE 0 END AS h FROM page p JOIN {TABLE} c ON c.scope = p.scope"
        " AND c.task_id = p.task_id CROSS JOIN clock)"
        f" SELECT scope, task_id, MAX(total), MAX(latest), COUNT(*), MIN(created_at), MAX(updated_at), {counts},"
        " SUM(h), (SELECT now FROM clock) FROM recs GROUP BY scope, task_id ORDER BY MAX(latest) DESC, scope, task_id"
    )
    count = text(f"WITH clock AS (SELECT {now} AS now) SELECT COUNT(*) FROM (SELECT c.scope {matching}) AS m")

    async def run(conn: AsyncConnection) -> Page[TaskRow]:
        rows = list(await conn.execute(stmt, params))
        if not rows:  # (past the last page, or nothing matches: how many there are, and the clock)
            total = int((await conn.execute(count, params)).scalar_one()) if offset else 0
            return Page(await _now(conn, now), total, offset, [])
        names = (RUNNING, SUCCEEDED, FAILED, RELEASED, HELD)
        return Page(float(rows[0][12]), int(rows[0][2]), offset, [
            TaskRow(r[0], r[1], int(r[4]), float(r[5]), float(r[6]), float(r[3]),
                    dict(zip(names, map(int, r[7:12]), strict=True)))
            for r in rows
        ])

    return await store.person_read("listing tasks", run)


async def held(store: SQLStore, *, scope: str | None = None, offset: int = 0, limit: int = 20) -> Page[HeldRow]:
    """A page of the records held for a person, the latest change first (``SQLStore.unknown``)."""
    rows = await store.unknown(scope=scope, limit=limit, offset=offset)
    total = int(rows[0][11]) if rows else 0
    return Page(0.0, total, offset, [
        HeldRow(r[0], r[1], r[2], r[3], r[4], int(r[5]), float(r[6]), r[7], revision(r[9], r[10], r[8], r[7], r[4]))
        for r in rows
    ])


_RECORD_COLUMNS = ("c.scope, c.key, c.task_id, c.operation, c.tool, c.state, c.attempts, c.created_at, c.updated_at,"
                   " c.lease_until, c.expires_at")


def _computed(now: str) -> str:
    """The columns after ``_RECORD_COLUMNS``: live, held, its origin, the clock, its fence, how it is held."""
    return (f"CASE WHEN {live_sql(now, 'c.')} THEN 1 ELSE 0 END, CASE WHEN {held_sql(now, 'c.')} THEN 1 ELSE 0 END,"
            f" c.origin, {now}, c.fence, {held_kind_sql(now, 'c.')}")


async def task(store: SQLStore, scope: str, task_id: str, *, offset: int = 0, limit: int = 100) -> Page[RecordRow]:
    """A page of a task's records, first claimed first, each with its steps (names and states, never their
    results), and how many records the task has."""
    now = store.dialect.now
    records = text(
        f"WITH clock AS (SELECT {now} AS now) SELECT {_RECORD_COLUMNS}, {_computed('clock.now')}, COUNT(*) OVER ()"
        f" FROM {TABLE} c CROSS JOIN clock WHERE c.scope = :scope AND c.task_id = :task_id"
        " ORDER BY c.created_at, c.key LIMIT :limit OFFSET :offset"
    )
    steps = text(
        f"SELECT s.key, s.origin, s.name, s.seq, s.state, s.updated_at FROM {STEPS} s"
        " WHERE s.scope = :scope AND s.key IN :keys ORDER BY s.key, s.seq"
    ).bindparams(bindparam("keys", expanding=True))
    count = text(f"SELECT COUNT(*) FROM {TABLE} c WHERE c.scope = :scope AND c.task_id = :task_id")

    async def run(conn: AsyncConnection) -> Page[RecordRow]:
        params = {"scope": scope, "task_id": task_id, "limit": limit, "offset": offset}
        rows = list(await conn.execute(records, params))
        if not rows:  # (past the last page, or no such task: how many records it has, and the clock)
            total = int((await conn.execute(count, params)).scalar_one()) if offset else 0
            return Page(await _now(conn, now), total, offset, [])
        origins = {r[1]: r[13] for r in rows}
        by_key: dict[str, list[StepRow]] = {}
        for s in await conn.execute(steps, {"scope": scope, "keys": list(origins)}):
            if s[1] == origins[s[0]]:  # (steps of an earlier origin belong to an operation that is over)
                by_key.setdefault(s[0], []).append(StepRow(s[2], int(s[3]), s[4], float(s[5]), None))
        return Page(float(rows[0][14]), int(rows[0][17]), offset,
                    [_record(r, tuple(by_key.get(r[1], ()))) for r in rows])

    return await store.person_read("reading a task", run)


async def record(store: SQLStore, scope: str, key: str) -> tuple[float, RecordRow | None]:
    """One record in full: its values (result, stored arguments, audit) and its steps' results."""
    now = store.dialect.now
    one = text(
        f"SELECT {_RECORD_COLUMNS}, {_computed(now)}, c.result, c.arguments, c.audit"
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
        return float(r[14]), _record(r, rows, values=(r[17], r[18], r[19]))

    return await store._executor.run("reading a record", run, body_ran=None)


def _record(r: Any, steps: tuple[StepRow, ...], values: tuple[Any, Any, Any] = (None, None, None)) -> RecordRow:
    return RecordRow(
        scope=r[0], key=r[1], task_id=r[2], operation=r[3], tool=r[4], state=r[5], attempts=int(r[6]),
        created=float(r[7]), updated=float(r[8]), lease_until=None if r[9] is None else float(r[9]),
        expires=float(r[10]), live=bool(r[11]), held=bool(r[12]), steps=steps, fence=int(r[15]),
        held_kind=r[16] or "", result=values[0], arguments=values[1], audit=values[2],
    )


async def _now(conn: AsyncConnection, now: str) -> float:
    return float((await conn.execute(text(f"SELECT {now}"))).scalar_one())
