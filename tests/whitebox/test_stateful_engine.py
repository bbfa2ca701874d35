"""Whole guarded calls against the reference model: a Hypothesis state machine over the engine.

Three workers, each a ``Guard`` of its own on one real store (SQLite, or Postgres with
``AGENTGUARD_TEST_BACKEND=postgres``), call one operation per key through ``Guard.run``. A body blocks until
a rule ends it (it returns, raises a cached error, or raises a transient one), so calls interleave as the
machine chooses, and the database clock (the store's test seam) moves between any two steps: a worker can
hold a claim while its lease expires, another take it over, the first wake and try to store its result.

Every call's answer is the one ``Protocol`` (tests/whitebox/test_stateful_store.py) predicts for the record it met:
claim, take over, restart past retention (then the body runs, with the operation's one downstream key), replay
(the stored value, or the stored error), refuse (InProgressError: a live claim), held (OutcomeUnknownError: a
running record whose lease ran out, for a tool whose key cannot reach the provider — the machine runs once with
each policy); and every ending: stored, or
LeaseLostError for a worker whose claim was taken over, or released. After every step the table is the model's.
The lease and the retention are long in real time (the heartbeat never fires within a test: renewals are the
store machine's business) and the database clock jumps across them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

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
from test_stateful_store import CLOCK, SCOPE, Bench, Protocol, Row

from agentguard import Guard, InProgressError, LeaseLostError, Outcome, OutcomeUnknownError
from agentguard.stores import FAILED, RUNNING, SUCCEEDED, SQLStore

LEASE, RETENTION = 1000.0, 10000.0  # seconds of the database clock; in real time, far beyond a test
TICKS = (50.0, 999.0, 1000.0, 1001.0, 4000.0, 10000.0, 10001.0)
KEYS = ("k0", "k1")
WORKERS = (0, 1, 2)


class Cached(Exception):
    """A cached error: stored and replayed like a result."""


class Transient(Exception):
    """Any other error: the claim is released."""


@dataclass
class InFlight:
    task: asyncio.Task[Outcome[str]]
    go: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    how: str = ""
    value: str = ""
    key: str = ""  # the downstream key the body received
    fence: int = 0  # the claim it runs under


class EngineMachine(RuleBasedStateMachine):
    bench: Bench
    guards: list[Guard]
    # What a caller does with a record whose worker went away inside the body (running, its lease run out):
    # "retry" takes it over (a tool whose key reaches the provider), "hold" leaves it for a person.
    on_unknown: str = "retry"

    def __init__(self) -> None:
        super().__init__()
        self.model = Protocol(lease=LEASE, retention=RETENTION)
        self.calls: dict[tuple[int, str], InFlight] = {}
        self.keys: dict[str, str] = {}  # the downstream key of each operation
        self.n = 0

    @initialize()
    def empty_store(self) -> None:
        self.bench.reset()

    def teardown(self) -> None:
        async def end(calls: list[InFlight]) -> None:
            for c in calls:
                c.how = "transient"
                c.go.set()
            for c in calls:
                with contextlib.suppress(BaseException):
                    await c.task

        self.bench.run(end(list(self.calls.values())))

    # -- a call --------------------------------------------------------------------------------------------

    def _expect(self, row: Row | None) -> str:
        """What Machine.begin must do with the record it meets (docs/architecture.md's state machine)."""
        if row is None:
            return "claim"
        if self.model.live(row):
            return "refuse"
        if self.model.expired(row):
            return "restart"  # past retention: a new operation
        if row.state in (SUCCEEDED, FAILED):
            return "replay"
        return "held" if row.state == RUNNING and self.on_unknown == "hold" else "take over"

    @rule(w=st.sampled_from(WORKERS), k=st.sampled_from(KEYS))
    def call(self, w: int, k: str) -> None:
        if (w, k) in self.calls:  # a worker makes one call per operation at a time
            return
        row = self.model.rows.get(k)
        expect = self._expect(row)
        guard = self.guards[w]

        async def start() -> InFlight:
            flight: InFlight

            async def body(key: str) -> str:
                flight.key = key
                flight.started.set()
                await flight.go.wait()
                if flight.how == "cached":
                    raise Cached(flight.value)
                if flight.how == "transient":
                    raise Transient(flight.value)
                return flight.value

            task = asyncio.ensure_future(guard.run("op", body, task_id="t", key={"k": k}, scope=SCOPE, returns=str,
                                                   cache_errors=(Cached,), on_unknown=self.on_unknown))
            flight = InFlight(task)
            began = asyncio.ensure_future(flight.started.wait())
            await asyncio.wait([task, began], return_when=asyncio.FIRST_COMPLETED)
            began.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await began
            return flight

        flight = self.bench.run(start())
        if flight.task.done():  # answered without running the body
            assert expect in ("replay", "refuse", "held"), (expect, flight.task)
            assert row is not None
            if expect == "refuse":
                assert isinstance(flight.task.exception(), InProgressError)
            elif expect == "held":  # nothing changes: its worker, if only stalled, may still record its outcome
                assert isinstance(flight.task.exception(), OutcomeUnknownError)
            elif row.state == FAILED:
                exc = flight.task.exception()
                assert isinstance(exc, Cached) and str(exc) == row.result
            else:
                outcome = flight.task.result()
                assert outcome.replayed and outcome.value == row.result
            return
        # The body runs: the claim must be the model's.
        assert expect in ("claim", "take over", "restart"), expect
        rec = self.bench.run(self.bench.store.read(SCOPE, flight.key))
        assert rec is not None and rec.state == RUNNING and rec.live
        if expect == "claim":
            assert self.model.claim(k, rec.fence, rec.owner or "", "fp") == rec.fence  # the engine's fresh fence
        else:
            assert row is not None
            took = self.model.take_over(k, row.fence, expect == "restart", rec.owner or "", "fp")
            assert took == (rec.fence, rec.origin), (expect, took, rec)
        assert (rec.attempts, rec.origin) == (self.model.rows[k].attempts, self.model.rows[k].origin)
        flight.fence = rec.fence
        # one downstream key per operation, on every claim and takeover
        assert self.keys.setdefault(k, flight.key) == flight.key
        # at most one body per live claim: every other body of this operation runs under an older claim
        for (_, other_k), other in self.calls.items():
            if other_k == k:
                assert other.fence != rec.fence
        self.calls[(w, k)] = flight

    @precondition(lambda self: self.calls)
    @rule(data=st.data(), how=st.sampled_from(("return", "return", "cached", "transient")))
    def finish(self, data: st.DataObject, how: str) -> None:
        """A body running now ends: it returns, raises a cached error, or raises anything else."""
        self._finish(data.draw(st.sampled_from(sorted(self.calls))), how)

    def _finish(self, wk: tuple[int, str], how: str) -> str:
        w, k = wk
        flight = self.calls.pop((w, k))
        self.n += 1
        flight.how, flight.value = how, f"v{self.n}"

        async def end() -> None:
            flight.go.set()
            with contextlib.suppress(BaseException):
                await flight.task

        self.bench.run(end())
        exc = flight.task.exception()
        if how == "transient":
            self.model.release(k, flight.fence)
            assert isinstance(exc, Transient)
        elif self.model.complete(k, flight.fence, SUCCEEDED if how == "return" else FAILED, flight.value):
            if how == "return":
                assert exc is None and flight.task.result().value == flight.value
                assert not flight.task.result().replayed
            else:
                assert isinstance(exc, Cached)
        else:
            assert isinstance(exc, LeaseLostError), exc  # its claim was taken over: its outcome is not stored
        return k

    @precondition(lambda self: any(r.state == RUNNING for r in self.model.rows.values()))
    @rule(data=st.data(), past=st.sampled_from((0.0, 0.5)))
    def stall(self, data: st.DataObject, past: float) -> None:
        """Every worker pauses until a running claim's lease ends (exactly then, or just past it)."""
        row = self.model.rows[data.draw(st.sampled_from(sorted(k for k, r in self.model.rows.items()
                                                                 if r.state == RUNNING)))]
        if row.lease_until is not None and row.lease_until >= self.model.now:
            self.tick(dt=row.lease_until - self.model.now + past)

    # -- the clock and the sweeper ----------------------------------------------------------------------

    @rule(dt=st.sampled_from(TICKS))
    def tick(self, dt: float) -> None:
        self.model.now += dt
        self.bench.set_clock(self.model.now)

    @rule()
    def sweep(self) -> None:
        assert self.bench.run(self.guards[0].sweep(batch=1)) == self.model.sweep()

    @invariant()
    def the_store_is_the_model(self) -> None:
        for k in KEYS:
            want = self.model.rows.get(k)
            key = self.keys.get(k)
            if key is None:
                assert want is None
                continue
            got = self.bench.run(self.bench.store.read(SCOPE, key))
            if want is None:
                assert got is None
                continue
            assert got is not None
            assert (got.state, got.fence, got.origin, got.attempts) == (want.state, want.fence, want.origin,
                                                                        want.attempts)
            assert got.live == self.model.live(want) and got.expired == self.model.expired(want)


EXAMPLES = {"sqlite": 150, "postgresql": 150}


@pytest.fixture
def bench(store_url: str) -> Iterator[Bench]:
    b = Bench(store_url)
    try:
        yield b
    finally:
        b.close()


def _guards(bench: Bench, url: str) -> list[Guard]:
    return [
        # NORMAL: the protocol is under test here, not durability (see test_stateful_store.Bench)
        Guard(store=SQLStore(url, clock=CLOCK, sqlite_synchronous="NORMAL"), lease=LEASE, retention=RETENTION,
              on_conflict="raise", cache_size=0)
        for _ in WORKERS
    ]


# 150 programs of 30 steps: 10 s alone here, several times that on a machine the suite loads.
@pytest.mark.long_run
@pytest.mark.timeout(600)
@pytest.mark.parametrize("on_unknown", ["retry", "hold"])
def test_guarded_calls_answer_as_the_protocol_says(bench: Bench, store_url: str, on_unknown: str) -> None:
    guards = _guards(bench, store_url)
    try:
        machine = type("Machine", (EngineMachine,), {"bench": bench, "guards": guards, "on_unknown": on_unknown})
        run_state_machine_as_test(machine, settings=settings(
            max_examples=EXAMPLES[bench.store.backend], stateful_step_count=30, derandomize=True, database=None,
            deadline=None, suppress_health_check=list(HealthCheck), print_blob=False,
        ))
    finally:
        for g in guards:
            bench.run(g.aclose())


def test_a_stale_worker_loses_its_result_and_the_takers_stands(bench: Bench, store_url: str) -> None:
    """The story the machine tells most often, kept as a plain test: worker 0's lease expires mid-body, worker
    1 takes over (the same downstream key), worker 0 wakes and is refused, worker 1's result is replayed."""
    guards = _guards(bench, store_url)
    try:
        m = type("Machine", (EngineMachine,), {"bench": bench, "guards": guards})()
        m.empty_store()
        m.call(w=0, k="k0")
        m.tick(dt=1000.0)  # exactly lease_until: no longer live
        m.call(w=1, k="k0")  # takes over
        m._finish((0, "k0"), how="return")  # LeaseLostError
        m._finish((1, "k0"), how="return")
        m.call(w=2, k="k0")  # replayed: worker 1's value
        m.the_store_is_the_model()
        assert m.model.rows["k0"].attempts == 2
        m.teardown()
    finally:
        for g in guards:
            bench.run(g.aclose())
