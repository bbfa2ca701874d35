"""Storms on one key: many callers released together, round after round, each round a new key. Every time the
body runs exactly once, and every caller gets its result (equal, field by field, to what the one execution
returned: a nonce drawn in the body says which execution it was).

- 1,000 threads calling a sync tool, released by one ``threading.Barrier`` (Postgres: most of them find no
  direct connection free and take the guard's general path, the rest claim over psycopg in their own
  threads), and 1,000 coroutines calling an async tool on one loop;
- 16 processes on one store (a SQLite file; on the Postgres pass, one database), released by one write to a
  FIFO, sync and async callers in every round.

On Postgres a sampler counts the guard's server connections meanwhile: they stay within what the guard
promises (its pool's capacity, ``pool_size`` x 3, on the guard's loop; as many again for sync tools' own
threads; one that LISTENs), far below the server's ``max_connections``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentguard import Guard, task

from conftest import pg_dsn

pytestmark = pytest.mark.slow

ROUNDS = 3
CALLERS = 1000
PROCESSES = 16
POOL_SIZE = 4  # the guard's pool: capacity 12 a loop (pool_size x 3)
WORKER = str(Path(__file__).resolve().parents[1] / "storm_worker.py")


HOLD = 0.05  # seconds a body runs: its claim is live while the other callers arrive (they wait, then replay)


def _body(runs: list[str], lock: threading.Lock, order_id: str, key: str) -> dict[str, str]:
    with lock:
        runs.append(order_id)
    return {"order": order_id, "key": key, "nonce": uuid.uuid4().hex}


def _one_execution_every_caller_its_result(runs: list[str], order: str, results: list[Any]) -> None:
    assert runs.count(order) == 1, f"{order}: {runs.count(order)} executions"
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} callers failed, e.g. {errors[0]!r}"
    assert len(results) == CALLERS and all(r == results[0] for r in results), {str(r) for r in results}
    assert results[0]["order"] == order


class Connections:
    """Samples, on a connection of its own, how many server connections the guard (``application_name``
    agentguard) has open on the test's database; ``peak`` is the most seen."""

    def __init__(self, url: str) -> None:
        self.url, self.peak, self.samples = url, 0, 0
        self.max_connections = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._sample()), daemon=True)

    async def _sample(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(pg_dsn(self.url))
        try:
            self.max_connections = int(await conn.fetchval("SHOW max_connections"))
            self._ready.set()
            while not self._stop.is_set():
                n = await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                        " AND application_name = 'agentguard'")
                self.peak, self.samples = max(self.peak, int(n)), self.samples + 1
                await asyncio.sleep(0.005)
        finally:
            self._ready.set()
            await conn.close()

    @contextlib.contextmanager
    def watching(self) -> Iterator[Connections]:
        self._thread.start()
        self._ready.wait(30)
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(30)


def _within_bounds(seen: Connections, loops: int) -> None:
    """At most the pool's capacity on each loop the guard runs calls on, as many again for sync tools' own
    threads (the direct connections are capped at the pool's capacity), and one LISTENing connection a loop;
    and, for the moment the server takes to end them, the backends of connections just closed (an ended
    thread's, replaced by a new thread's; an overflow connection let go): at most a capacity more. (A server
    counts those too against its max_connections.)"""
    capacity = POOL_SIZE * 3
    bound = loops * (capacity + 1) + capacity + capacity
    print(f"peak: {seen.peak} connections of the guard (bound {bound}; the server's max_connections "
          f"{seen.max_connections}; {seen.samples} samples)")
    assert seen.samples > 0 and 0 < seen.peak <= bound, f"{seen.peak} connections, more than {bound}"
    assert bound < seen.max_connections  # (the test says so if a server is too small for it)


def _thread_storm(guard: Guard, charge: Callable[[str], dict[str, str]], runs: list[str], rounds: int) -> None:
    """``rounds`` rounds of CALLERS threads released together by one barrier, each round on a new key."""
    task_id = "storm-" + uuid.uuid4().hex[:8]
    for r in range(rounds):
        order = f"o-{r}"
        barrier = threading.Barrier(CALLERS)
        results: list[Any] = [None] * CALLERS

        def call(i: int, barrier: threading.Barrier = barrier, order: str = order,
                 results: list[Any] = results) -> None:
            try:
                barrier.wait(120)
                with task(task_id):
                    results[i] = charge(order)
            except BaseException as exc:
                results[i] = exc

        threads = [threading.Thread(target=call, args=(i,)) for i in range(CALLERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads)
        _one_execution_every_caller_its_result(runs, order, results)


@pytest.mark.postgres
def test_a_thousand_threads_on_one_key_run_it_once(store_url: str) -> None:
    guard = Guard(store_url, pool_size=POOL_SIZE, wait_timeout=120, cache_size=0)
    runs: list[str] = []
    lock = threading.Lock()

    @guard.once(key="order_id")
    def charge(order_id: str, idempotency_key: str = "") -> dict[str, str]:
        time.sleep(HOLD)
        return _body(runs, lock, order_id, idempotency_key)

    try:
        for n in range(2):  # the guard's first calls, one at a time: its schema and executors are made
            with task("warm"):
                charge(f"warm-{n}")
        with Connections(store_url).watching() as seen:
            _thread_storm(guard, charge, runs, ROUNDS)
    finally:
        guard.close()
    _within_bounds(seen, loops=1)  # (sync tools' general path: the guard's portal loop)


@pytest.mark.postgres
def test_a_new_guards_first_thousand_sync_calls_stay_within_its_connections(store_url: str) -> None:
    """The storm is a new guard's first sync calls but one, in a process of its own: a service started (its
    first call alone) as a thousand requests arrive. One execution, one result, and its connections stay within
    the same bound, none dropped while open."""
    with Connections(store_url).watching() as seen:
        done = subprocess.run([sys.executable, WORKER, "--cold", store_url, str(CALLERS), str(POOL_SIZE)],
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["executions"] == 1 and got["results"] == 1 and not got["errors"], got
    assert got["leaked"] == 0, f"{got}; peak {seen.peak} connections"
    _within_bounds(seen, loops=1)


@pytest.mark.postgres
@pytest.mark.anyio
async def test_a_thousand_coroutines_on_one_key_run_it_once(store_url: str) -> None:
    runs: list[str] = []
    lock = threading.Lock()
    async with Guard(store_url, pool_size=POOL_SIZE, wait_timeout=120, cache_size=0) as guard:

        @guard.once(key="order_id")
        async def charge(order_id: str, idempotency_key: str = "") -> dict[str, str]:
            await asyncio.sleep(HOLD)
            return _body(runs, lock, order_id, idempotency_key)

        task_id = "storm-" + uuid.uuid4().hex[:8]
        with task("warm"):
            await charge("warm")
        with Connections(store_url).watching() as seen:
            for r in range(ROUNDS):
                order = f"o-{r}"
                go = asyncio.Event()

                async def call(order: str = order, go: asyncio.Event = go) -> dict[str, str]:
                    await go.wait()
                    with task(task_id):
                        return await charge(order)

                callers = [asyncio.ensure_future(call()) for _ in range(CALLERS)]
                await asyncio.sleep(0)  # every caller waits on the event
                go.set()
                results = await asyncio.gather(*callers, return_exceptions=True)
                _one_execution_every_caller_its_result(runs, order, list(results))
    _within_bounds(seen, loops=1)


def test_sixteen_processes_on_one_key_run_it_once(store_url: str, tmp_path: Path) -> None:
    """16 processes on one SQLite file (on the Postgres pass, one database); sync and async callers in every
    round."""
    effects, go = tmp_path / "effects", str(tmp_path / "go")
    held = []
    for r in range(ROUNDS):  # the barriers: held open here, so a process's open never blocks
        os.mkfifo(f"{go}.{r}")
        held.append(os.open(f"{go}.{r}", os.O_RDWR))
    task_id = "storm-" + uuid.uuid4().hex[:8]
    procs = [subprocess.Popen([sys.executable, WORKER, store_url, str(i), task_id, str(effects), go, str(ROUNDS)],
                              stdout=subprocess.PIPE, text=True) for i in range(PROCESSES)]
    try:
        for r in range(ROUNDS):
            for p in procs:
                assert p.stdout is not None
                assert p.stdout.readline().strip() == f"ready {r}"
            os.write(held[r], b"x" * PROCESSES)  # one write releases them all
            lines = []
            for p in procs:
                assert p.stdout is not None
                lines.append(json.loads(p.stdout.readline()))
            errors = [line["error"] for line in lines if "error" in line]
            assert not errors, errors
            results = [line["result"] for line in lines]
            assert all(result == results[0] for result in results), results
            assert {line["sync"] for line in lines} == {True, False}  # sync and async callers raced
            keys = effects.read_text().split()
            assert keys.count(results[0]["key"]) == 1, f"round {r}: {keys.count(results[0]['key'])} executions"
        for p in procs:
            assert p.wait(60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            assert p.stdout is not None
            p.stdout.close()
        for fd in held:
            os.close(fd)
    # 2 warm-up calls per process, then one execution per round
    assert len(effects.read_text().split()) == 2 * PROCESSES + ROUNDS
