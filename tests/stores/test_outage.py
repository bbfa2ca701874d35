"""A short store outage costs no double run.

Once the body ran, its completion (and a release, and a step's result) is retried through the outage until it
lands or the guard's ``outage_window`` passes: each of those writes is fenced and idempotent for its fence, so
redoing one is harmless, while giving up would leave the claim held and let a takeover run the body again.
Real faults only: a real PostgreSQL cluster stopped and started (``pg_ctl``), the guard's backends terminated
in a loop, a SQLite file's write lock held by another process. Every test counts runs per operation.
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from agentguard import Guard, InProgressError, Operation, StoreError, task

from conftest import BACKEND, tid

pytestmark = pytest.mark.anyio


KEYS, CALLS_PER_KEY = 40, 4
FAULT_SECONDS = 3.0  # a fault in a loop lasts this long at most: within the guard's outage_window


# -- a cluster of our own, to stop and start ---------------------------------------------------------------


class Cluster:
    def __init__(self) -> None:
        from benchmarks._pgserver import PgServer

        self.server = PgServer(fsync=False)
        self.url = ""

    def outage(self, seconds: float) -> threading.Thread:
        """Stop the server now (every client disconnected, new connections refused) and start it again after
        ``seconds``, in a thread: the caller goes on while the store is away."""
        self.server.stop_server("fast")
        thread = threading.Thread(target=self._start_after, args=(seconds,))
        thread.start()
        return thread

    def restart(self, after: float) -> threading.Thread:
        """``pg_ctl stop -m fast`` then ``start`` (a 1-2 s outage) after ``after`` seconds, in a thread."""

        def go() -> None:
            threading.Event().wait(after)
            self.server.stop_server("fast")
            self.server.start_server()

        thread = threading.Thread(target=go)
        thread.start()
        return thread

    def _start_after(self, seconds: float) -> None:
        threading.Event().wait(seconds)
        self.server.start_server()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if BACKEND != "postgres":
        pytest.skip("Postgres-only test (AGENTGUARD_TEST_BACKEND=postgres)")
    c = Cluster()
    try:
        c.url = c.server.start()
    except RuntimeError as exc:
        pytest.fail(f"cannot start a throwaway PostgreSQL cluster: {exc}")
    try:
        yield c
    finally:
        c.server.stop()


@pytest.fixture
async def pg_guard(cluster: Cluster) -> AsyncIterator[Guard]:
    guard = Guard(cluster.url, lease=12, connect_timeout=5)  # outage_window: half the lease, 6 s
    try:
        yield guard
    finally:
        await guard.aclose()


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(fn)


# -- one write after the body, the store away while it is made ---------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
async def test_the_completion_lands_after_a_restart(cluster: Cluster, pg_guard: Guard) -> None:
    runs: list[str] = []
    restarts: list[threading.Thread] = []

    @pg_guard.once(key="order_id")
    async def charge(order_id: str, amount: int, idempotency_key: str = "") -> dict[str, Any]:
        runs.append(idempotency_key)
        restarts.append(await in_thread(lambda: cluster.outage(1.0)))  # the provider charged; the store goes
        return {"order": order_id, "amount": amount}

    t = tid()
    async with task(t):
        assert await charge("o-1", 4900) == {"order": "o-1", "amount": 4900}  # no StoreError(body_ran=True)
    await in_thread(restarts[0].join)
    # The record is complete in the store: a guard without a cache replays it, and nothing runs again.
    async with Guard(cluster.url, cache_size=0) as other:

        @other.once(operation="charge", key="order_id")
        async def charge_elsewhere(order_id: str, amount: int) -> dict[str, Any]:
            runs.append("again")
            return {}

        async with task(t):
            assert await charge_elsewhere("o-1", 4900) == {"order": "o-1", "amount": 4900}
    assert len(runs) == 1


@pytest.mark.postgres
@pytest.mark.slow
async def test_a_release_lands_after_a_restart(cluster: Cluster, pg_guard: Guard) -> None:
    runs: list[str] = []
    restarts: list[threading.Thread] = []

    class Declined(Exception): ...

    class Timeout(Exception): ...

    @pg_guard.once(key="order_id", cache_errors=(Declined,))
    async def charge(order_id: str, fail: str, idempotency_key: str = "") -> str:
        runs.append(idempotency_key)
        restarts.append(await in_thread(lambda: cluster.outage(1.0)))
        raise Declined("card declined") if fail == "declined" else Timeout("provider timed out")

    async with task(tid()):
        with pytest.raises(Timeout) as info:
            await charge("o-1", "timeout")
        assert not getattr(info.value, "__notes__", None)  # released: no "could not be released" note
        await in_thread(restarts[-1].join)
        with pytest.raises(Timeout):
            await charge("o-1", "timeout")  # released, so a retry runs again, with the same downstream key
        await in_thread(restarts[-1].join)
        assert len(runs) == 2 and runs[0] == runs[1]

        with pytest.raises(Declined):
            await charge("o-2", "declined")  # a cached error, stored through the outage
        await in_thread(restarts[-1].join)
        with pytest.raises(Declined):
            await charge("o-2", "declined")  # replayed: not run again
    assert len(runs) == 3


@pytest.mark.postgres
@pytest.mark.slow
async def test_a_sync_tool_completes_after_a_restart(cluster: Cluster, pg_guard: Guard) -> None:
    runs: list[str] = []
    restarts: list[threading.Thread] = []

    @pg_guard.once(key="order_id")
    def charge(order_id: str, idempotency_key: str = "") -> str:
        runs.append(idempotency_key)
        restarts.append(cluster.outage(1.0))
        return f"ch_{order_id}"

    def call() -> str:
        with task("t-sync"):
            return charge("o-1")

    assert await in_thread(call) == "ch_o-1"
    await in_thread(restarts[0].join)
    assert await in_thread(call) == "ch_o-1"
    assert len(runs) == 1


@pytest.mark.postgres
@pytest.mark.slow
async def test_a_steps_result_lands_after_a_restart(cluster: Cluster, pg_guard: Guard) -> None:
    provider: list[str] = []
    restarts: list[threading.Thread] = []

    async def provider_charge(amount: int, key: str) -> dict[str, Any]:
        provider.append(key)
        restarts.append(await in_thread(lambda: cluster.outage(1.0)))  # charged; the store goes away
        return {"id": "ch_1", "amount": amount}

    @pg_guard.once(key="ride_id")
    async def book(ride_id: str, amount: int, op: Operation) -> str:
        charged = await op.step("charge", provider_charge, amount, op.key("charge"))
        return f"{ride_id}:{charged['id']}"

    async with task(tid()):
        assert await book("r-1", 900) == "r-1:ch_1"
        await in_thread(restarts[0].join)
        assert await book("r-1", 900) == "r-1:ch_1"
    assert len(provider) == 1


@pytest.mark.postgres
@pytest.mark.slow
async def test_an_outage_longer_than_the_window_keeps_the_claim_held(cluster: Cluster) -> None:
    """Past the window, today's contract stands: StoreError(body_ran=True), the claim held, and a takeover
    after the lease with the same downstream key."""
    keys: list[str] = []
    restarts: list[threading.Thread] = []
    async with Guard(cluster.url, lease=3, outage_window=0.5, connect_timeout=5) as guard:

        @guard.once(key="order_id")
        async def charge(order_id: str, idempotency_key: str = "") -> str:
            keys.append(idempotency_key)
            if len(keys) == 1:
                restarts.append(await in_thread(lambda: cluster.outage(2.0)))
            return "charged"

        async with task(tid()):
            with pytest.raises(StoreError) as info:
                await charge("o-1")
            assert info.value.body_ran and "outage_window" in str(info.value) and info.value.transient
            assert info.value.operation == 'charge[order_id="o-1"]'
            await in_thread(restarts[0].join)
            assert await charge("o-1") == "charged"  # waits out the lease, then takes over
    assert len(keys) == 2 and keys[0] == keys[1]


# -- under load: many callers, a real fault in the middle ------------------------------------------------


class Load:
    """KEYS operations, each called CALLS_PER_KEY times at once; callers retry refusals that say nothing
    ran (StoreError before the body, InProgressError), as an agent would, and stop at anything else."""

    def __init__(self, guard: Guard, body_seconds: float) -> None:
        self.runs: collections.Counter[str] = collections.Counter()
        self.body_ran_errors: list[StoreError] = []
        self.refusals = 0
        self.results: dict[str, set[str]] = collections.defaultdict(set)
        self.task = tid()

        @guard.once(key="order_id")
        async def charge(order_id: str, idempotency_key: str = "") -> str:
            self.runs[order_id] += 1
            await asyncio.sleep(body_seconds)
            return f"ch_{order_id}_{idempotency_key[-6:]}"

        self.charge = charge

    async def caller(self, order_id: str, start: float) -> None:
        await asyncio.sleep(start)
        for _ in range(400):
            try:
                async with task(self.task):
                    self.results[order_id].add(await self.charge(order_id))
                return
            except StoreError as exc:
                if exc.body_ran:
                    self.body_ran_errors.append(exc)
                    return
                self.refusals += 1
            except InProgressError:
                self.refusals += 1
            await asyncio.sleep(0.05)
        raise AssertionError(f"{order_id} never completed")

    async def run(self, fault: Callable[[], Awaitable[None]]) -> None:
        calls = [self.caller(f"o-{k}", 0.02 * k + 0.005 * n) for k in range(KEYS) for n in range(CALLS_PER_KEY)]
        await asyncio.gather(fault(), *calls)

    def check(self) -> None:
        assert self.body_ran_errors == []
        assert len(self.runs) == KEYS and set(self.runs.values()) == {1}, {k: v for k, v in self.runs.items() if v != 1}
        assert all(len(v) == 1 for v in self.results.values()) and len(self.results) == KEYS


@pytest.mark.postgres
@pytest.mark.slow
async def test_a_restart_under_load_runs_nothing_twice(cluster: Cluster, pg_guard: Guard) -> None:
    load = Load(pg_guard, body_seconds=0.3)

    async def fault() -> None:
        await in_thread(cluster.restart(after=0.4).join)

    await load.run(fault)
    load.check()


@pytest.mark.postgres
@pytest.mark.slow
async def test_backends_terminated_in_a_loop_run_nothing_twice(
    store_url: str, make_guard: Callable[..., Guard]
) -> None:
    import asyncpg

    from conftest import pg_dsn

    guard = make_guard(lease=12)
    load = Load(guard, body_seconds=0.05)
    db = make_url(store_url).database
    done = asyncio.Event()
    killed = 0

    async def fault() -> None:
        # Terminations for a while shorter than the guard's outage_window (6 s at this lease), the outage the
        # guarantee covers: a write after the body is retried through it and lands, however slowly this
        # machine reconnects meanwhile (a fault that never ends may outlast the window; that ends in a
        # StoreError(body_ran=True) with the claim held, by design).
        nonlocal killed
        admin = await asyncpg.connect(pg_dsn(store_url))
        ends = asyncio.get_running_loop().time() + FAULT_SECONDS
        try:
            while not done.is_set() and asyncio.get_running_loop().time() < ends:
                rows = await admin.fetch(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> "
                    "pg_backend_pid()", db,
                )
                killed += sum(1 for r in rows if r[0])
                await asyncio.sleep(0.05)
        finally:
            await admin.close()

    async def run_then_stop() -> None:
        calls = [load.caller(f"o-{k}", 0.02 * k + 0.005 * n) for k in range(KEYS) for n in range(CALLS_PER_KEY)]
        await asyncio.gather(*calls)
        done.set()

    await asyncio.gather(fault(), run_then_stop())
    load.check()
    assert killed > 10  # the fault really happened, many times


@pytest.mark.slow
async def test_a_sqlite_write_lock_held_by_another_process_runs_nothing_twice(tmp_path: Path) -> None:
    db = tmp_path / "agentguard.db"
    async with Guard(f"sqlite+aiosqlite:///{db}", lease=12) as guard:
        await guard.ensure_schema()
        load = Load(guard, body_seconds=0.05)
        holder = (
            "import sqlite3, sys, time\n"
            f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(2)\n"
            "c.execute('COMMIT')\n"
        )

        async def fault() -> None:
            await asyncio.sleep(0.3)
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", holder, stdout=subprocess.PIPE)
            assert proc.stdout is not None
            assert (await proc.stdout.readline()).strip() == b"locked"
            assert await proc.wait() == 0

        await load.run(fault)
    load.check()
