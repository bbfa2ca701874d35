"""Postgres-only: first calls' claims, and completions, gathered into one statement each while every connection of
the loop is in use (``Executor._gathered``). The shortcut must answer each caller what its own statement would
have, store what its own statement would have stored, and never let one caller's fault, cancellation or a second
store's gathering of the same keys cost another caller its answer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from agentguard import Guard, StoreError, task
from agentguard._lease import new_fence, new_owner
from agentguard.stores import Record, SQLStore
from agentguard.stores._schema import TABLE
from agentguard.stores._statements import GATHER_MAX, Many

from conftest import pg_dsn, tid

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

LEASE, RETENTION = 30.0, 3600.0


def params(scope: str, key: str, **kw: Any) -> dict[str, Any]:
    p = {
        "scope": scope, "key": key, "task_id": f"task {key}", "operation": f"charge {{'order': '{key}'}}",
        "fingerprint": "f" * 64, "arg_hashes": '{"order": "h"}', "owner": new_owner(), "lease": LEASE,
        "retention": RETENTION, "audit": None, "tool": "charge", "arguments": None, "fence": new_fence(),
    }
    return {**p, **kw}


def varied(scope: str) -> list[dict[str, Any]]:
    """Claims of every shape a call makes: with and without audit and arguments, quotes, non-ASCII, a NUL
    escaped in JSON, a key claimed twice (the second finds it taken)."""
    return [
        params(scope, "k01"),
        params(scope, "k02", audit='{"tool_call_id": "call_1"}', arguments='{"order": "o-2"}'),
        params(scope, "k03", task_id="tâche 'quoted' \"twice\"", operation="refund\nnewline", tool="refund ✓"),
        params(scope, "k04", arguments='{"note": "\\u0000"}'),
        params(scope, "k05"),
        params(scope, "k05"),  # the same key again in the same statement: one claims it
        params(scope, "k06"),
    ]


@contextlib.asynccontextmanager
async def every_connection_in_use(store: SQLStore) -> AsyncIterator[None]:
    """Hold every connection the store's lane allows on this loop: claims made meanwhile gather. On leaving, the
    connections go back one by one, the first to whoever waits in the lane's line (the gathered statement)."""
    await store.ensure_schema()
    engine, lane = store._engines.here()
    held = [await lane.acquire(engine) for _ in range(lane.capacity)]
    assert not lane.free()
    try:
        yield
    finally:
        for conn in held:
            await lane.release(conn, sound=True)


async def joined(store: SQLStore, n: int) -> None:
    """Until ``n`` callers wait in the store's gathered statements on this loop."""
    _, lane = store._engines.here()
    for _ in range(10_000):
        if sum(len(b.calls) for b in lane.gathering.values()) >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{n} callers never gathered")


async def gathered(store: SQLStore, claims: list[dict[str, Any]]) -> list[Any]:
    """Each claim by ``store.claim``, all made while every connection is in use: they go as one statement."""
    _, lane = store._engines.here()
    async with every_connection_in_use(store):
        tasks = [asyncio.ensure_future(store.claim(p)) for p in claims]
        await joined(store, len(claims))
        assert len(lane.gathering) == 1  # (one statement is waiting for a connection, with all of them)
    return list(await asyncio.gather(*tasks, return_exceptions=True))


def counting(store: SQLStore, refused: list[BaseException] | None = None, only: Many | None = None) -> list[int]:
    """The sizes of the statements for many callers the store sends (the dialect's ``fetch_rows``, one statement
    over arrays, and ``fetch_each``, a statement once per caller in one pipeline; ``only``: of that statement
    alone); the errors the database answered them with, into ``refused``."""
    sizes: list[int] = []

    def count(fetch: Any, size: Callable[[Any], int]) -> Any:
        async def counted(drv: Any, sql: str, args: Any) -> Any:
            if only is not None and sql != only.sql:
                return await fetch(drv, sql, args)
            sizes.append(size(args))
            try:
                return await fetch(drv, sql, args)
            except Exception as exc:
                if refused is not None:
                    refused.append(exc)
                raise

        return counted

    store.dialect.fetch_rows = count(store.dialect.fetch_rows, lambda args: len(args[0]))  # type: ignore[method-assign]
    store.dialect.fetch_each = count(store.dialect.fetch_each, len)  # type: ignore[method-assign]
    return sizes


async def rows(store: SQLStore, scope: str) -> list[tuple[Any, ...]]:
    """The records of ``scope``: every column, the clock's columns as the spans they encode."""
    async with store.engine().connect() as conn:
        got = await conn.exec_driver_sql(
            f"SELECT key, task_id, operation, fingerprint, arg_hashes, state, fence, origin, tool, arguments,"
            f" attempts, owner, result, audit, round(lease_until - created_at), round(expires_at - created_at),"
            f" round(updated_at - created_at) FROM {TABLE} WHERE scope = $1 ORDER BY key", (scope,))
        return [tuple(r) for r in got]


@contextlib.asynccontextmanager
async def held(store: SQLStore, url: str, *keys: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Rows of ``keys`` (scope ``s``) inserted by another transaction and not committed: a claim of one of them
    waits until that transaction ends. Yields the rollback that ends it."""
    import asyncpg

    many = store.sql.claim_many
    assert many is not None
    conn = await asyncpg.connect(pg_dsn(url))
    try:
        holds = conn.transaction()
        await holds.start()
        await conn.execute(many.sql.split(" RETURNING")[0], *many.args([params("s", k) for k in keys]))
        yield holds.rollback
    finally:
        await conn.close()


async def sent(batch: Any) -> None:
    """Until ``batch``'s statement has its connection (and is on its way)."""
    for _ in range(10_000):
        if batch.went:
            return
        await asyncio.sleep(0)
    raise AssertionError("the gathered statement never went")


def answered(got: list[Any]) -> list[str]:
    return ["claimed" if isinstance(a, int) else "taken" if isinstance(a, Record) else repr(a) for a in got]


@pytest.mark.parametrize("unsynced", [False, True], ids=["synced", "pg_claim_unsynced"])
async def test_gathered_claims_answer_and_store_what_single_claims_do(store_url: str, unsynced: bool) -> None:
    store = SQLStore(store_url, pool_size=1, pg_claim_unsynced=unsynced)
    sizes = counting(store)
    try:
        alone = [params("alone", "k00")]
        alone += varied("alone")
        together = [params("together", "k00")]
        together += varied("together")
        for p in (alone[0], together[0]):  # a key claimed before: both ways find it taken
            assert isinstance(await store.claim(p), int)
        one_by_one = [await store.claim(p) for p in alone[1:]]
        assert sizes == []
        at_once = await gathered(store, together[1:])
        assert sizes == [len(together) - 1]  # one statement for them all

        assert answered(at_once) == answered(one_by_one) == [
            "claimed", "claimed", "claimed", "claimed", "claimed", "taken", "claimed"]
        assert [a for a in at_once if isinstance(a, int)] == [p["fence"] for p in together[1:] if p is not together[6]]
        # The second claim of k05 reads the first's record, as its own statement followed by the read would.
        assert at_once[5].owner == together[5]["owner"] and one_by_one[5].owner == alone[5]["owner"]

        def same(record: tuple[Any, ...]) -> tuple[Any, ...]:  # (fences and owners are each claim's own)
            return record[:6] + record[8:11] + record[12:]

        stored_alone, stored_together = await rows(store, "alone"), await rows(store, "together")
        assert [same(r) for r in stored_together] == [same(r) for r in stored_alone]
        assert len(stored_together) == 7
        by_key = {p["key"]: p for p in reversed(together)}  # (k05: the first one's)
        for r in stored_together:
            assert (r[6], r[7], r[11]) == (by_key[r[0]]["fence"], by_key[r[0]]["fence"], by_key[r[0]]["owner"])
            assert (r[5], r[10], r[14], r[15], r[16]) == ("running", 1, LEASE, RETENTION, 0)
    finally:
        await store.dispose()


async def test_claims_sharing_an_owner_token_are_each_answered_as_their_own_statement_would_be(
    store_url: str,
) -> None:
    """A row of the gathered claim finds its caller by the owner token. The machine's tokens are each claim's own,
    but the store's ``claim`` is public: a caller that passes one token for several claims still gets, for each,
    its own fence or the record that holds its key, never another claim's fence (the later claims go in
    statements of their own, in their order)."""
    store = SQLStore(store_url, pool_size=1)
    sizes = counting(store, only=store.sql.claim_many)
    _, lane = store._engines.here()
    try:
        owner = new_owner()
        claims = [params("s", "k1", owner=owner), params("s", "k2", owner=owner), params("s", "k2", owner=owner),
                  params("s", "k3")]
        async with every_connection_in_use(store):
            tasks = []
            for p in claims:
                tasks.append(asyncio.ensure_future(store.claim(p)))
                for _ in range(10_000):  # until it waits in a gathered statement (each in its turn)
                    if any(p is q for b in lane.gathering.values() for q, _ in b.calls):
                        break
                    await asyncio.sleep(0)
                else:
                    raise AssertionError("a claim never gathered")
        got = await asyncio.gather(*tasks)
        assert got[:2] + got[3:] == [claims[0]["fence"], claims[1]["fence"], claims[3]["fence"]]
        assert isinstance(got[2], Record) and got[2].fence == claims[1]["fence"]
        assert sizes == [2]  # the first two went alone (as the statement itself); k3, another owner's, joined the last
        stored = {r[0]: (r[6], r[11]) for r in await rows(store, "s")}
        assert stored == {"k1": (claims[0]["fence"], owner), "k2": (claims[1]["fence"], owner),
                          "k3": (claims[3]["fence"], claims[3]["owner"])}
    finally:
        await store.dispose()


async def test_a_claim_the_database_refuses_costs_the_others_nothing(store_url: str) -> None:
    store = SQLStore(store_url, pool_size=1)
    sizes = counting(store)
    try:
        claims = [params("s", f"k{i}") for i in range(5)]
        claims[2]["tool"] = "nul \x00 in a name"  # Postgres' text cannot hold a NUL
        got = await gathered(store, claims)
        assert sizes == [5]  # tried together first
        assert [isinstance(g, int) for g in got] == [True, True, False, True, True]
        assert isinstance(got[2], StoreError) and "claiming the key" in str(got[2])
        assert [r[0] for r in await rows(store, "s")] == ["k0", "k1", "k3", "k4"]
    finally:
        await store.dispose()


async def test_a_caller_cancelled_while_gathered_leaves_the_others_their_claims(store_url: str) -> None:
    runs: list[str] = []
    async with Guard(store_url, pool_size=1) as guard:
        store = guard._store
        assert isinstance(store, SQLStore)
        sizes = counting(store, only=store.sql.claim_many)
        gate = asyncio.Event()

        @guard.once(key=["order"])
        async def charge(order: str) -> dict[str, str]:
            await gate.wait()
            runs.append(order)
            return {"charged": order}

        async def call(order: str) -> Any:
            with task(f"t-{order}"):
                return await charge(order)

        async with every_connection_in_use(store):
            calls = {o: asyncio.ensure_future(call(o)) for o in ("a", "b", "c", "d")}
            await joined(store, 4)
            calls["b"].cancel()
            for _ in range(10_000):  # until b has left the statement, which has not gone (no connection)
                if sum(len(b.calls) for b in store._engines.here()[1].gathering.values()) == 3:
                    break
                await asyncio.sleep(0)
        gate.set()
        assert [await calls[o] for o in ("a", "c", "d")] == [{"charged": o} for o in ("a", "c", "d")]
        with pytest.raises(asyncio.CancelledError):
            await calls["b"]
        assert sizes == [3]  # the statement went without b
        # b claimed nothing (the engine's release of a cancelled claim found none): called again, it runs, once.
        assert await call("b") == {"charged": "b"}
        assert await call("b") == {"charged": "b"}
    assert sorted(runs) == ["a", "b", "c", "d"]


async def test_a_caller_cancelled_once_its_statement_went_hears_of_it_after_the_statement_ended(
    store_url: str,
) -> None:
    """The statement is on its way (held by another transaction's uncommitted row of its first key) when a caller is
    cancelled: the caller's cancellation goes on only once the statement has ended, so its claim, made by the
    statement, is there to be released by its owner token (what the engine does for a cancelled claim)."""
    store = SQLStore(store_url, pool_size=1)
    try:
        await store.ensure_schema()
        claims = [params("s", k) for k in ("k1", "k2", "k3")]
        _, lane = store._engines.here()
        async with held(store, store_url, "k1") as rollback:
            async with every_connection_in_use(store):
                tasks = [asyncio.ensure_future(store.claim(p)) for p in claims]
                await joined(store, 3)
                batch = next(iter(lane.gathering.values()))
            await sent(batch)
            tasks[1].cancel()
            await asyncio.sleep(0.2)
            assert not tasks[1].done()  # (held until the statement ends)
            await rollback()
        with pytest.raises(asyncio.CancelledError):
            await tasks[1]
        # The statement ended (k1 was free again: the other transaction rolled back); k2's claim is there, running,
        # and its owner releases it, as the engine does when a claim is cancelled.
        assert await store.release_owned("s", "k2", claims[1]["owner"], RETENTION)
        assert [isinstance(await t, int) for t in (tasks[0], tasks[2])] == [True, True]
    finally:
        await store.dispose()


async def test_two_stores_gathering_the_same_keys_in_opposite_orders_do_not_deadlock(store_url: str) -> None:
    """Two processes' statements claiming the same keys, held on their way by another transaction's uncommitted
    rows of the two middle keys: each inserts the keys in their order, so neither holds a key the other waits for
    while it waits for one the other holds. In the orders they were given, each would hold one half when the
    middle is let go, and wait for the other's (Postgres aborts one of them after a second; each caller would
    then be answered on its own)."""
    stores = SQLStore(store_url, pool_size=1), SQLStore(store_url, pool_size=1)
    refused: list[BaseException] = []
    sizes = [counting(s, refused) for s in stores]
    try:
        keys = [f"k{i:02d}" for i in range(GATHER_MAX)]  # (one statement's worth)
        each = [[params("s", k) for k in keys], [params("s", k) for k in reversed(keys)]]
        for store in stores:
            await store.ensure_schema()
        lanes = [s._engines.here()[1] for s in stores]
        middle = keys[len(keys) // 2 - 1], keys[len(keys) // 2]
        async with held(stores[0], store_url, *middle) as rollback:
            async with every_connection_in_use(stores[0]), every_connection_in_use(stores[1]):
                tasks = [asyncio.ensure_future(s.claim(p)) for s, claims in zip(stores, each, strict=True)
                         for p in claims]
                await joined(stores[0], GATHER_MAX)
                await joined(stores[1], GATHER_MAX)
                batches = [next(iter(lane.gathering.values())) for lane in lanes]
            for batch in batches:
                await sent(batch)
            await asyncio.sleep(0.1)  # (both statements reach the rows held)
            await rollback()
        answers = await asyncio.gather(*tasks, return_exceptions=True)
        assert refused == [] and sizes == [[GATHER_MAX], [GATHER_MAX]]
        assert not [a for a in answers if isinstance(a, BaseException)]
        claimed = [p["key"] for p, a in zip(each[0] + each[1], answers, strict=True) if isinstance(a, int)]
        assert sorted(claimed) == keys
    finally:
        for store in stores:
            await store.dispose()


async def test_many_callers_on_one_connection_run_each_operation_once(store_url: str) -> None:
    """A Guard with a pool of one (three connections with its overflow) and 300 callers of 50 operations, six
    callers each: the claims gather, and so do the completions (checked: at most ``GATHER_MAX`` a statement),
    every operation runs once, and every caller gets its result."""
    runs: list[str] = []
    task_id = tid()
    async with Guard(store_url, pool_size=1) as guard:
        store = guard._store
        assert isinstance(store, SQLStore)
        sizes = counting(store, only=store.sql.claim_many)
        completions = counting(store, only=store.sql.complete_many)

        @guard.once(key=["order"])
        async def charge(order: str) -> dict[str, str]:
            runs.append(order)
            await asyncio.sleep(0.01)
            return {"charged": order}

        async def call(i: int) -> Any:
            with task(task_id):
                return await charge(f"o-{i % 50}")

        got = await asyncio.gather(*(call(i) for i in range(300)))
    assert got == [{"charged": f"o-{i % 50}"} for i in range(300)]
    assert sorted(runs) == sorted(f"o-{i}" for i in range(50))
    assert sizes and 1 < max(sizes) <= GATHER_MAX
    assert completions and 1 < max(completions) <= GATHER_MAX


# -- completions ---------------------------------------------------------------------------------------------


async def completed(store: SQLStore, completions: list[tuple[Any, ...]], last: int | None = None) -> list[Any]:
    """Each completion by ``store.complete``, all made while every connection is in use: they go as one statement
    (or more, where a key comes again: ``Fenced.joins``; ``last``: how many are in the last one)."""
    async with every_connection_in_use(store):
        tasks = [asyncio.ensure_future(store.complete(*c)) for c in completions]
        await joined(store, len(completions) if last is None else last)
    return list(await asyncio.gather(*tasks, return_exceptions=True))


async def claimed(store: SQLStore, scope: str, keys: list[str]) -> dict[str, int]:
    """The keys claimed one by one: each one's fence."""
    fences = {}
    for key in keys:
        fence = await store.claim(params(scope, key))
        assert isinstance(fence, int)
        fences[key] = fence
    return fences


def outcomes(scope: str, fences: dict[str, int]) -> list[tuple[Any, ...]]:
    """Completions of every shape a call makes, of the keys ``fences`` names (claimed; k04 and k05 completed
    already, k06 never claimed): succeeded and failed, with and without an audit, text a single statement binds
    as it is (quotes, non-ASCII, a newline) and a retention past the claim's (the expiry moved on), the claim's own
    completion redone (its earlier write found), a stale fence, a second outcome for a completed record, a record
    that is not there."""
    return [
        (scope, "k01", fences["k01"], "succeeded", '{"charge_id": "ch_1"}', RETENTION, None),
        (scope, "k02", fences["k02"], "failed", '{"error": "CardDeclined"}', RETENTION, '{"tool_call_id": "c2"}'),
        (scope, "k03", fences["k03"] + 1, "succeeded", '{"charge_id": "ch_3"}', RETENTION, None),
        (scope, "k04", fences["k04"], "succeeded", '{"charge_id": "ch_4"}', RETENTION, None),
        (scope, "k05", fences["k05"], "succeeded", '{"charge_id": "another"}', RETENTION, None),
        (scope, "k06", 1, "succeeded", '{"charge_id": "ch_6"}', RETENTION, None),
        (scope, "k07", fences["k07"], "succeeded", '{"note": "tâche \'quoted\' \\"twice\\"\\nline"}',
         2 * RETENTION, None),
    ]


async def test_gathered_completions_answer_and_store_what_single_completions_do(store_url: str) -> None:
    store = SQLStore(store_url, pool_size=1)
    sizes = counting(store)
    try:
        keys = ["k01", "k02", "k03", "k04", "k05", "k07"]
        alone, together = await claimed(store, "alone", keys), await claimed(store, "together", keys)
        for scope, fences in (("alone", alone), ("together", together)):  # completed before
            for key in ("k04", "k05"):
                assert await store.complete(scope, key, fences[key], "succeeded", f'{{"charge_id": "ch_{key[-1]}"}}',
                                            RETENTION)
        one_by_one = [await store.complete(*c) for c in outcomes("alone", alone)]
        assert sizes == []
        at_once = await completed(store, outcomes("together", together))
        assert sizes == [7]  # one statement for them all

        assert at_once == one_by_one == [True, True, False, True, False, False, True]

        def same(record: tuple[Any, ...]) -> tuple[Any, ...]:  # (fences and owners are each claim's own)
            return record[:6] + record[8:11] + record[12:]

        stored_alone, stored_together = await rows(store, "alone"), await rows(store, "together")
        assert [same(r) for r in stored_together] == [same(r) for r in stored_alone]
        by_key = {r[0]: r for r in stored_together}
        assert [by_key[k][5] for k in keys] == ["succeeded", "failed", "running", "succeeded", "succeeded",
                                                 "succeeded"]
        assert by_key["k05"][12] == '{"charge_id": "ch_5"}'  # (the second outcome refused, the first kept)
        assert (by_key["k02"][13], by_key["k07"][15], by_key["k01"][14]) == ('{"tool_call_id": "c2"}', 2 * RETENTION,
                                                                              None)
    finally:
        await store.dispose()


async def test_two_completions_of_one_key_never_go_in_one_statement(store_url: str) -> None:
    """A key's completion with a stale fence and its owner's, gathered: Postgres would write the record once for
    the two (an ``UPDATE ... FROM`` writes a row several of its rows match once), so the second goes in the
    next statement, with whoever comes after it; each is answered as its own statement would be."""
    store = SQLStore(store_url, pool_size=1)
    sizes = counting(store)
    try:
        fences = await claimed(store, "s", ["k1", "k2", "k3"])
        got = await completed(store, [
            ("s", "k1", fences["k1"], "succeeded", '{"n": 1}', RETENTION, None),
            ("s", "k2", fences["k2"], "succeeded", '{"n": 2}', RETENTION, None),
            ("s", "k1", fences["k1"] - 1, "succeeded", '{"n": "stale"}', RETENTION, None),
            ("s", "k3", fences["k3"], "succeeded", '{"n": 3}', RETENTION, None),
        ], last=2)
        assert sizes == [2, 2]
        assert got == [True, True, False, True]
        assert [(r[0], r[5], r[12]) for r in await rows(store, "s")] == [
            ("k1", "succeeded", '{"n": 1}'), ("k2", "succeeded", '{"n": 2}'), ("k3", "succeeded", '{"n": 3}')]
    finally:
        await store.dispose()


async def test_a_completion_the_database_refuses_costs_the_others_nothing(store_url: str) -> None:
    store = SQLStore(store_url, pool_size=1)
    sizes = counting(store)
    try:
        fences = await claimed(store, "s", [f"k{i}" for i in range(4)])
        results = ['{"n": 0}', '{"n": 1}', "nul \x00 in a result", '{"n": 3}']  # Postgres' text cannot hold a NUL
        got = await completed(store, [("s", k, f, "succeeded", r, RETENTION, None)
                                      for (k, f), r in zip(fences.items(), results, strict=True)])
        assert sizes == [4]  # tried together first
        assert got[:2] == [True, True] and got[3] is True
        assert isinstance(got[2], StoreError) and "storing the result" in str(got[2])
        assert [(r[0], r[5]) for r in await rows(store, "s")] == [
            ("k0", "succeeded"), ("k1", "succeeded"), ("k2", "running"), ("k3", "succeeded")]
    finally:
        await store.dispose()


async def test_a_gathered_completion_announces_the_watched_records_alone(store_url: str) -> None:
    """Waiters in other processes hear of a watched record's outcome from its completion's own statement
    (``_listen``): gathered, the statement announces each watched record it wrote, once, and nothing else."""
    import asyncpg

    store = SQLStore(store_url, pool_size=1)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(pg_dsn(store_url))
    try:
        fences = await claimed(store, "s", ["k1", "k2", "k3"])
        await listener.add_listener(TABLE, lambda _c, _p, _ch, payload: heard.put_nowait(payload))
        await listener.execute(f"UPDATE {TABLE} SET watched = true WHERE scope = 's' AND key IN ('k1', 'k3')")
        got = await completed(store, [
            ("s", "k1", fences["k1"], "succeeded", '{"n": 1}', RETENTION, None),
            ("s", "k2", fences["k2"], "succeeded", '{"n": 2}', RETENTION, None),
            ("s", "k3", fences["k3"] + 1, "succeeded", '{"n": 3}', RETENTION, None),  # (stale: writes nothing)
        ])
        assert got == [True, True, False]
        await listener.execute(f"SELECT pg_notify('{TABLE}', 'end')")  # (delivered after what committed before)
        payloads = [await asyncio.wait_for(heard.get(), 30)]
        while payloads[-1] != "end":
            payloads.append(await asyncio.wait_for(heard.get(), 30))
        assert payloads == ['["s", "k1"]', "end"]
    finally:
        await listener.close()
        await store.dispose()


async def test_past_the_pools_own_size_claims_gather_rather_than_open_its_overflow(store_url: str) -> None:
    """The lane holds the pool's own size (``pool_size`` 2), both in use: claims made now join one statement,
    which goes on the first connection handed on, rather than each opening a connection of the pool's overflow
    (four more allowed here): fewer server sessions for a burst, and one commit for many."""
    store = SQLStore(store_url, pool_size=2)
    sizes = counting(store, only=store.sql.claim_many)
    try:
        await store.ensure_schema()
        engine, lane = store._engines.here()
        assert (lane.gather_at, lane.capacity) == (2, 6)
        lane.patience = 3600.0  # (however slow the machine, the claims wait in line: the next test waits less)
        for conn in [await lane.acquire(engine) for _ in range(3)]:  # (the lane holds three, one of them idle)
            await lane.release(conn, sound=True)
        busy = [await lane.acquire(engine) for _ in range(2)]
        assert lane.free() and not lane.gathers()  # (one idle: a claim takes it)
        busy.append(await lane.acquire(engine))
        assert lane.free() and lane.gathers()  # (none idle, three held: past the pool's size, claims gather)
        claims = [params("s", f"k{i}") for i in range(5)]
        tasks = [asyncio.ensure_future(store.claim(p)) for p in claims]
        await joined(store, len(claims))
        assert lane.held == 3 and sizes == []  # (no connection opened for them)
        for conn in busy:
            await lane.release(conn, sound=True)
        got = await asyncio.gather(*tasks)
        assert got == [p["fence"] for p in claims] and sizes == [5]
    finally:
        await store.dispose()


async def test_gathered_callers_kept_waiting_open_a_connection_of_the_overflow_after_all(store_url: str) -> None:
    """The lane's one connection (``pool_size`` 1) held by a statement that does not end (a lock someone else
    holds, here a connection taken and kept): claims gathered behind it wait ``patience`` for it, then their
    statement opens a connection of the pool's overflow and goes, while the other is still held."""
    store = SQLStore(store_url, pool_size=1)
    sizes = counting(store, only=store.sql.claim_many)
    try:
        await store.ensure_schema()
        engine, lane = store._engines.here()
        lane.patience = 0.05
        taken = [await lane.acquire(engine)]
        while lane.idle:  # (connections the lane kept: taken too, so that none is idle)
            taken.append(await lane.acquire(engine))
        assert lane.gathers() and lane.held < lane.capacity
        claims = [params("s", f"k{i}") for i in range(3)]
        try:
            async with asyncio.timeout(30):  # (a bound, not a measure: without the fallback they wait for ever)
                got = await asyncio.gather(*(store.claim(p) for p in claims))
            assert got == [p["fence"] for p in claims] and sizes == [3]
            assert lane.held == len(taken) + 1  # (the overflow's connection, opened by their statement)
        finally:
            for conn in taken:
                await lane.release(conn, sound=True)
    finally:
        await store.dispose()
