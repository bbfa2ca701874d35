"""Postgres as teams configure it, not as a fresh ``initdb`` leaves it: every default is set on the test's own
database (``ALTER DATABASE ... SET``) or role, and real workers — processes, roles, sessions — meet it.

- ``default_transaction_isolation`` serializable or repeatable read: six worker processes whose first calls all
  meet one another making the schema;
- ``search_path = app, public``: a store made in ``public`` before the application's schema existed, and one made
  after;
- a second role, with table rights on a schema it may or may not create in (an administrator ran
  ``agentguard migrate --sql``), and one that lacks a right a completion needs (refused before any body);
- a small ``statement_timeout`` and ``idle_in_transaction_session_timeout``: still one execution, failing closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

from agentguard import INJECTED, Guard, InProgressError, Operation, StoreError, task

from conflicts import claim_after_a_serialization_failure
from conftest import PG_URL, ROOT, pg_dsn, tid

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

WORKER = Path(__file__).resolve().parents[1] / "first_calls_worker.py"


async def run_sql(url: str, sql: str) -> list[Any]:
    """``sql`` on ``url``'s database: its rows, or none for a script of many statements."""
    import asyncpg

    conn = await asyncpg.connect(pg_dsn(url))
    try:
        if ";" in sql:
            await conn.execute(sql)
            return []
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


def database_of(url: str) -> str:
    name = make_url(url).database
    assert name
    return name


def as_role(url: str, role: str) -> str:
    return make_url(url).set(username=role).render_as_string(hide_password=False)


@pytest.fixture
async def role(store_url: str) -> AsyncIterator[str]:
    """A role of its own (roles are the cluster's: a unique name), that may log in and is nothing more."""
    name = "r_" + uuid.uuid4().hex[:12]
    await run_sql(PG_URL, f"CREATE ROLE {name} LOGIN")
    try:
        yield name
    finally:
        # What it was granted in the test's database, then the role (its sessions first: a guard left open).
        await run_sql(PG_URL, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{name}'")
        await run_sql(store_url, f"DROP OWNED BY {name}")
        await run_sql(PG_URL, f"DROP ROLE {name}")


def counting_tools(guard: Guard, effects: list[str]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    @guard.once(key="order_id")
    async def charge(order_id: str, idempotency_key: str = "") -> str:
        effects.append(idempotency_key)
        return f"ch-{order_id}"

    @guard.once(key="order_id")
    def charge_sync(order_id: str, idempotency_key: str = "") -> str:
        effects.append(idempotency_key)
        return f"ch-{order_id}"

    return charge, charge_sync


async def charge_twice_each(url: str, orders: int = 3) -> list[str]:
    """``orders`` first calls and their replays, async and sync tools, on a guard of ``url``: the effects."""
    effects: list[str] = []
    async with Guard(url) as guard:
        charge, charge_sync = counting_tools(guard, effects)
        with task(tid()):
            for i in range(orders):
                for _ in range(2):
                    assert await charge(f"o-{i}") == f"ch-o-{i}"
                    assert await asyncio.to_thread(charge_sync, f"s-{i}") == f"ch-s-{i}"
    return effects


# -- isolation ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["serializable", "repeatable read"])
def test_six_workers_starting_at_once_under_a_stricter_default_isolation_all_run_once(
    store_url: str, tmp_path: Path, isolation: str,
) -> None:
    asyncio.run(run_sql(PG_URL, f"ALTER DATABASE {database_of(store_url)} SET default_transaction_isolation"
                                f" = '{isolation}'"))
    assert asyncio.run(run_sql(store_url, "SHOW default_transaction_isolation"))[0][0] == isolation
    effects, calls = tmp_path / "effects", 12
    workers = [
        subprocess.Popen([sys.executable, str(WORKER), store_url, tid(), str(effects), str(calls)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(6)
    ]
    try:
        for w in workers:
            assert w.stdout is not None and w.stdout.readline().strip() == "ready"
        for w in workers:  # the barrier: every worker's first calls go at once
            assert w.stdin is not None
            w.stdin.write("go\n")
            w.stdin.flush()
        outcomes = [json.loads(w.communicate(timeout=60)[0]) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    assert [o["errors"] for o in outcomes] == [[]] * 6, outcomes
    assert sum(o["ok"] for o in outcomes) == 6 * calls
    ran = effects.read_text().split()
    assert len(ran) == len(set(ran)) == 6 * calls  # each call's body exactly once


@pytest.mark.parametrize("tool", ["async", "sync"])
async def test_a_claim_refused_by_a_serialization_failure_runs_again_and_replays_the_record_that_won(
    store_url: str, tool: str,
) -> None:
    """Under ``default_transaction_isolation = serializable``, a claim's insert waits for another session's
    uncommitted insert of the same key; when that commits, the claim's snapshot cannot see the record and the
    server refuses the insert (40001), having done nothing. The store runs it again: a new snapshot sees the
    record, and the call replays it, its body never run (``conflicts.py``; with no retries the same interleaving
    is refused: ``tests/whitebox/test_conflict_retries.py``)."""
    assert await claim_after_a_serialization_failure(store_url, tool) == "ch-o-1"


# -- search path -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("made", ["before the application's schema", "after it"])
async def test_a_search_path_of_the_applications_schema_then_public(store_url: str, made: str) -> None:
    db = database_of(store_url)
    if made == "after it":
        await run_sql(store_url, "CREATE SCHEMA app")
        await run_sql(PG_URL, f"ALTER DATABASE {db} SET search_path = app, public")
    assert len(await charge_twice_each(store_url)) == 6
    if made == "before the application's schema":
        await run_sql(store_url, "CREATE SCHEMA app")
        await run_sql(PG_URL, f"ALTER DATABASE {db} SET search_path = app, public")
        # a new guard finds the store where it is (public), complete, and alters nothing
        assert len(await charge_twice_each(store_url)) == 6
    where = "public" if made == "before the application's schema" else "app"
    tables = await run_sql(store_url, "SELECT table_schema, table_name FROM information_schema.tables"
                                      " WHERE table_name LIKE 'agentguard%' ORDER BY table_name")
    assert [tuple(t) for t in tables] == [(where, "agentguard_attempts"), (where, "agentguard_calls"),
                                          (where, "agentguard_ledger_chains"), (where, "agentguard_ledger_keys"),
                                          (where, "agentguard_steps")]


# -- roles -------------------------------------------------------------------------------------------------


# The records' task index, and the one a store made before it has (scope first).
TASK_INDEX, OLD_TASK_INDEX = "agentguard_calls_by_task_idx", "agentguard_calls_task_idx"


def grants_sql(role: str, *, create: bool) -> str:
    return (f"GRANT USAGE{', CREATE' if create else ''} ON SCHEMA public TO {role};"
            f" GRANT SELECT, INSERT, UPDATE, DELETE ON agentguard_calls, agentguard_steps, agentguard_ledger_chains,"
            f" agentguard_ledger_keys TO {role};"
            f" GRANT SELECT, INSERT, DELETE ON agentguard_attempts TO {role};"
            f" GRANT USAGE ON SEQUENCE agentguard_attempts_id_seq TO {role}")


async def test_a_second_role_with_usage_create_and_table_rights_runs_and_replays(
    store_url: str, role: str,
) -> None:
    assert len(await charge_twice_each(store_url)) == 6  # the owner made the store
    await run_sql(store_url, grants_sql(role, create=True))
    effects = await charge_twice_each(as_role(store_url, role))
    assert len(effects) == len(set(effects)) == 6
    # and the owner's records replay to the second role
    async with Guard(as_role(store_url, role)) as guard:
        mine: list[str] = []
        charge, _ = counting_tools(guard, mine)
        with task("t-shared"):
            assert await charge("o-shared") == "ch-o-shared"
    async with Guard(store_url) as guard:
        charge, _ = counting_tools(guard, mine)
        with task("t-shared"):
            assert await charge("o-shared") == "ch-o-shared"
    assert len(mine) == 1


async def migrate(url: str, *options: str) -> str:
    """What ``agentguard migrate --url URL OPTIONS`` prints."""
    out = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "agentguard.cli", "migrate", "--url", url, *options],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=60)
    return out.stdout


async def test_a_role_without_create_works_on_a_schema_an_administrator_made_with_migrate_sql(
    store_url: str, role: str,
) -> None:
    await run_sql(store_url, f"GRANT USAGE ON SCHEMA public TO {role}")  # (no CREATE)
    worker_url = as_role(store_url, role)
    # Nothing made yet: refused before any body, saying what to hand over.
    effects: list[str] = []
    async with Guard(worker_url) as guard:
        charge, _ = counting_tools(guard, effects)
        with task(tid()), pytest.raises(StoreError) as refused:
            await charge("o-1")
    assert effects == []
    assert f"the role {role} may not create the store's table agentguard_calls" in str(refused.value)
    assert "agentguard migrate --sql" in str(refused.value) and "the tool was not run" in str(refused.value)
    assert await run_sql(store_url, "SELECT to_regclass('agentguard_calls')") == [(None,)]
    # The administrator runs what `migrate --sql --grant` prints (one transaction), as themself.
    await run_sql(store_url, await migrate(store_url, "--sql", "--grant", role))
    effects = await charge_twice_each(worker_url)
    assert len(effects) == len(set(effects)) == 6
    owners = await run_sql(store_url, "SELECT DISTINCT tableowner FROM pg_tables WHERE tablename LIKE 'agentguard%'")
    assert owners == [(make_url(store_url).username,)]
    # `migrate` itself (no --sql) finds nothing to make and changes nothing
    assert "the store's tables are ready" in await migrate(store_url)


async def test_a_role_on_a_store_with_the_old_task_index_works_and_is_told_how(
    store_url: str, role: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A store made before the task index came first (``_schema.TASK_INDEX``), by its owner: a worker's role
    goes on (the old index risks a slow read, never a wrong answer) and is told what to run; what
    ``migrate --sql`` prints, run by the owner, replaces it."""
    assert len(await charge_twice_each(store_url)) == 6  # the owner made the store
    await run_sql(store_url, f"DROP INDEX {TASK_INDEX}; CREATE INDEX {OLD_TASK_INDEX} ON agentguard_calls"
                             " (scope, task_id, created_at)")
    await run_sql(store_url, grants_sql(role, create=False))
    with caplog.at_level(logging.WARNING, logger="agentguard"):
        effects = await charge_twice_each(as_role(store_url, role))
    assert len(effects) == len(set(effects)) == 6
    (warned,) = {r.getMessage() for r in caplog.records if OLD_TASK_INDEX in r.getMessage()}
    assert "agentguard migrate" in warned
    indexes = "SELECT indexname FROM pg_indexes WHERE tablename = 'agentguard_calls' ORDER BY 1"
    assert (OLD_TASK_INDEX,) in [tuple(r) for r in await run_sql(store_url, indexes)]
    await run_sql(store_url, await migrate(store_url, "--sql"))  # the administrator, as the owner
    names = [r[0] for r in await run_sql(store_url, indexes)]
    assert TASK_INDEX in names and OLD_TASK_INDEX not in names


async def test_migrate_sql_makes_the_same_store_as_the_guard(store_url: str) -> None:
    await run_sql(store_url, await migrate(store_url, "--sql"))
    described = ("SELECT table_name, column_name, data_type, is_nullable, column_default"
                 " FROM information_schema.columns WHERE table_name LIKE 'agentguard%' ORDER BY 1, 2")
    indexes = "SELECT indexname, indexdef FROM pg_indexes WHERE tablename LIKE 'agentguard%' ORDER BY 1"
    triggers = ("SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(t.oid), p.prosrc FROM pg_trigger t"
                " JOIN pg_proc p ON p.oid = t.tgfoid WHERE NOT tgisinternal ORDER BY 1, 2")
    statements = (described, indexes, triggers)
    by_migrate = [await run_sql(store_url, sql) for sql in statements]
    assert [tuple(r)[:2] for r in by_migrate[2]] == [("agentguard_calls", "agentguard_calls_leave_keys")]
    await run_sql(store_url, "DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    assert len(await charge_twice_each(store_url)) == 6  # the guard makes it
    assert [await run_sql(store_url, sql) for sql in statements] == by_migrate


async def test_a_role_that_may_not_update_the_records_is_refused_before_any_body(
    store_url: str, role: str,
) -> None:
    assert len(await charge_twice_each(store_url)) == 6
    await run_sql(store_url, grants_sql(role, create=False) + f"; REVOKE UPDATE ON agentguard_calls FROM {role}")
    effects: list[str] = []
    async with Guard(as_role(store_url, role)) as guard:
        charge, charge_sync = counting_tools(guard, effects)
        with task(tid()):
            with pytest.raises(StoreError) as refused:
                await charge("o-1")
            with pytest.raises(StoreError):
                await asyncio.to_thread(charge_sync, "s-1")
    # the claim would have been granted and the completion refused, after the body (left for a takeover)
    assert effects == []
    assert f"the role {role} lacks privileges every call needs: UPDATE on table agentguard_calls" in str(
        refused.value)
    assert "the tool was not run" in str(refused.value)


async def test_a_database_whose_transactions_are_read_only_by_default_is_refused_before_any_body(
    store_url: str,
) -> None:
    assert len(await charge_twice_each(store_url)) == 6
    await run_sql(PG_URL, f"ALTER DATABASE {database_of(store_url)} SET default_transaction_read_only = on")
    effects: list[str] = []
    async with Guard(store_url) as guard:
        charge, charge_sync = counting_tools(guard, effects)
        with task(tid()):
            for call in (charge("o-1"), asyncio.to_thread(charge_sync, "s-1")):
                with pytest.raises(StoreError, match="read-only: default_transaction_read_only is on") as refused:
                    await call
                assert "the tool was not run" in str(refused.value)
    assert effects == []


# -- timeouts ----------------------------------------------------------------------------------------------


async def test_a_small_statement_timeout_fails_closed_before_and_after_the_body(store_url: str) -> None:
    assert len(await charge_twice_each(store_url)) == 6  # the schema, made before the timeout is set
    await run_sql(PG_URL, f"ALTER DATABASE {database_of(store_url)} SET statement_timeout = '100ms'")
    import asyncpg

    blocker = await asyncpg.connect(pg_dsn(store_url))
    effects: list[str] = []
    try:
        async with Guard(store_url, lease=30, outage_window=1, on_conflict="raise") as guard:
            charge, _ = counting_tools(guard, effects)

            @guard.once(key="order_id")
            async def charge_locking(order_id: str, idempotency_key: str = "") -> str:
                effects.append(idempotency_key)
                # the record's row locked (by someone else's transaction) until the test lets it go: the
                # completion waits for it, and the server cancels it after 100 ms, again and again
                await blocker.execute("BEGIN; SELECT 1 FROM agentguard_calls WHERE operation LIKE '%o-after%'"
                                      " FOR UPDATE")
                return "ch"

            with task(tid()):
                # before the body: the claim's insert waits for the table a migration locked, and is cancelled
                await blocker.execute("BEGIN; LOCK TABLE agentguard_calls IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(StoreError) as before:
                    await charge("o-before")
                assert "the tool was not run" in str(before.value) and not before.value.body_ran
                await blocker.execute("ROLLBACK")
                assert effects == []
                assert await charge("o-before") == "ch-o-before"
                # after the body: its completion cancelled for longer than the outage window; held, not re-run
                with pytest.raises(StoreError) as after:
                    await charge_locking("o-after")
                assert after.value.body_ran and "canceling statement due to statement timeout" in str(after.value)
                with pytest.raises(InProgressError):
                    await charge_locking("o-after")
                await blocker.execute("ROLLBACK")
                with pytest.raises(InProgressError):  # (its lease still live: never a second run)
                    await charge_locking("o-after")
    finally:
        await blocker.close()
    assert len(effects) == 2


@pytest.mark.slow
async def test_a_small_idle_in_transaction_timeout_ends_no_session_of_the_stores_and_a_killed_one_commits_nothing(
    store_url: str,
) -> None:
    await run_sql(store_url, "CREATE TABLE rides (id text PRIMARY KEY)")
    await run_sql(PG_URL, f"ALTER DATABASE {database_of(store_url)} SET idle_in_transaction_session_timeout = '1s'")
    idle: list[Any] = []
    effects: list[str] = []
    slow = [True]  # the first attempt's transaction sits idle past the timeout: the server ends its session
    async with Guard(store_url) as guard:

        @guard.once(key="order_id")
        async def ride(order_id: str, op: Operation = INJECTED) -> list[str]:
            async def create(conn: AsyncConnection) -> str:
                await conn.execute(text("INSERT INTO rides VALUES (:id)"), {"id": order_id})
                if slow.pop() if slow else False:
                    await asyncio.sleep(1.5)
                return order_id

            done = [await op.transaction("create", create)]
            for name in ("charge", "receipt"):
                done.append(await op.step(name, step, op.key(name), name))
                # no session of the store's is left in a transaction while a body or a step runs
                idle.extend(await run_sql(store_url, "SELECT pid FROM pg_stat_activity WHERE state LIKE"
                                                     " 'idle in transaction%' AND datname = current_database()"))
            return done

        async def step(key: str, name: str) -> str:
            effects.append(key)
            await asyncio.sleep(1.5)  # longer than the timeout
            return name

        with task(tid()):
            with pytest.raises(StoreError) as killed:  # (the connection closed under the transaction)
                await ride("o-1")
            assert killed.value.body_ran
            assert await run_sql(store_url, "SELECT id FROM rides") == []  # (rolled back with its step)
            assert await ride("o-1") == ["o-1", "charge", "receipt"]
            assert await ride("o-1") == ["o-1", "charge", "receipt"]
    assert idle == [] and len(effects) == len(set(effects)) == 2
    assert [tuple(r) for r in await run_sql(store_url, "SELECT id FROM rides")] == [("o-1",)]
