"""The real stores against a reference model of the protocol: Hypothesis state machines.

Three simulated workers drive the real ``SQLStore`` (SQLite here, Postgres with
``AGENTGUARD_TEST_BACKEND=postgres``) through random interleavings of its verbs on two keys — claim (by each plan:
likely free, likely taken), read, take over (with the fence they saw, or a stale one), renew, complete, release,
release by owner, steps (put, clear, load), abandon, sweep — while a controllable database clock moves forward by
amounts chosen around the lease and the retention. The hot verbs go through each executor in turn (``EXECUTORS``):
the general path, the event loop's own thread where a write can be made at once (SQLite), the claim's and the
completion's form for many callers (Postgres, which gathers them under load), and a sync tool's own thread
(``Direct``: stdlib ``sqlite3``, psycopg). ``Protocol`` below is the specification: a few dicts and the
WHERE clauses of docs/architecture.md in Python. Every answer the store gives is compared with the model's, and
after every step the whole table is. The clock is the store's test seam (``SQLStore(clock=...)``): every statement
reads the time from a one-row table the test moves.

Hypothesis is derandomized (the same examples on every run) and its database is off: CI runs once and
never flakes. Counterexamples it found and shrank are kept below as plain tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import text

from agentguard._machine import claim_retention
from agentguard.stores import DONE, FAILED, RELEASED, RUNNING, STARTED, SUCCEEDED, Record, SQLStore
from agentguard.stores._claims import Ask, arun
from agentguard.stores._protocols import Direct
from agentguard.stores._schema import UNBOUND
from agentguard.stores._verbs import complete_params

from conftest import BACKEND

T = TypeVar("T")

CLOCK_TABLE = "agentguard_test_clock"
CLOCK = f"(SELECT t FROM {CLOCK_TABLE})"
LEASE, RETENTION = 10.0, 100.0
# A claim's and a takeover's retention, as the machine gives it (a margin of 1 s past RETENTION here): a completion
# within the first clock step keeps the claim's expiry, a later one moves it to RETENTION from then.
CLAIM_RETENTION = claim_retention(RETENTION, LEASE)
START = 1_000_000.0
SCOPE = "s"
KEYS = ("k0", "k1")
WORKERS = (0, 1, 2)
# Steps of the clock: inside a lease, onto its end (a strict comparison), past it, onto and past retention.
TICKS = (0.5, 3.0, 10.0, 10.5, 40.0, 100.0, 100.5, 250.0)


# -- the specification ----------------------------------------------------------------------------------


@dataclass
class Row:
    state: str
    fence: int
    origin: int
    attempts: int
    owner: str | None
    lease_until: float | None
    expires_at: float
    fingerprint: str
    result: str | None = None


@dataclass
class StepRow:
    seq: int
    state: str
    fence: int
    result: str | None


@dataclass
class Protocol:
    """The reference model: the statements of ``agentguard/stores/_statements.py``, as their WHERE and SET
    clauses say, on two dicts and a clock."""

    now: float = START
    lease: float = LEASE
    retention: float = RETENTION
    rows: dict[str, Row] = field(default_factory=dict)
    steps: dict[tuple[str, int, str], StepRow] = field(default_factory=dict)
    issued: dict[str, set[int]] = field(default_factory=dict)  # every fence each key ever had

    @property
    def claim_retention(self) -> float:
        """The retention a claim and a takeover write (the machine's: a margin past ``retention``)."""
        return claim_retention(self.retention, self.lease)

    def live(self, row: Row) -> bool:
        return row.state == RUNNING and row.lease_until is not None and row.lease_until > self.now

    def expired(self, row: Row) -> bool:
        return row.expires_at < self.now

    def _issue(self, key: str, fence: int) -> None:
        seen = self.issued.setdefault(key, set())
        assert fence not in seen, f"fence {fence} issued twice for {key}"  # fences never repeat for a key
        seen.add(fence)

    def claim(self, key: str, fence: int, owner: str, fingerprint: str) -> int | Row:
        row = self.rows.get(key)
        if row is not None:
            return row
        self._issue(key, fence)
        self.rows[key] = Row(RUNNING, fence, fence, 1, owner, self.now + self.lease,
                             self.now + self.claim_retention, fingerprint)
        return fence

    def take_over(self, key: str, seen: int, reset: bool, owner: str, fingerprint: str) -> tuple[int, int] | None:
        row = self.rows.get(key)
        if row is None or row.fence != seen or self.live(row):
            return None
        if not (self.expired(row) if reset else row.state in (RUNNING, RELEASED)):
            return None
        fence = row.fence + 1
        self._issue(key, fence)
        self.rows[key] = Row(
            RUNNING, fence, fence if reset else row.origin, 1 if reset else row.attempts + 1, owner,
            self.now + self.lease, self.now + self.claim_retention, fingerprint,
        )
        return fence, self.rows[key].origin

    def _fenced(self, key: str, fence: int, states: tuple[str, ...]) -> Row | None:
        row = self.rows.get(key)
        return row if row is not None and row.fence == fence and row.state in states else None

    def renew(self, key: str, fence: int) -> bool:
        row = self._fenced(key, fence, (RUNNING,))
        if row is not None:
            row.lease_until = self.now + self.lease
        return row is not None

    def complete(self, key: str, fence: int, state: str, result: str) -> bool:
        row = self.rows.get(key)
        if row is None or row.fence != fence or not (
            row.state == RUNNING or (row.state == state and row.result == result)
        ):
            return False
        # (the expiry moves only forward: a completion within the claim's margin leaves it as the claim wrote it)
        row.state, row.result, row.lease_until = state, result, None
        row.expires_at = max(row.expires_at, self.now + self.retention)
        return True

    def release(self, key: str, fence: int, raised: str | None = None, bound: bool = True) -> bool:
        """``raised``: what the body raised (kept for a refusal's text); ``bound``: its body started, so the
        record keeps binding its arguments (else its fingerprint is UNBOUND: the next call runs with its own)."""
        row = self._fenced(key, fence, (RUNNING, RELEASED))
        if row is not None:
            row.state, row.lease_until, row.expires_at = RELEASED, None, self.now + self.retention
            row.result = raised
            if not bound:
                row.fingerprint = UNBOUND
        return row is not None

    def release_owned(self, key: str, owner: str) -> bool:
        """A claim undone while it was made: its body never started, so it binds nothing."""
        row = self.rows.get(key)
        if row is None or row.owner != owner or row.state != RUNNING:
            return False
        row.state, row.lease_until, row.expires_at = RELEASED, None, self.now + self.retention
        row.fingerprint = UNBOUND  # a claim undone while it was made: its body never started, it binds nothing
        return True

    def abandon(self, key: str, result: str) -> bool:
        row = self.rows.get(key)
        if row is None or self.live(row) or row.state not in (RUNNING, RELEASED):
            return False
        row.state, row.result, row.lease_until, row.expires_at = FAILED, result, None, self.now + self.retention
        return True

    def put_step(self, key: str, fence: int, origin: int, name: str, seq: int, state: str, result: str | None) -> bool:
        row = self._fenced(key, fence, (RUNNING,))
        if row is None:
            return False
        row.lease_until = self.now + self.lease  # the fence check renews the lease
        old = self.steps.get((key, origin, name))
        # ON CONFLICT DO UPDATE sets state, fence, result: the position stays the first one's
        self.steps[(key, origin, name)] = StepRow(seq if old is None else old.seq, state, fence, result)
        return True

    def clear_step(self, key: str, fence: int, origin: int, name: str) -> bool:
        row = self._fenced(key, fence, (RUNNING,))
        if row is None:
            return False
        row.lease_until = self.now + self.lease
        if (old := self.steps.get((key, origin, name))) is not None and old.state == STARTED:
            del self.steps[(key, origin, name)]
        return True

    def load_steps(self, key: str, origin: int) -> list[tuple[str, int, str, str | None]]:
        found = [(n, s.seq, s.state, s.result) for (k, o, n), s in self.steps.items() if k == key and o == origin]
        return sorted(found, key=lambda r: r[1])

    def sweep(self) -> int:
        dead = [k for k, row in self.rows.items() if self.expired(row) and not self.live(row)]
        for k in dead:
            del self.rows[k]
        if not dead:  # the orphans' pass runs after a sweep that deleted something
            return 0
        owned = {(k, row.origin) for k, row in self.rows.items()}
        for step in [s for s in self.steps if (s[0], s[1]) not in owned]:
            del self.steps[step]
        return len(dead)


# -- driving the real store -----------------------------------------------------------------------------


@dataclass
class Held:
    """What a worker believes it holds: the fence, origin and owner token of its last claim or takeover."""

    fence: int
    origin: int
    owner: str


class General(SQLStore):
    """The store without its shortcuts: no statement on the loop's own thread, none in a sync tool's."""

    def direct(self) -> None:  # type: ignore[override]
        return None


class InThread:
    """A store's hot verbs in a sync tool's own thread (``SQLStore.direct()``), awaitable: each runs on one thread
    of its own (one connection), as a sync tool's calls do."""

    def __init__(self, direct: Direct, thread: ThreadPoolExecutor) -> None:
        self._direct, self._thread = direct, thread

    def __getattr__(self, verb: str) -> Callable[..., Any]:
        sync = getattr(self._direct, verb)

        async def call(*args: Any, **kw: Any) -> Any:
            return await asyncio.get_running_loop().run_in_executor(self._thread, lambda: sync(*args, **kw))

        return call


class Gathered:
    """A store's claim and completion in their form for many callers (``_statements.Many``: Postgres gathers them
    while every connection of a loop is in use), each sent for its one caller and answered as the gathered
    statement answers each of its callers (``Many.answers``); the claim's read, and every other verb, as the store
    makes them."""

    def __init__(self, store: SQLStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def _ask(self, ask: Ask, params: dict[str, Any]) -> Any:
        executor, many = self._store._executor, ask.many
        if many is None:
            return await executor.one(ask.what, ask.stmt, params, body_ran=ask.body_ran, writes=ask.writes)

        async def send(drv: Any) -> list[Any]:
            return await executor.send_many(drv, many, [params])

        return (await executor.on_driver(ask.what, send, body_ran=ask.body_ran))[0]

    async def claim(self, params: dict[str, Any], likely_taken: bool = False) -> Any:
        store = self._store
        plan = (store._plans.taken if likely_taken else store._plans.free)(store._asks.read, store._asks.claim, params)
        return await arun(plan, lambda ask: self._ask(ask, params))

    async def complete(self, scope: str, key: str, fence: int, state: str, result: str, retention: float,
                       audit: str | None = None) -> bool:
        params = complete_params(scope, key, fence, state, result, retention, audit)
        return await self._ask(self._store._asks.complete, params) is not None


# The executors of the hot verbs (claim, read, take over, renew, complete, release, release by owner).
EXECUTORS = ["general", *(["at once"] if BACKEND == "sqlite" else ["gathered"]), "thread"]


class Bench:
    """One real store with a movable clock, on one event loop, for every example of a test; its hot verbs
    (``verbs``) through one executor."""

    def __init__(self, url: str, executor: str = "general") -> None:
        self.runner = asyncio.Runner()
        # NORMAL: these machines test the protocol, not durability (tests/stores/test_durability.py does); a synced
        # commit per step would only slow them down. (It also lets every write of the loop's be made at once.)
        kind = General if executor == "general" else SQLStore
        self.store: SQLStore = kind(url, clock=CLOCK, sqlite_synchronous="NORMAL")
        self.run(self._create())
        self.verbs: Any = self.store
        self._thread: ThreadPoolExecutor | None = None
        if executor == "thread":
            direct = self.store.direct()
            assert direct is not None
            self._direct = direct
            self._thread = ThreadPoolExecutor(1)
            self.verbs = InThread(direct, self._thread)
        elif executor == "gathered":
            assert self.store.sql.claim_many is not None and self.store.sql.complete_many is not None
            self.verbs = Gathered(self.store)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    async def _sql(self, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
        async with self.store.engine().connect() as conn:
            result = await conn.execute(text(sql), params or {})
            return list(result.fetchall()) if result.returns_rows else []

    async def _create(self) -> None:
        await self._sql(f"CREATE TABLE IF NOT EXISTS {CLOCK_TABLE} (t DOUBLE PRECISION NOT NULL)")
        await self._sql(f"DELETE FROM {CLOCK_TABLE}")
        await self._sql(f"INSERT INTO {CLOCK_TABLE} (t) VALUES (:t)", {"t": START})
        await self.store.ensure_schema()

    def reset(self) -> None:
        async def go() -> None:
            await self._sql("DELETE FROM agentguard_calls")
            await self._sql("DELETE FROM agentguard_steps")
            await self._sql(f"UPDATE {CLOCK_TABLE} SET t = :t", {"t": START})

        self.run(go())

    def set_clock(self, t: float) -> None:
        self.run(self._sql(f"UPDATE {CLOCK_TABLE} SET t = :t", {"t": t}))

    def steps(self) -> dict[tuple[str, int, str], StepRow]:
        rows = self.run(self._sql(
            "SELECT key, origin, name, seq, state, fence, result FROM agentguard_steps WHERE scope = :s", {"s": SCOPE}
        ))
        return {(r[0], int(r[1]), r[2]): StepRow(int(r[3]), r[4], int(r[5]), r[6]) for r in rows}

    def close(self) -> None:
        if self._thread is not None:
            self._thread.submit(self._direct.close).result()
            self._thread.shutdown()
        with contextlib.suppress(Exception):
            self.run(self.store.dispose())
        self.runner.close()


def _params(key: str, fence: int, owner: str, fingerprint: str, **more: Any) -> dict[str, Any]:
    return {
        "scope": SCOPE, "key": key, "task_id": "t", "operation": "op", "fingerprint": fingerprint,
        "arg_hashes": "{}", "fence": fence, "tool": "tool", "arguments": None, "owner": owner, "lease": LEASE,
        "retention": CLAIM_RETENTION, "audit": None, **more,
    }


class StoreMachine(RuleBasedStateMachine):
    """Workers interleave the store's verbs; every answer must be the reference model's."""

    bench: Bench  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.model = Protocol()
        self.held: dict[tuple[int, str], Held] = {}
        self.seen: dict[tuple[int, str], int] = {}  # the fence each worker last read for each key
        self.stale: dict[tuple[int, str], bool] = {}  # and whether it was past retention (the engine's reset)
        self.n = 0

    @initialize()
    def empty_store(self) -> None:
        self.bench.reset()

    def _fresh(self) -> tuple[int, str]:
        self.n += 1
        return self.n * 1_000_000, f"o{self.n}"  # fresh fences far apart: a takeover's +1 never meets one

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.bench.run(coro)

    def _agree(self, got: Record | None, want: Row | None) -> None:
        if want is None:
            assert got is None
            return
        assert got is not None
        assert (got.state, got.fence, got.origin, got.attempts, got.owner, got.result, got.fingerprint) == (
            want.state, want.fence, want.origin, want.attempts, want.owner, want.result, want.fingerprint,
        )
        assert got.live == self.model.live(want)
        assert got.expired == self.model.expired(want)
        assert abs(got.ttl - (want.expires_at - self.model.now)) < 1e-6

    # -- the clock and the sweeper ----------------------------------------------------------------------

    @rule(dt=st.sampled_from(TICKS))
    def tick(self, dt: float) -> None:
        self.model.now += dt
        self.bench.set_clock(self.model.now)

    @precondition(lambda self: self.model.rows)
    @rule(data=st.data(), retention=st.booleans(), past=st.sampled_from((0.0, 0.5)))
    def stall(self, data: st.DataObject, retention: bool, past: float) -> None:
        """Everyone pauses until a record's lease (or its retention) ends: exactly then, or just past it."""
        row = self.model.rows[data.draw(st.sampled_from(sorted(self.model.rows)))]
        until = row.expires_at if retention or row.lease_until is None else row.lease_until
        if until >= self.model.now:
            self.tick(dt=until - self.model.now + past)

    @rule(abandon=st.sampled_from((None, *KEYS)))
    def operator(self, abandon: str | None) -> None:
        """The sweeper's pass, or an operator abandoning an operation nobody holds."""
        if abandon is None:
            assert self._run(self.bench.store.sweep(batch=1)) == self.model.sweep()
        else:
            got = self._run(self.bench.store.abandon(SCOPE, abandon, '"gone"', RETENTION))
            assert got == self.model.abandon(abandon, '"gone"')

    # -- a call's verbs ---------------------------------------------------------------------------------

    @rule(w=st.sampled_from(WORKERS), key=st.sampled_from(KEYS), fp=st.sampled_from(("f1", "f2")),
          taken=st.booleans())
    def claim(self, w: int, key: str, fp: str, taken: bool = False) -> None:
        fence, owner = self._fresh()  # (``taken``: each of the dialect's ways, which must answer alike)
        got = self._run(self.bench.verbs.claim(_params(key, fence, owner, fp), taken))
        want = self.model.claim(key, fence, owner, fp)
        if isinstance(want, int):
            assert got == want
            self.held[(w, key)] = Held(fence, fence, owner)
        else:
            assert isinstance(got, Record)
            self._agree(got, want)
            self._saw(w, key, got)

    @rule(w=st.sampled_from(WORKERS), key=st.sampled_from(KEYS))
    def read(self, w: int, key: str) -> None:
        got = self._run(self.bench.verbs.read(SCOPE, key))
        self._agree(got, self.model.rows.get(key))
        if got is not None:
            self._saw(w, key, got)

    def _saw(self, w: int, key: str, rec: Record) -> None:
        self.seen[(w, key)] = rec.fence
        self.stale[(w, key)] = rec.expired and not rec.live

    @rule(w=st.sampled_from(WORKERS), key=st.sampled_from(KEYS), reset=st.sampled_from(("as read", True, False)),
          which=st.sampled_from(("seen", "seen", "held", "current")))
    def take_over(self, w: int, key: str, reset: bool | str, which: str) -> None:
        """With the fence the worker read and the reset the engine derives from that read (mostly), or any."""
        if reset == "as read":
            reset = self.stale.get((w, key), False)
        assert isinstance(reset, bool)
        row = self.model.rows.get(key)
        seen = {"seen": self.seen.get((w, key)), "held": getattr(self.held.get((w, key)), "fence", None),
                "current": None if row is None else row.fence}[which]
        if seen is None:
            return
        _, owner = self._fresh()
        params = _params(key, seen, owner, "f1", reset=1 if reset else 0)
        got = self._run(self.bench.verbs.take_over(params))
        want = self.model.take_over(key, seen, reset, owner, "f1")
        assert got == want
        if want is not None:
            self.held[(w, key)] = Held(want[0], want[1], owner)

    # -- the races that matter, as one step each (random programs reach them too, but rarely) ----------

    @precondition(lambda self: any(r.state == RUNNING for r in self.model.rows.values()))
    @rule(data=st.data())
    def steal(self, data: st.DataObject) -> None:
        """A holder stalls past its lease; another worker reads the record and takes it over."""
        key = data.draw(st.sampled_from(sorted(k for k, r in self.model.rows.items() if r.state == RUNNING)))
        row = self.model.rows[key]
        if row.lease_until is not None and row.lease_until >= self.model.now:
            self.tick(dt=row.lease_until - self.model.now + data.draw(st.sampled_from((0.0, 0.5))))
        w = data.draw(st.sampled_from(WORKERS))
        self.read(w=w, key=key)
        self.take_over(w=w, key=key, reset="as read", which="seen")

    @precondition(lambda self: any(
        (r := self.model.rows.get(k)) is None or r.fence != h.fence for (_, k), h in self.held.items()
    ))
    @rule(data=st.data(), verb=st.sampled_from(("renew", "complete", "release", "release_owned", "put_step",
                                                  "clear_step", "load_steps")))
    def stale_write(self, data: st.DataObject, verb: str) -> None:
        """A worker whose claim was taken over (or swept) wakes and writes: every write must be refused."""
        stale = sorted(
            wk for wk, h in self.held.items()
            if (r := self.model.rows.get(wk[1])) is None or r.fence != self.held[wk].fence
        )
        pick = _pick(*data.draw(st.sampled_from(stale)))
        if verb == "complete":
            self.complete(data=pick, state=SUCCEEDED, result='"stale"')
        elif verb in ("put_step", "clear_step"):
            getattr(self, verb)(pick, name="charge", **({"state": DONE} if verb == "put_step" else {}))
        else:
            getattr(self, verb)(pick)

    def _holder(self, data: st.DataObject) -> tuple[int, str, Held]:
        """A worker and a key it claimed or took over (its claim may be stale by now)."""
        w, key = data.draw(st.sampled_from(sorted(self.held)))
        return w, key, self.held[(w, key)]

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        _, key, h = self._holder(data)
        assert self._run(self.bench.verbs.renew(SCOPE, key, h.fence, LEASE)) == self.model.renew(key, h.fence)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), state=st.sampled_from((SUCCEEDED, FAILED)), result=st.sampled_from(('"a"', '"b"')))
    def complete(self, data: st.DataObject, state: str, result: str) -> None:
        _, key, h = self._holder(data)
        got = self._run(self.bench.verbs.complete(SCOPE, key, h.fence, state, result, RETENTION))
        assert got == self.model.complete(key, h.fence, state, result)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), bound=st.booleans())
    def release(self, data: st.DataObject, bound: bool = True) -> None:
        _, key, h = self._holder(data)
        got = self._run(self.bench.verbs.release(SCOPE, key, h.fence, RETENTION, raised="Boom", bound=bound))
        assert got == self.model.release(key, h.fence, "Boom", bound)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release_owned(self, data: st.DataObject) -> None:
        _, key, h = self._holder(data)
        got = self._run(self.bench.verbs.release_owned(SCOPE, key, h.owner, RETENTION))
        assert got == self.model.release_owned(key, h.owner)


    # -- steps ------------------------------------------------------------------------------------------

    @precondition(lambda self: self.held)
    @rule(data=st.data(), name=st.sampled_from(("charge", "email")), state=st.sampled_from((STARTED, DONE)))
    def put_step(self, data: st.DataObject, name: str, state: str) -> None:
        _, key, h = self._holder(data)
        seq, result = (0 if name == "charge" else 1), (None if state == STARTED else f'"{name}-{h.fence}"')
        got = self._run(self.bench.store.put_step(SCOPE, key, fence=h.fence, origin=h.origin, lease=LEASE, name=name,
                                                  seq=seq, state=state, result=result))
        assert got == self.model.put_step(key, h.fence, h.origin, name, seq, state, result)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), name=st.sampled_from(("charge", "email")))
    def clear_step(self, data: st.DataObject, name: str) -> None:
        _, key, h = self._holder(data)
        got = self._run(self.bench.store.clear_step(SCOPE, key, fence=h.fence, origin=h.origin, lease=LEASE,
                                                    name=name))
        assert got == self.model.clear_step(key, h.fence, h.origin, name)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def load_steps(self, data: st.DataObject) -> None:
        _, key, h = self._holder(data)
        got = self._run(self.bench.store.load_steps(SCOPE, key, h.origin))
        assert got == self.model.load_steps(key, h.origin)

    # -- after every step, the whole store -----------------------------------------------------------------

    @invariant()
    def the_store_is_the_model(self) -> None:
        for key in KEYS:
            self._agree(self._run(self.bench.store.read(SCOPE, key)), self.model.rows.get(key))
        assert self.bench.steps() == self.model.steps


# Examples per executor: the general path's more, it serves every other verb too.
EXAMPLES = {"general": 300, "at once": 200, "gathered": 200, "thread": 200}


@pytest.fixture
def bench(store_url: str) -> Iterator[Bench]:
    b = Bench(store_url)
    try:
        yield b
    finally:
        b.close()


# Hundreds of programs of 40 steps: 30 s alone here, several times that on a machine the suite loads.
@pytest.mark.long_run
@pytest.mark.timeout(600)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_store_answers_as_the_protocol_says(store_url: str, executor: str) -> None:
    bench = Bench(store_url, executor)
    try:
        machine = type("Machine", (StoreMachine,), {"bench": bench})
        run_state_machine_as_test(machine, settings=settings(
            max_examples=EXAMPLES[executor], stateful_step_count=40, derandomize=True, database=None,
            deadline=None, suppress_health_check=list(HealthCheck), print_blob=False,
        ))
    finally:
        bench.close()


# -- counterexamples the state machine (and the spin model) found, kept ------------------------------------


class _pick:
    """Hypothesis' data object, in a kept program: it draws the given worker and key."""

    def __init__(self, w: int, key: str) -> None:
        self.value = (w, key)

    def draw(self, strategy: Any) -> tuple[int, str]:
        return self.value


def _program(bench: Bench, steps: Callable[[StoreMachine], None]) -> None:
    machine = type("Machine", (StoreMachine,), {"bench": bench})()
    machine.empty_store()
    steps(machine)
    machine.the_store_is_the_model()


def test_a_completed_record_past_retention_is_not_continued_by_a_stale_read(bench: Bench) -> None:
    """A taker read a running record whose lease had expired (so: take it over, the same operation), then
    stalled; the holder completed; the record passed its retention; the taker's takeover without a reset then
    continued the completed operation, keeping its origin and so its recorded steps. It is refused now: a
    completed record restarts only as a new operation (reset = 1), with a new origin."""

    def steps(m: StoreMachine) -> None:
        m.claim(w=0, key="k0", fp="f1")
        m.put_step(data=_pick(0, "k0"), name="charge", state=DONE)
        m.tick(dt=10.5)  # the lease expired
        m.read(w=1, key="k0")  # worker 1 sees running, not live: a takeover without reset
        m.complete(data=_pick(0, "k0"), state=SUCCEEDED, result='"a"')  # the holder completes meanwhile
        m.tick(dt=100.5)  # past retention
        m.take_over(w=1, key="k0", reset=False, which="seen")  # refused (it used to succeed)
        assert (1, "k0") not in m.held
        m.read(w=1, key="k0")
        m.take_over(w=1, key="k0", reset=True, which="seen")  # as a new operation: a new origin, no steps
        h = m.held[(1, "k0")]
        assert h.origin == h.fence and m.model.load_steps("k0", h.origin) == []
        m.load_steps(data=_pick(1, "k0"))

    _program(bench, steps)


def test_a_reset_needs_a_record_past_retention_now(bench: Bench) -> None:
    """The converse: a taker read a record past retention (a reset), and the holder released it meanwhile,
    which starts its retention again: the reset is refused, and the taker continues the operation instead."""

    def steps(m: StoreMachine) -> None:
        m.claim(w=0, key="k0", fp="f1")
        m.put_step(data=_pick(0, "k0"), name="charge", state=DONE)
        m.tick(dt=100.5)
        m.read(w=1, key="k0")  # past retention, not live: a reset
        m.release(data=_pick(0, "k0"))  # the stalled holder wakes and releases: retention starts again
        m.take_over(w=1, key="k0", reset=True, which="seen")
        assert (1, "k0") not in m.held
        m.take_over(w=1, key="k0", reset=False, which="seen")  # the same operation: its steps stand
        assert m.held[(1, "k0")].origin == m.held[(0, "k0")].origin
        m.load_steps(data=_pick(1, "k0"))

    _program(bench, steps)


def test_a_takeover_keeps_what_it_did_not_reset(bench: Bench) -> None:
    def steps(m: StoreMachine) -> None:
        m.claim(w=0, key="k1", fp="f2")
        m.tick(dt=10.0)  # exactly at lease_until: no longer live (lease_until > now is strict)
        m.read(w=2, key="k1")
        m.take_over(w=2, key="k1", reset=False, which="seen")
        m.complete(data=_pick(0, "k1"), state=SUCCEEDED, result='"a"')  # the stale holder is refused
        m.complete(data=_pick(2, "k1"), state=SUCCEEDED, result='"b"')
        m.complete(data=_pick(2, "k1"), state=SUCCEEDED, result='"b"')  # a redo finds its own write
        m.tick(dt=100.0)  # exactly at expires_at: not yet past retention (expires_at < now is strict)
        m.operator(abandon=None)
        m.read(w=0, key="k1")

    _program(bench, steps)


def test_a_reset_of_a_record_within_retention_is_refused(bench: Bench) -> None:
    """The state machine's first counterexample on the takeover statement before the fix (shrunk): a reset
    takeover of a running record whose lease had just expired, well within retention, succeeded."""

    def steps(m: StoreMachine) -> None:
        m.claim(w=0, key="k0", fp="f1")
        m.tick(dt=10.0)
        m.take_over(w=0, key="k0", reset=True, which="held")
        assert m.model.rows["k0"].fence == m.held[(0, "k0")].fence == 1_000_000  # refused: still the claim's

    _program(bench, steps)
