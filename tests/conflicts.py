"""A claim that meets a serialization failure on purpose (Postgres), for ``tests/stores/test_pg_defaults.py`` and
``tests/whitebox/test_conflict_retries.py``.

Under ``default_transaction_isolation = serializable`` (set on the test's own database), a claim's insert waits
for another session's uncommitted insert of the same key (the record of a completed call, taken out and put back
inside that session's open transaction); once the claim waits (``pg_stat_activity``), the other session commits.
The claim's snapshot cannot see the record, and the server refuses the insert with a serialization failure
(40001), having done nothing. What the call then answers is the store's to decide.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from agentguard import Guard, task

from conftest import PG_URL, pg_dsn, tid


async def claim_after_a_serialization_failure(store_url: str, tool: str) -> str:
    """The answer of a call (``tool``: "async", or "sync" in a thread) of ``charge("o-1")`` whose claim met the
    serialization failure; raises what the call raised. Asserts that no body ran for it."""
    admin = await asyncpg.connect(pg_dsn(PG_URL))
    try:
        await admin.execute(f"ALTER DATABASE {make_url(store_url).database} "
                            "SET default_transaction_isolation = 'serializable'")
    finally:
        await admin.close()
    ran: list[str] = []

    def tools(guard: Guard) -> tuple[Callable[..., Any], Callable[..., Any]]:
        @guard.once(key="order_id")
        async def charge(order_id: str) -> str:
            ran.append(order_id)
            return f"ch-{order_id}"

        @guard.once(key="order_id", operation="charge")
        def charge_sync(order_id: str) -> str:
            ran.append(order_id)
            return f"ch-{order_id}"

        return charge, charge_sync

    def call(charge: Callable[..., Any], charge_sync: Callable[..., Any], order: str) -> asyncio.Future[str]:
        return asyncio.ensure_future(charge(order) if tool == "async" else asyncio.to_thread(charge_sync, order))

    t = tid()
    async with Guard(store_url) as first:  # the record that will win
        with task(t):
            assert await call(*tools(first), "o-1") == "ch-o-1"
    other = await asyncpg.connect(pg_dsn(store_url))
    watcher = await asyncpg.connect(pg_dsn(store_url))
    try:
        await other.execute(f"CREATE TEMP TABLE won AS SELECT * FROM agentguard_calls WHERE task_id = '{t}'")
        await other.execute(f"DELETE FROM agentguard_calls WHERE task_id = '{t}'")
        async with Guard(store_url) as guard:
            charge, charge_sync = tools(guard)
            with task(tid()):  # (the guard's connections open, at the database's default isolation)
                assert await call(charge, charge_sync, "o-warm") == "ch-o-warm"
            holding = other.transaction()
            await holding.start()
            await other.execute("INSERT INTO agentguard_calls SELECT * FROM won")  # the same key, uncommitted
            with task(t):
                answer = call(charge, charge_sync, "o-1")
                for _ in range(3000):  # until the claim's insert waits for the uncommitted one
                    if await watcher.fetchval("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                              " AND datname = current_database()"):
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("the claim never waited for the uncommitted record")
                await holding.commit()
                try:
                    return await answer
                finally:
                    assert ran == ["o-1", "o-warm"]  # the first guard's run and the warm-up; never this call's
    finally:
        await other.close()
        await watcher.close()
