"""Postgres through a real PgBouncer (Debian's ``pgbouncer``, started here on a free loopback port), in transaction
and in session pooling, and one worker's connection budget (``max_connections``) as the server counts it.

Behind transaction pooling a server session outlives no transaction: a prepared statement kept by name, or a
LISTEN, is left on a session the next statement may not get. The store finds out at start which pooling it is
behind and keeps no statement and listens to nothing there (waiters poll); behind session pooling each of the
worker's connections holds one of the pooler's server connections while open, so the budget is what keeps a
worker within the pooler's pool, and a connection the pooler cannot seat is refused after a bounded wait, never
left to hang. Every test counts side effects and asserts exactly one per key.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from agentguard import Guard, StoreError, task
from agentguard.stores import SQLStore
from agentguard.stores._executor import Executor

from conftest import PG_URL, pg_dsn, tid
from pgbouncer import bouncer

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

MODES = ["transaction", "session"]


@pytest.mark.parametrize("mode", MODES)
async def test_sync_and_async_tools_through_pgbouncer_run_once_each(
    mode: str, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """64 async callers on 16 keys (first claims gathered while every connection is in use) and 24 threads of a
    sync tool on 8 keys, at once, through PgBouncer: one run per key, every caller the stored result, no
    failure; the ledger's batches (COPY) written through it too."""
    gathered = 0
    send = Executor._send_gathered

    async def counted(self: Executor, *args: Any) -> None:
        nonlocal gathered
        gathered += 1
        await send(self, *args)

    monkeypatch.setattr(Executor, "_send_gathered", counted)
    runs: dict[str, int] = {}
    lock = threading.Lock()
    with bouncer(tmp_path, store_url, mode, pool_size=10) as url:
        store = SQLStore(url, max_connections=8)
        async with Guard(store=store) as guard:

            @guard.once(key=["order"])
            async def charge(order: str) -> dict[str, str]:
                with lock:
                    runs[order] = runs.get(order, 0) + 1
                await asyncio.sleep(0.01)
                return {"charged": order}

            @guard.once(key=["order"])
            def refund(order: str) -> dict[str, str]:
                with lock:
                    runs[order] = runs.get(order, 0) + 1
                return {"refunded": order}

            t = tid()

            async def async_call(i: int) -> dict[str, str]:
                with task(t):
                    return await charge(f"a{i % 16}")

            def sync_call(i: int) -> dict[str, str]:
                with task(t):
                    return refund(f"s{i % 8}")

            results = await asyncio.gather(*(async_call(i) for i in range(64)),
                                           *(asyncio.to_thread(sync_call, i) for i in range(24)))
            pooling = store.dialect.pooling  # type: ignore[attr-defined]
        entries = await store.read_attempts(limit=1000)  # (the guard flushed its ledger on close)
        await store.dispose()
    assert pooling == mode
    assert runs == {**{f"a{i}": 1 for i in range(16)}, **{f"s{i}": 1 for i in range(8)}}
    assert results == [{"charged": f"a{i % 16}"} for i in range(64)] + [{"refunded": f"s{i % 8}"} for i in range(24)]
    assert gathered > 0  # (the claims of callers that found every connection in use went as one statement)
    assert sum(1 for e in entries if e.kind == "ran") == 24


@pytest.mark.parametrize("mode", MODES)
async def test_a_waiter_behind_pgbouncer_is_woken_or_polls_and_gets_the_outcome(
    mode: str, store_url: str, tmp_path: Path,
) -> None:
    """A caller in another worker waits on a claim held here: behind session pooling its listener hears the
    outcome's announcement; behind transaction pooling (where a LISTEN cannot be heard) it polls. Either way
    it gets the stored result, and the body ran once."""
    runs = 0
    started, finish, asked = asyncio.Event(), asyncio.Event(), asyncio.Event()
    marks: list[int] = []  # what each of the waiter's requests to watch the record answered
    with bouncer(tmp_path, store_url, mode) as url:
        async with Guard(url) as holder, Guard(url) as other:
            waiting = other._store  # type: ignore[attr-defined]
            watch = waiting.watch

            async def watching(scope: str, key: str, news: Any) -> int:
                generation: int = await watch(scope, key, news)
                marks.append(generation)
                asked.set()
                return generation

            waiting.watch = watching

            @holder.once(key=["order"])
            async def charge(order: str) -> dict[str, str]:
                nonlocal runs
                runs += 1
                started.set()
                await finish.wait()
                return {"charged": order}

            @other.once(operation="charge", key=["order"])  # (the same operation, from the other worker)
            async def charge_too(order: str) -> dict[str, str]:
                raise AssertionError("the waiter ran the body")

            t = tid()
            with task(t):
                first = asyncio.create_task(charge("o-1"))
                await started.wait()
                second = asyncio.create_task(charge_too("o-1"))
                # Until the waiter has asked to watch the record: behind session pooling it listens and the
                # record is marked watched (committed) when this returns, so the completion will announce it;
                # behind transaction pooling there is nothing to listen to and it polls.
                await asyncio.wait_for(asked.wait(), 60)
                assert (marks[0] > 0) is (mode == "session"), marks
                assert bool(waiting.listening()) is (mode == "session")
                finish.set()
                assert await first == {"charged": "o-1"}
                assert await asyncio.wait_for(second, 30) == {"charged": "o-1"}
            listener = waiting._engines.listener()
            for _ in range(200 if mode == "session" else 0):  # (it may arrive just after a look found the outcome)
                if listener.heard:
                    break
                await asyncio.sleep(0.05)
            heard = listener.heard
    assert runs == 1
    assert waiting.dialect.listens is (mode == "session")
    if mode == "session":
        assert heard >= 1  # woken by the announcement


async def test_pg_synchronous_commit_behind_a_pooler_is_refused_at_start(store_url: str, tmp_path: Path) -> None:
    """A session setting cannot reach the server through a pooler: refused before the first body, saying what to
    change (no silent durability other than asked for)."""
    runs = 0
    with bouncer(tmp_path, store_url, "transaction") as url:
        async with Guard(url, pg_synchronous_commit="off") as guard:

            @guard.once
            async def charge(amount: int) -> int:
                nonlocal runs
                runs += 1
                return amount

            for _ in range(2):  # (and again on the next call: never a connection with the setting dropped)
                with task(tid()), pytest.raises(StoreError, match=r"ALTER ROLE .* synchronous_commit") as raised:
                    await charge(1)
    assert runs == 0
    assert not raised.value.body_ran


async def test_the_drivers_hint_naming_pgbouncer_survives_into_the_store_error(
    store_url: str, tmp_path: Path,
) -> None:
    """A statement asyncpg prepared by name, through transaction pooling, on a session the next round trip did not
    get: asyncpg's hint (which names PgBouncer and what to set) is kept in the store's message."""
    with bouncer(tmp_path, store_url, "transaction", pool_size=4) as url:
        dsn = pg_dsn(url)
        conns = [await asyncpg.connect(dsn) for _ in range(2)]
        try:
            blocker = await asyncpg.connect(dsn)
            failure: BaseException | None = None
            try:
                for i in range(40):  # named statements, while another client holds the session they were made on
                    try:
                        stmt = await conns[0].prepare(f"SELECT {i}::int")
                        async with blocker.transaction():
                            await blocker.fetchval("SELECT 1")
                            await stmt.fetchval()
                    except asyncpg.PostgresError as exc:
                        failure = exc
                        break
            finally:
                await blocker.close()
        finally:
            for c in conns:
                await c.close()
    assert failure is not None, "transaction pooling should have lost the prepared statement"
    store = SQLStore(store_url)
    message = str(store._executor.error("claiming the key", failure, False))
    assert "does not exist" in message
    assert "pgbouncer" in message and "statement_cache_size" in message


async def _backends(dsn: str, database: str, stop: asyncio.Event, seen: list[int]) -> None:
    """The number of the worker's backends on ``database`` (the server's own count), sampled until ``stop``."""
    admin = await asyncpg.connect(dsn)
    try:
        while not stop.is_set():
            seen.append(await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE 'agentguard%'",
                database))
            await asyncio.sleep(0.002)
    finally:
        await admin.close()


async def test_one_worker_never_holds_more_connections_than_max_connections(store_url: str) -> None:
    """40 async callers, 48 threads of a sync tool (each with a connection of its own where it can), a waiter
    listening for another claim's outcome, and the ledger, in one worker with ``max_connections=6``: the server
    never sees more than 6 of its backends at once, and every key ran once."""
    database = make_url(store_url).database
    assert database
    runs: dict[str, int] = {}
    lock = threading.Lock()
    stop, seen = asyncio.Event(), []
    sampler = asyncio.create_task(_backends(pg_dsn(PG_URL), database, stop, seen))
    try:
        async with Guard(store_url, max_connections=6, pool_size=2) as guard, \
                Guard(store_url, max_connections=1) as holder:  # (the other worker, its claim held: one connection)
            started, finish = asyncio.Event(), asyncio.Event()

            @holder.once(operation="held", key=["order"])
            async def held(order: str) -> str:
                started.set()
                await finish.wait()
                return order

            @guard.once(operation="held", key=["order"])
            async def wait_for_held(order: str) -> str:
                raise AssertionError("the waiter ran the body")

            @guard.once(key=["order"])
            async def charge(order: str) -> str:
                with lock:
                    runs[order] = runs.get(order, 0) + 1
                await asyncio.sleep(0.005)
                return order

            @guard.once(key=["order"])
            def refund(order: str) -> str:
                with lock:
                    runs[order] = runs.get(order, 0) + 1
                return order

            t = tid()

            def sync_call(i: int) -> str:
                with task(t):
                    return refund(f"s{i % 24}")

            async def async_call(i: int) -> str:
                with task(t):
                    return await charge(f"a{i % 20}")

            with task(t):
                holding = asyncio.create_task(held("h"))
                await started.wait()
                waiter = asyncio.create_task(wait_for_held("h"))
            results = await asyncio.gather(*(async_call(i) for i in range(40)),
                                           *(asyncio.to_thread(sync_call, i) for i in range(48)))
            finish.set()
            assert await holding == "h" and await waiter == "h"
    finally:
        stop.set()
        await sampler
    assert results == [f"a{i % 20}" for i in range(40)] + [f"s{i % 24}" for i in range(48)]
    assert runs == {**{f"a{i}": 1 for i in range(20)}, **{f"s{i}": 1 for i in range(24)}}
    # The worker's 6 and the other worker's 1 (the server names both "agentguard"): never 37 to 41, as before.
    assert max(seen) <= 6 + 1


# How long a call waits for the budget's connection (``connect_timeout``): also the time the connection that is then
# free may take to open, which a loaded machine can stretch well past half a second.
WAIT = 2.0


async def test_past_the_budget_a_call_waits_its_turn_then_fails_before_the_body(store_url: str) -> None:
    """Every connection of the budget held (here: the one, by a transaction of the caller's own): a call waits
    ``connect_timeout`` for one, then fails with a StoreError saying so, before its body; once one is free, the
    same call runs, once."""
    runs = 0
    store = SQLStore(store_url, max_connections=1, connect_timeout=WAIT)
    async with Guard(store=store) as guard:

        @guard.once
        async def charge(amount: int) -> int:
            nonlocal runs
            runs += 1
            return amount

        await store.ensure_schema()
        t = tid()
        async with store.engine().connect() as busy:  # (the budget's only connection)
            await busy.exec_driver_sql("SELECT 1")
            with task(t), pytest.raises(StoreError, match="max_connections") as refused:
                await charge(5)
        assert not refused.value.body_ran and refused.value.transient
        assert runs == 0
        with task(t):
            assert await charge(5) == 5
    assert runs == 1


async def test_the_budget_is_shared_by_every_event_loop_of_the_worker(store_url: str) -> None:
    """The budget's one connection in use on another event loop (another thread's): a call here waits its turn in
    the budget's line for ``connect_timeout``, then fails before its body, naming max_connections; once the other
    loop is done (its engine gone with its loop), the call runs, once."""
    runs = 0
    store = SQLStore(store_url, max_connections=1, connect_timeout=WAIT)
    holding, release = threading.Event(), threading.Event()

    async def hold() -> None:
        async with store.engine().connect() as busy:
            await busy.exec_driver_sql("SELECT 1")
            holding.set()
            await asyncio.to_thread(release.wait, 60)

    other = threading.Thread(target=asyncio.run, args=(hold(),))
    async with Guard(store=store) as guard:

        @guard.once
        async def charge(amount: int) -> int:
            nonlocal runs
            runs += 1
            return amount

        await store.ensure_schema()
        await store.dispose()  # (the schema's connection: this loop holds none)
        other.start()
        try:
            assert await asyncio.to_thread(holding.wait, 60)
            t = tid()
            with task(t), pytest.raises(StoreError, match="max_connections") as refused:
                await charge(7)
            assert not refused.value.body_ran and refused.value.transient
            assert runs == 0
        finally:
            release.set()
            await asyncio.to_thread(other.join, 60)
        with task(t):
            assert await charge(7) == 7
    assert runs == 1


@pytest.mark.parametrize("query", ["statement_cache_size=0", "prepared_statement_cache_size=0"])
async def test_the_cache_settings_people_add_for_pgbouncer_work_too(query: str, store_url: str, tmp_path: Path) -> None:
    """The URL query parameters that guides suggest for PgBouncer (a number, given as text in the URL) are taken
    as they are meant, never a bare TypeError; the calls run once each through transaction pooling."""
    runs: dict[int, int] = {}
    with bouncer(tmp_path, store_url, "transaction", pool_size=4) as url:
        async with Guard(f"{url}?{query}") as guard:

            @guard.once(key=["n"])
            async def charge(n: int) -> int:
                runs[n] = runs.get(n, 0) + 1
                return n

            with task(tid()):
                got = await asyncio.gather(*(charge(i % 8) for i in range(32)))
    assert got == [i % 8 for i in range(32)]
    assert runs == {i: 1 for i in range(8)}
