"""A completion moves its record's expiry only forward (``_statements.COMPLETED``). A claim writes a margin past the
retention (``_machine.claim_retention``); a body that ends within it completes without changing the expiry, which
on Postgres makes the completion a HOT update (the record's page alone: no index entry written); a longer body's
completion moves the expiry to the retention from its outcome. Either way a record is kept at least its retention
after its outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from agentguard import Guard, task
from agentguard._machine import claim_retention

from conftest import BACKEND, pg_dsn

pytestmark = pytest.mark.anyio


async def times(url: str) -> list[tuple[float, float, float]]:
    """(created_at, updated_at, expires_at) of every record, oldest first."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            got = await conn.execute(
                text("SELECT created_at, updated_at, expires_at FROM agentguard_calls ORDER BY created_at"))
            return [(float(c), float(u), float(e)) for c, u, e in got]
    finally:
        await engine.dispose()


def charge_tool(guard: Guard, pause: float = 0.0) -> Callable[..., Any]:
    @guard.once(key=["order_id"], operation="charge")
    async def charge(order_id: str) -> dict[str, str]:
        await asyncio.sleep(pause)
        return {"charge_id": f"ch_{order_id}"}

    return charge


async def test_a_quick_bodys_completion_keeps_the_claims_expiry(make_guard: Callable[..., Guard],
                                                                store_url: str) -> None:
    retention, lease = 1_000_000.0, 3600.0  # a margin of an hour: every body here ends within it
    charge = charge_tool(make_guard(retention=retention, lease=lease))
    with task("quick"):
        await charge("o1")
    [(created, updated, expires)] = await times(store_url)
    # the claim's expiry, as the claim wrote it: its retention and the margin from the claim
    assert expires - created == pytest.approx(claim_retention(retention, lease), abs=0.01)
    assert expires - created == pytest.approx(retention + lease, abs=0.01)
    assert expires - updated >= retention  # kept at least its retention after its outcome


async def test_a_long_bodys_completion_moves_the_expiry_to_retention_from_its_outcome(
        make_guard: Callable[..., Guard], store_url: str) -> None:
    retention = 10.0  # a margin of a tenth of a second (a hundredth of the retention): the body takes longer
    charge = charge_tool(make_guard(retention=retention, lease=30.0), pause=0.5)
    with task("long"):
        await charge("o1")
    [(created, updated, expires)] = await times(store_url)
    assert updated - created >= 0.5
    assert expires - updated == pytest.approx(retention, abs=0.01)
    assert expires > created + claim_retention(retention, 30.0)


@pytest.mark.skipif(BACKEND != "postgres", reason="Postgres-only test (AGENTGUARD_TEST_BACKEND=postgres)")
async def test_quick_completions_are_hot_updates_on_postgres(store_url: str) -> None:
    """Counted by the server: every completion within the margin is a HOT update (a few records on a new table:
    each completion's new version fits in its record's page). With the expiry written anew by every completion,
    none is."""
    import asyncpg

    guard = Guard(store_url, retention=1_000_000.0, lease=3600.0)
    try:
        charge = charge_tool(guard)
        with task("hot"):
            for n in range(5):
                await charge(f"o{n}")
    finally:
        await guard.aclose()  # (its sessions end, and each reports its counts to the server as it ends)
    conn = await asyncpg.connect(pg_dsn(store_url))
    try:
        for _ in range(600):  # until the ended sessions' counts arrive (a state, not a time)
            updates, hot = await conn.fetchrow(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'agentguard_calls'::regclass")
            if updates >= 5:
                break
            await asyncio.sleep(0.05)
        assert (updates, hot) == (5, 5)
    finally:
        await conn.close()
