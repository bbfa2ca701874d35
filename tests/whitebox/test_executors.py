"""Every executor of the store's hot statements and claim plans, against the general path: statement by statement
and plan by plan, on the run's backend (SQLite or a real Postgres).

An executor runs statements; none decides (``stores/_claims.py``, ``stores/_verbs.py``). So each is held to the
general path — SQLAlchemy's connection, ``conn.execute(stmt, params).first()`` through ``Executor.run`` — on the
same statements with the same parameters, each on keys of its own in the same states:

- ``lane``: ``Executor.one``, the statement straight to the driver (asyncpg; aiosqlite's thread, in one hop), and
  ``Executor.claim`` for a plan (Postgres: statement by statement; SQLite: the rest of it in one hop);
- ``at once`` (SQLite): ``DirectSQLite.now`` on the event loop's own thread, which never waits, and a plan made
  there as far as it can be (``advance_now``), the rest handed on to the lane at the statement it stopped at;
- ``thread``: a sync tool's own thread (``DirectSQLite`` over stdlib ``sqlite3``, ``DirectPostgres`` over psycopg).

The database clock is the store's test seam (a one-row table), so every row, its lease and its ttl included,
compares exactly. The plans themselves, sans I/O, are checked against scripted rows: every path through each,
the vanished record included. ``tests/whitebox/test_stateful_store.py`` drives each executor's verbs through random
interleavings against the protocol's model.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from agentguard.stores import Record, SQLStore
from agentguard.stores._claims import TURNS, Ask, Claimed, InsertFirst, Plan, ReadFirst, arun, run
from agentguard.stores._direct import BUSY_NOW, NOT_NOW, DirectSQLite, NotNow
from agentguard.stores._direct_pg import DirectPostgres
from agentguard.stores._verbs import asks

from conftest import BACKEND

pytestmark = pytest.mark.anyio

CLOCK_TABLE = "agentguard_test_clock"
CLOCK = f"(SELECT t FROM {CLOCK_TABLE})"
NOW = 1_000_000.0
Fetch = Callable[[Ask, dict[str, Any]], Awaitable[Any]]


# -- the plans, sans I/O -------------------------------------------------------------------------------------

READ, CLAIM = Ask("reading", "read", writes=False), Ask("claiming", "claim", claims=True)
ROW = ("running", 7, "f", "{}", None, 1, "o", "t", "op", 1, 0, 30.0, 7)  # a record's row (``_schema.ROW``)


def _scripted(plan: Callable[..., Any], rows: list[Any]) -> tuple[Claimed, list[str]]:
    """``plan`` run against ``rows``, one per statement it asks: its answer, and the statements it asked."""
    asked: list[str] = []
    answers = iter(rows)

    def fetch(ask: Ask) -> Any:
        asked.append(ask.stmt)
        return next(answers)

    got = run(plan(READ, CLAIM, {"scope": "s", "key": "k"}), fetch)
    assert next(answers, "none left") == "none left", "the plan asked fewer statements than scripted"
    return got, asked


@pytest.mark.storeless
def test_insert_first_decides_by_the_insert_and_reads_only_what_it_found_taken() -> None:
    assert _scripted(InsertFirst, [(11,)]) == (11, ["claim"])
    got, asked = _scripted(InsertFirst, [None, ROW])
    assert isinstance(got, Record) and (got.key, got.state, got.fence) == ("k", "running", 7)
    assert asked == ["claim", "read"]
    assert _scripted(InsertFirst, [None, None]) == (None, ["claim", "read"])  # swept in between: vanished


@pytest.mark.storeless
def test_read_first_answers_a_record_there_and_else_lets_the_insert_decide() -> None:
    got, asked = _scripted(ReadFirst, [ROW])
    assert isinstance(got, Record) and got.fence == 7 and asked == ["read"]  # a replay: one statement, no write
    assert _scripted(ReadFirst, [None, (11,)]) == (11, ["read", "claim"])
    got, asked = _scripted(ReadFirst, [None, None, ROW])  # another caller inserted between our read and insert
    assert isinstance(got, Record) and asked == ["read", "claim", "read"]
    assert _scripted(ReadFirst, [None, None] * TURNS) == (None, ["read", "claim"] * TURNS)  # bounded


@pytest.mark.storeless
async def test_a_plan_handed_on_goes_on_at_the_statement_it_waits_for() -> None:
    """A plan run by one executor as far as it could (here: the read), the rest by another: the same statements,
    once each."""
    plan = ReadFirst(READ, CLAIM, {"scope": "s", "key": "k"})
    assert plan.ask is READ
    plan.answered(None)
    assert plan.ask is CLAIM

    async def fetch(ask: Ask) -> Any:
        assert ask is CLAIM
        return (11,)

    assert await arun(plan, fetch) == 11 and plan.ask is None and plan.answer == 11


# -- the executors ---------------------------------------------------------------------------------------------

EXECUTORS = ["lane", "thread", *(["at once"] if BACKEND == "sqlite" else [])]


async def _with_clock(store: SQLStore) -> None:
    async with store.engine().connect() as conn:
        await conn.execute(text(f"CREATE TABLE IF NOT EXISTS {CLOCK_TABLE} (t DOUBLE PRECISION NOT NULL)"))
        if (await conn.execute(text(f"SELECT count(*) FROM {CLOCK_TABLE}"))).scalar_one() == 0:
            await conn.execute(text(f"INSERT INTO {CLOCK_TABLE} (t) VALUES ({NOW})"))
    await store.ensure_schema()


@pytest.fixture(params=[{}] if BACKEND == "sqlite" else [{}, {"pg_claim_unsynced": True}],
                ids=lambda o: ",".join(o) or "default")
async def store(store_url: str, request: pytest.FixtureRequest) -> AsyncIterator[SQLStore]:
    """The store, at ``synchronous=NORMAL`` on SQLite (where every write can be made at once on the loop)."""
    s = SQLStore(store_url, clock=CLOCK, sqlite_synchronous="NORMAL", **request.param)
    await _with_clock(s)
    try:
        yield s
    finally:
        direct = s.direct()
        if direct is not None:
            direct.close()
        await s.dispose()


def _direct(store: SQLStore) -> DirectSQLite | DirectPostgres:
    direct = store.direct()
    assert isinstance(direct, DirectSQLite | DirectPostgres)
    return direct


def _row(row: Any) -> tuple[Any, ...] | None:
    return None if row is None else tuple(row)


def fetcher(store: SQLStore, executor: str) -> Fetch:
    """One statement run by ``executor``: its first row as a tuple, or None."""
    ex = store._executor
    if executor == "general":
        async def general(ask: Ask, params: dict[str, Any]) -> Any:
            async def first(conn: Any) -> Any:
                return (await conn.execute(ask.stmt, params)).first()

            return _row(await ex.run(ask.what, first, body_ran=ask.body_ran))

        return general
    if executor == "lane":
        async def lane(ask: Ask, params: dict[str, Any]) -> Any:
            return _row(await ex.one(ask.what, ask.stmt, params, body_ran=ask.body_ran, writes=ask.writes))

        return lane
    direct = _direct(store)
    if executor == "at once":
        assert isinstance(direct, DirectSQLite)

        async def at_once(ask: Ask, params: dict[str, Any]) -> Any:
            row = direct.now(ask, params)
            assert not isinstance(row, NotNow), (ask.what, "refused at once with the lock free")
            return _row(row)

        return at_once

    async def thread(ask: Ask, params: dict[str, Any]) -> Any:
        return _row(await asyncio.to_thread(direct._fetch, ask, params))

    return thread


def _claim(key: str, fence: int, owner: str | None = None, fingerprint: str = "f") -> dict[str, Any]:
    return {"scope": "s", "key": key, "task_id": "t", "operation": "op", "fingerprint": fingerprint,
            "arg_hashes": "{}", "fence": fence, "tool": "op", "arguments": None, "owner": owner or f"o{fence}",
            "lease": 30.0, "retention": 60.0, "audit": None}


def _fenced(key: str, fence: int, **more: Any) -> dict[str, Any]:
    return {"scope": "s", "key": key, "fence": fence, **more}


def _steps(store: SQLStore, key: str) -> list[tuple[str, Ask, dict[str, Any]]]:
    """Every hot statement, in every state that matters to it, on ``key`` (and ``key``-2)."""
    a, k2 = asks(store.sql), f"{key}-2"
    done = {"state": "succeeded", "result": "r", "retention": 60.0, "audit": '{"a": 1}'}
    steps: list[tuple[str, Ask, dict[str, Any]]] = [
        ("read absent", a.read, {"scope": "s", "key": key}),
        ("claim absent", a.claim, _claim(key, 11)),
        ("claim taken", a.claim, _claim(key, 12)),
        ("read running", a.read, {"scope": "s", "key": key}),
        ("renew", a.renew, _fenced(key, 11, lease=20.0)),
        ("renew, other fence", a.renew, _fenced(key, 99, lease=20.0)),
        ("take over a live claim", a.take_over, {**_claim(key, 11, "o-t"), "reset": 0}),
        ("complete, other fence", a.complete, _fenced(key, 99, **done)),
        ("complete", a.complete, _fenced(key, 11, **done)),
        ("complete again", a.complete, _fenced(key, 11, **done)),
        ("complete, other result", a.complete, _fenced(key, 11, **{**done, "result": "x"})),
        ("read completed", a.read, {"scope": "s", "key": key}),
        ("release completed", a.release, _fenced(key, 11, retention=60.0, audit=None, raised=None, bound=1)),
        ("claim", a.claim, _claim(k2, 21)),
        ("release owned, other owner", a.release_owned, {"scope": "s", "key": k2, "owner": "o99", "retention": 60.0}),
        ("release", a.release, _fenced(k2, 21, retention=60.0, audit="a", raised="boom", bound=0)),
        ("read released", a.read, {"scope": "s", "key": k2}),
        ("take over, other fence", a.take_over, {**_claim(k2, 99, "o-t"), "reset": 0}),
        ("take over", a.take_over, {**_claim(k2, 21, "o-t"), "reset": 0}),
        ("take over, a reset within retention", a.take_over, {**_claim(k2, 22, "o-u"), "reset": 1}),
        ("release owned", a.release_owned, {"scope": "s", "key": k2, "owner": "o-t", "retention": 60.0}),
        ("read released by owner", a.read, {"scope": "s", "key": k2}),
    ]
    return steps


async def _script(store: SQLStore, fetch: Fetch, key: str) -> list[tuple[str, Any]]:
    """:func:`_steps` run by ``fetch``: each step's row."""
    return [(what, await fetch(ask, params)) for what, ask, params in _steps(store, key)]


async def _rows(store: SQLStore, key: str) -> list[tuple[Any, ...]]:
    async with store.engine().connect() as conn:
        got = await conn.execute(text(
            "SELECT task_id, operation, fingerprint, arg_hashes, state, fence, origin, tool, arguments, attempts,"
            " owner, result, audit, lease_until, created_at, updated_at, expires_at FROM agentguard_calls"
            " WHERE key = :k OR key = :k2 ORDER BY key"), {"k": key, "k2": f"{key}-2"})
        return [tuple(r) for r in got]


async def test_every_executor_answers_each_statement_as_the_general_path_does(store: SQLStore) -> None:
    """The same statements, step by step, through each executor and through SQLAlchemy: the same rows returned,
    the same rows left, column for column (the clock is the test's: times compare exactly)."""
    general = await _script(store, fetcher(store, "general"), "k-general")
    want = await _rows(store, "k-general")
    assert [what for what, row in general if row is None] == [
        "read absent", "claim taken", "renew, other fence", "take over a live claim", "complete, other fence",
        "complete, other result", "release completed", "release owned, other owner", "take over, other fence",
        "take over, a reset within retention"]
    assert len(want) == 2
    for executor in EXECUTORS:
        key = f"k-{executor.replace(' ', '-')}"
        got = await _script(store, fetcher(store, executor), key)
        for (what, a), (_, b) in zip(got, general, strict=True):
            assert a == b, (executor, what, a, b)
        assert await _rows(store, key) == want, executor
    if "at once" in EXECUTORS:
        direct = _direct(store)
        writes = sum(ask.writes for _, ask, _ in _steps(store, "k"))
        # Every write made by a sync tool's thread and at once on the loop is counted towards a checkpoint.
        assert isinstance(direct, DirectSQLite) and direct.commits == 2 * writes


@pytest.mark.postgres
async def test_a_completion_announces_a_watched_record_through_every_executor(store: SQLStore) -> None:
    """Postgres: a completion of a record a waiter watches notifies it in the same statement, whoever runs it."""
    a = asks(store.sql)
    answers: dict[str, tuple[int, str | None]] = {}
    for executor in ["general", *EXECUTORS]:
        fetch, key = fetcher(store, executor), f"k-watched-{executor}"
        assert await fetch(a.claim, _claim(key, 11)) is not None
        assert await store.watch("s", key, lambda _: None) > 0
        fence, notified = await fetch(a.complete, _fenced(key, 11, state="succeeded", result="r", retention=60.0,
                                                           audit=None))
        answers[executor] = (fence, notified)
    assert set(answers.values()) == {(11, "")}  # pg_notify ran (void, as text); NULL where none watches


# -- the claim plans, each run by each executor ------------------------------------------------------------------


def planner(store: SQLStore, executor: str) -> Callable[[Plan], Awaitable[Claimed]]:
    """``executor`` running the rest of a claim plan."""
    if executor == "general":
        fetch = fetcher(store, "general")
        return lambda plan: arun(plan, lambda ask: fetch(ask, plan.params))
    if executor == "lane":
        return store._executor.claim
    direct = _direct(store)
    if executor == "at once":
        assert isinstance(direct, DirectSQLite)

        async def at_once(plan: Plan) -> Claimed:
            assert direct.advance_now(plan) is plan, "refused at once with the lock free"
            return plan.answer

        return at_once

    async def thread(plan: Plan) -> Claimed:
        return await asyncio.to_thread(run, plan, lambda ask: direct._fetch(ask, plan.params))

    return thread


def _same(a: Claimed, b: Claimed) -> bool:
    if isinstance(a, Record) and isinstance(b, Record):
        return a._replace(key="k") == b._replace(key="k")
    return a == b and type(a) is type(b)


async def _in_state(store: SQLStore, key: str, state: str) -> None:
    """``key``'s record put in ``state`` through the general path (nothing for "absent")."""
    fetch, a = fetcher(store, "general"), asks(store.sql)
    if state == "absent":
        return
    assert await fetch(a.claim, _claim(key, 1)) is not None
    if state == "succeeded":
        assert await fetch(a.complete, _fenced(key, 1, state="succeeded", result="r", retention=60.0, audit=None))
    elif state == "released":
        assert await fetch(a.release, _fenced(key, 1, retention=60.0, audit=None, raised=None, bound=1))


@pytest.mark.parametrize("plan", [InsertFirst, ReadFirst], ids=["insert first", "read first"])
async def test_every_executor_runs_each_claim_plan_as_the_general_path_does(store: SQLStore, plan: Any) -> None:
    """Each plan, in each state a claim meets, run by each executor: the same answer (our fence, or the record
    there) and the same rows as the general path's."""
    a = asks(store.sql)
    answers: dict[str, list[Claimed]] = {}
    for executor in ["general", *EXECUTORS]:
        runner = planner(store, executor)
        for state in ("absent", "running", "succeeded", "released"):
            key = f"k-{executor.replace(' ', '-')}-{state}"
            await _in_state(store, key, state)
            params = _claim(key, 5)
            answers.setdefault(executor, []).append(await runner(plan(a.read, a.claim, params)))
    fence, running, succeeded, released = answers["general"]
    assert fence == 5 and isinstance(running, Record) and isinstance(succeeded, Record)
    assert isinstance(released, Record) and (running.state, succeeded.state, released.state) == (
        "running", "succeeded", "released")
    for executor, got in answers.items():
        assert all(_same(x, y) for x, y in zip(got, answers["general"], strict=True)), (executor, got)
    rows = {executor: await _rows(store, f"k-{executor.replace(' ', '-')}-absent") for executor in answers}
    assert all(r == rows["general"] for r in rows.values()) and len(rows["general"]) == 1


@pytest.mark.skipif(BACKEND != "sqlite", reason="SQLite's loop executor: runs in the SQLite pass")
async def test_a_plan_refused_at_once_goes_on_where_it_stopped(store_url: str) -> None:
    """SQLite: the loop's thread makes at once only what never waits and never syncs. At ``EXTRA`` a claim's
    insert would sync: the plan's read is made at once, the insert handed on to aiosqlite's thread (one hop),
    and the answer is the general path's; a completion is refused at once whatever the level but ``NORMAL``/
    ``OFF``; with the write lock held elsewhere, a write is refused as busy (its caller waits in line, or hops),
    a read is made at once (WAL)."""
    store = SQLStore(store_url, clock=CLOCK, sqlite_synchronous="EXTRA")
    await _with_clock(store)
    holder = None
    try:
        direct = _direct(store)
        assert isinstance(direct, DirectSQLite) and not direct.claims_now and not direct.completes_now
        a = asks(store.sql)
        for state in ("absent", "succeeded"):
            key = f"k-{state}"
            await _in_state(store, key, state)
            params = _claim(key, 5)
            plan = ReadFirst(a.read, a.claim, params)
            got = direct.advance_now(plan)
            if state == "absent":
                assert got is NOT_NOW and plan.ask is a.claim  # read at once; the insert would sync
                assert await store._executor.claim(plan) == 5
            else:
                assert got is plan and isinstance(plan.answer, Record)  # a replay, at once
        assert direct.now(a.complete, _fenced("k-absent", 5, state="succeeded", result="r", retention=60.0,
                                              audit=None)) is NOT_NOW
        assert direct.commits == 0
        normal = SQLStore(store_url, clock=CLOCK, sqlite_synchronous="NORMAL")
        await normal.ensure_schema()
        holder = sqlite3.connect(make_url(store_url).database or "", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        d2 = _direct(normal)
        assert isinstance(d2, DirectSQLite)
        assert d2.now(a.claim, _claim("k-busy", 6)) is BUSY_NOW
        assert d2.now(a.read, {"scope": "s", "key": "k-succeeded"}) is not None
        holder.execute("ROLLBACK")
        d2.close()
        await normal.dispose()
    finally:
        if holder is not None:
            holder.close()
        store_direct = store.direct()
        if store_direct is not None:
            store_direct.close()
        await store.dispose()


# -- the Direct verbs against the store's own ----------------------------------------------------------------


async def test_the_direct_verbs_ask_what_the_stores_verbs_ask(store: SQLStore) -> None:
    """Each hot verb in a sync tool's thread (``Direct``) against ``SQLStore``'s own, the same calls on keys of
    their own: the same answers (the likely-taken hint included: the same plan either way)."""
    direct = _direct(store)

    async def verbs(via_direct: bool, key: str) -> list[Any]:
        def call(name: str, *args: Any, **kw: Any) -> Awaitable[Any]:
            if via_direct:
                return asyncio.to_thread(getattr(direct, name), *args, **kw)
            return getattr(store, name)(*args, **kw)  # type: ignore[no-any-return]

        k2 = f"{key}-2"
        return [
            await call("claim", _claim(key, 11)),
            await call("claim", _claim(key, 12), True),
            await call("read", "s", key),
            await call("renew", "s", key, 11, 20.0),
            await call("complete", "s", key, 11, "succeeded", "r", 60.0),
            await call("claim", _claim(key, 13)),
            await call("claim", _claim(key, 14, fingerprint="g"), True),
            await call("claim", _claim(k2, 21), True),
            await call("release", "s", k2, 21, 60.0, raised="boom", bound=False),
            await call("take_over", {**_claim(k2, 21, "o-t"), "reset": 0}),
            await call("release_owned", "s", k2, "o-t", 60.0),
            await call("read", "s", k2),
            await call("take_over", {**_claim(k2, 21, "o-u"), "reset": 0}),
        ]

    ours, theirs = await verbs(False, "k-store"), await verbs(True, "k-direct")
    assert all(_same(a, b) for a, b in zip(ours, theirs, strict=True)), (ours, theirs)
    assert ours[0] == 11 and ours[3] is True and ours[4] is True and ours[7] == 21 and ours[9] == (22, 21)
    assert ours[11].fingerprint == "" and ours[12] is None  # released by its owner: unbound; a stale fence


async def test_the_same_hint_takes_the_same_plan_on_every_executor(store: SQLStore,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim asks the same statements whoever runs it: for a key likely taken, a read first (a replay: that read
    alone), on every backend and executor; for one likely free, the dialect's plan (Postgres: the insert first;
    SQLite: the read first, which costs no round trip there). Before, a replaying task's sync call on Postgres
    asked the read-or-claim function while its async call read first."""
    a = asks(store.sql)
    names = {id(a.read.stmt): "read", id(a.claim.stmt): "claim"}
    sent: list[str] = []
    direct = _direct(store)
    real_fetch = type(direct)._fetch

    def spied_fetch(self: Any, ask: Ask, params: dict[str, Any]) -> Any:
        sent.append(names[id(ask.stmt)])
        return real_fetch(self, ask, params)

    monkeypatch.setattr(type(direct), "_fetch", spied_fetch)
    if isinstance(direct, DirectSQLite):  # the store's own claim: at once on the loop's thread
        real_now = DirectSQLite.now

        def spied_now(self: DirectSQLite, ask: Ask, params: dict[str, Any]) -> Any:
            sent.append(names[id(ask.stmt)])
            return real_now(self, ask, params)

        monkeypatch.setattr(DirectSQLite, "now", spied_now)
    else:  # the store's own claim: through the lane, statement by statement
        real_one = store._executor.one

        async def spied_one(what: str, stmt: Any, params: dict[str, Any], **kw: Any) -> Any:
            sent.append(names[id(stmt)])
            return await real_one(what, stmt, params, **kw)

        monkeypatch.setattr(store._executor, "one", spied_one)
    free = ["claim", "read"] if isinstance(store.dialect.plans.free(a.read, a.claim, {}), InsertFirst) else ["read"]
    for likely_taken, expected in ((True, ["read"]), (False, free)):
        for via in ("store", "thread"):
            key = f"k-{via}-{likely_taken}"
            await _in_state(store, key, "succeeded")
            sent.clear()
            if via == "store":
                got = await store.claim(_claim(key, 5), likely_taken)
            else:
                got = await asyncio.to_thread(direct.claim, _claim(key, 5), likely_taken)
            assert isinstance(got, Record) and sent == expected, (via, likely_taken, sent)
