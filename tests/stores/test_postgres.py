"""Postgres-only: a real server whose connections are killed, that refuses connections mid-call, under
64 concurrent callers; and the round trips each step costs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import make_url

from agentguard import Guard, GuardEvent, StoreError, task
from agentguard.stores import SQLStore

from conftest import PG_URL, pg_dsn, tid

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]



async def admin(sql: str, url: str = PG_URL) -> list[Any]:
    import asyncpg

    conn = await asyncpg.connect(pg_dsn(url))
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


async def test_pg_terminate_backend_mid_call_runs_once(store_url: str) -> None:
    events: list[GuardEvent] = []
    db = make_url(store_url).database
    runs = 0
    async with Guard(store_url, on_event=events.append) as guard:

        @guard.once
        async def charge(amount: int) -> dict[str, int]:
            nonlocal runs
            runs += 1
            killed = await admin(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'"
                " AND application_name = 'agentguard'"
            )
            assert killed, "the guard's pooled connection should have been there to kill"
            return {"amount": amount}

        with task(tid()):
            assert await charge(10) == {"amount": 10}  # stored over a fresh connection
            assert await charge(10) == {"amount": 10}  # replayed
    assert runs == 1
    assert [e.kind for e in events if e.kind in ("completed", "replayed")] == ["completed", "replayed"]


async def test_database_refusing_connections_mid_call_fails_closed(store_url: str) -> None:
    db = make_url(store_url).database
    keys: list[str] = []
    async with Guard(store_url, lease=1.0, connect_timeout=3) as guard:

        @guard.once
        async def charge(amount: int, idempotency_key: str = "") -> int:
            keys.append(idempotency_key)
            if len(keys) == 1:
                await admin(f"ALTER DATABASE {db} ALLOW_CONNECTIONS false")
                await admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'")
            return amount

        with task(tid()):
            try:
                with pytest.raises(StoreError) as info:
                    await charge(3)
            finally:
                await admin(f"ALTER DATABASE {db} ALLOW_CONNECTIONS true")
            assert info.value.body_ran and "held" in str(info.value)
            assert await charge(3) == 3  # after the lease: takeover with the same downstream key
            assert await charge(3) == 3
    assert len(keys) == 2 and keys[0] == keys[1]


async def test_sixty_four_concurrent_distinct_keys(store_url: str) -> None:
    runs: set[str] = set()
    async with Guard(store_url, pool_size=8) as guard:

        @guard.once(key=["order_id"])
        async def charge(order_id: str, amount: int) -> str:
            runs.add(order_id)
            await asyncio.sleep(0.01)
            return order_id

        with task(tid()):
            orders = [f"o-{i}" for i in range(64)]
            results = await asyncio.gather(*(charge(o, 100) for o in orders))
            again = await asyncio.gather(*(charge(o, 100) for o in orders))
    assert results == orders == again and len(runs) == 64


async def logged() -> None:
    """asyncpg calls query loggers soon after the query, not inside it: let them run."""
    for _ in range(5):
        await asyncio.sleep(0)


def log_statements(store: SQLStore) -> list[str]:
    """Every statement the store's connections send to the server (asyncpg's query logger)."""
    statements: list[str] = []
    engine = store.engine()

    def on_connect(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.driver_connection.add_query_logger(
            lambda q: statements.append("CLAIM" if "agentguard_calls_claim_" in q.query else q.query.split()[0])
        )

    event.listen(engine.sync_engine, "connect", on_connect)
    return statements


async def test_each_path_sends_the_statements_that_cost_least_for_what_is_likely(store_url: str) -> None:
    store = SQLStore(store_url)
    async with Guard(store=store, cache_size=0) as guard:  # (the lease as shipped: no renewal between two steps)
        statements = log_statements(store)

        @guard.once
        async def charge(amount: int) -> int:
            return amount

        @guard.once
        async def flaky(amount: int) -> int:
            raise ConnectionError("provider down")

        with task(tid()):
            await guard.ensure_schema()
            await logged()
            statements.clear()
            await charge(1)
            await logged()
            first, statements[:] = list(statements), []
            await charge(1)
            await logged()
            replay, statements[:] = list(statements), []
            await charge(1)
            await logged()
            replay_next, statements[:] = list(statements), []
            with pytest.raises(ConnectionError):
                await flaky(1)
            await logged()
            failed, statements[:] = list(statements), []
            with pytest.raises(ConnectionError):
                await flaky(1)
            await logged()
            retried = list(statements)
    # (A completion or release is an UPDATE in a WITH that announces the record if a waiter watches it.)
    # A first call is likely: the plain claim (the read-or-claim function costs the server more), complete.
    assert first == ["INSERT", "WITH"]
    assert replay == ["INSERT", "SELECT"]  # the claim finds the key taken; a read returns the completed record
    # The task is replaying now: its next call reads first, with a plain SELECT, which serves a replay ...
    assert replay_next == ["SELECT"]
    # ... and costs a first call one extra read, once: the miss ends the task's replaying.
    assert failed == ["SELECT", "INSERT", "WITH"]  # read, claim, release
    assert retried == ["INSERT", "SELECT", "UPDATE", "WITH"]  # claim (taken), read (released), take over, release


async def test_a_worker_resuming_agent_after_agent_reads_first_for_each_new_task(store_url: str) -> None:
    """Most claims of a process lately found their key taken (a worker restarted, resuming agent after agent, each
    first call a replay): a new task's first call reads first too — one SELECT, not an insert and then a read.
    Back to new work, a new task's first call inserts first again after a few extra reads."""
    resumed_tasks, new_tasks = [tid() for _ in range(16)], [tid() for _ in range(16)]
    async with Guard(store_url, ledger=False) as earlier:

        @earlier.once
        async def charge(amount: int) -> int:
            return amount

        for t in resumed_tasks:
            with task(t):
                await charge(1)
    store = SQLStore(store_url)
    runs = 0
    async with Guard(store=store, cache_size=0, ledger=False) as guard:
        statements = log_statements(store)

        @guard.once
        async def charge(amount: int) -> int:  # type: ignore[no-redef]
            nonlocal runs
            runs += 1
            return amount

        await guard.ensure_schema()
        seen: dict[str, list[list[str]]] = {"resumed": [], "new": []}
        for path, tasks in (("resumed", resumed_tasks), ("new", new_tasks)):
            for t in tasks:
                await logged()
                statements.clear()
                with task(t):
                    assert await charge(1) == 1
                await logged()
                seen[path].append(list(statements))
    assert runs == len(new_tasks)  # every resumed task's call a replay, every new task's a run
    insert_then_read, read = ["INSERT", "SELECT"], ["SELECT"]
    resumed = seen["resumed"]
    assert set(map(tuple, resumed)) == {tuple(insert_then_read), tuple(read)}, resumed
    switch = resumed.index(read)  # from a fresh process's guess (insert first) to the read first, once, for good
    assert 0 < switch < len(resumed) // 2 and resumed[switch:] == [read] * (len(resumed) - switch), resumed
    read_then_insert, insert = ["SELECT", "INSERT", "WITH"], ["INSERT", "WITH"]
    new = seen["new"]
    assert set(map(tuple, new)) == {tuple(read_then_insert), tuple(insert)}, new
    back = new.index(insert)  # and back, once, for good: each guess wrong cost one read
    assert 0 < back < len(new) // 2 and new[back:] == [insert] * (len(new) - back), new


async def test_a_cached_replay_costs_no_statement(store_url: str) -> None:
    store = SQLStore(store_url)
    async with Guard(store=store) as guard:
        statements = log_statements(store)

        @guard.once
        async def charge(amount: int) -> int:
            return amount

        with task(tid()):
            await charge(1)
            await logged()
            assert statements  # the logger sees the first call
            statements.clear()
            assert [await charge(1) for _ in range(5)] == [1] * 5
            await logged()
    assert statements == []


async def test_schema_has_the_sweeper_index_and_a_state_check(store_url: str) -> None:
    async with Guard(store_url) as guard:
        await guard.ensure_schema()
    rows = await admin("SELECT indexname FROM pg_indexes WHERE tablename = 'agentguard_calls'", store_url)
    assert {r["indexname"] for r in rows} >= {"agentguard_calls_pkey", "agentguard_calls_expires_idx"}
    with pytest.raises(Exception, match="check"):
        await admin(
            "INSERT INTO agentguard_calls (scope, key, task_id, operation, fingerprint, arg_hashes, state, fence,"
            " origin, tool, attempts, created_at, updated_at, expires_at)"
            " VALUES ('s','k','t','o','f','{}','bogus',1,1,'o',1,0,0,0)",
            store_url,
        )



@pytest.mark.postgres
async def test_whitebox_the_sweep_finds_expired_records_through_the_index(store_url: str) -> None:
    """With the clock read once per statement (a sub-select), Postgres can use the expires_at index: a sweep
    with nothing to delete costs the same on a large table as on a small one, instead of a scan."""
    import asyncpg

    from conftest import pg_dsn

    store = SQLStore(store_url)
    await store.ensure_schema()
    sql, args = store._executor._compiled(store.sql.sweep, store.engine())
    await store.dispose()
    conn = await asyncpg.connect(pg_dsn(store_url))
    try:
        await conn.execute(
            "INSERT INTO agentguard_calls (scope, key, task_id, operation, fingerprint, arg_hashes, state, fence,"
            " origin, tool, attempts, created_at, updated_at, expires_at) SELECT 'default', 'ag_' || i, 't', 'op',"
            " 'fp', '{}', 'succeeded', i, i, 'op', 1, 0, 0, extract(epoch from clock_timestamp()) + 86400"
            " FROM generate_series(1, 50000) AS i"
        )
        await conn.execute("ANALYZE agentguard_calls")
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, *args({"batch": 1000})))
    finally:
        await conn.close()
    assert "agentguard_calls_expires_idx" in plan and "Seq Scan" not in plan, plan
