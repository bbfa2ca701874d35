"""The ledger of attempts: every call leaves an entry, written off the caller's path, bounded, flushed on close,
swept with the records, and added to a store made by an earlier version."""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

import agentguard._ledger as ledger_mod
from agentguard import Guard, InProgressError, KeyReuseError, MissingTaskError, StoreError, task
from agentguard._keys import derive_key
from agentguard.stores import SQLStore

from conftest import BACKEND, pg_dsn, raw_exec, tid

pytestmark = pytest.mark.anyio


class Transient(Exception):
    pass


def kinds(entries: list[Any]) -> list[tuple[str, str, int]]:
    return [(e.kind, e.detail, e.attempt) for e in entries]


async def test_every_call_leaves_an_entry_in_order(make_guard: Callable[..., Guard]) -> None:
    g = make_guard(on_conflict="raise")
    t = tid()
    runs = 0
    fail_next = [True]
    gate, holding = asyncio.Event(), asyncio.Event()

    @g.once(key=["order"], cache_errors=(ValueError,))
    async def charge(order: str, amount: int) -> dict[str, int]:
        nonlocal runs
        runs += 1
        if order == "slow":
            holding.set()
            await gate.wait()
        if order == "flaky" and fail_next[0]:
            fail_next[0] = False
            raise Transient("try again")
        if order == "bad":
            raise ValueError("card declined")
        return {"runs": runs}

    with task(t):
        await charge("o-1", 100)
        await charge("o-1", 100)  # replayed from the in-process cache
        with pytest.raises(KeyReuseError):
            await charge("o-1", 999)
        with pytest.raises(Transient):
            await charge("flaky", 1)
        await charge("flaky", 1)  # retried: runs again as attempt 2
        with pytest.raises(ValueError):
            await charge("bad", 1)
        slow = asyncio.create_task(charge("slow", 1))
        await holding.wait()  # the slow call holds its claim
        with pytest.raises(InProgressError):
            await charge("slow", 1)
        gate.set()
        await slow
    g2 = make_guard(cache_size=0)  # another guard (no shared cache): a replay from the store
    with task(t):
        out = await g2.run("charge", _never, arguments={"order": "o-1", "amount": 100}, key={"order": "o-1"},
                           returns=dict[str, int])
    assert out.replayed and out.value == {"runs": 1}
    with pytest.raises(MissingTaskError):
        await charge("o-2", 1)
    await g.flush_ledger()
    await g2.flush_ledger()
    timeline = await g.timeline(t)
    assert kinds(timeline) == [
        ("ran", "succeeded", 1),
        ("replayed", "cache", 1),
        ("refused", "reuse (differing: amount)", 0),
        ("released", "Transient", 1),
        ("ran", "succeeded (after a released claim)", 2),
        ("ran", "failed: cached error ValueError", 1),
        ("refused", "in progress", 0),
        ("ran", "succeeded", 1),
        ("replayed", "store", 1),
    ]
    assert {e.task_id for e in timeline} == {t}
    assert all(e.process.endswith(f":{__import__('os').getpid()}") for e in timeline)
    assert all(e.guard_ms is not None and e.guard_ms >= 0 for e in timeline)
    missing = [e for e in await g.attempts() if e.detail == "missing task"]
    assert [(e.tool, e.task_id, e.key) for e in missing] == [("charge", "", "")]
    key = timeline[0].key
    assert [e.kind for e in await g.attempts(key=key)] == ["ran", "replayed", "refused", "replayed"]
    stats = {s["tool"]: s for s in await g.stats()}
    assert stats["charge"]["calls"] == 10 and stats["charge"]["replayed"] == 2
    assert stats["charge"]["refused"] == 3  # reuse, in progress, missing task


async def _never(key: str) -> dict[str, int]:
    raise AssertionError("a replay must not run the body")


class CountingStore(SQLStore):
    """A real store that notes on which thread each verb ran."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.seen: list[tuple[str, int]] = []

    async def claim(self, params: dict[str, Any], likely_taken: bool = False) -> Any:
        self.seen.append(("claim", threading.get_ident()))
        return await super().claim(params, likely_taken)

    async def complete(self, *args: Any, **kwargs: Any) -> bool:
        self.seen.append(("complete", threading.get_ident()))
        return await super().complete(*args, **kwargs)

    async def write_attempts(self, rows: Any) -> None:
        self.seen.append(("write_attempts", threading.get_ident()))
        await super().write_attempts(rows)


async def test_the_ledger_is_written_off_the_callers_path(make_guard: Callable[..., Guard], store_url: str) -> None:
    store = CountingStore(store_url)
    g = make_guard(store=store)

    @g.once(key=["order"])
    async def charge(order: str) -> str:
        return order

    here = threading.get_ident()
    with task(tid()):
        await charge("o-1")
        first = list(store.seen)
        await charge("o-1")
        replay = store.seen[len(first):]
    # The caller's path: a first call's claim and completion, a replay nothing; no ledger write among them.
    assert [v for v, thread in first if thread == here] == ["claim", "complete"]
    assert [v for v, thread in replay if thread == here] == []
    await g.flush_ledger()
    writes = [thread for v, thread in store.seen if v == "write_attempts"]
    assert writes and here not in writes


class StuckStore(SQLStore):
    """A real store whose ledger writes hang until released (a store that cannot keep up)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.release = threading.Event()
        self.writing = threading.Event()

    async def write_attempts(self, rows: Any) -> None:
        self.writing.set()
        await asyncio.to_thread(self.release.wait)
        await super().write_attempts(rows)


async def test_a_slow_store_drops_entries_counted_never_blocks(
    make_guard: Callable[..., Guard], store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_mod, "QUEUE_MAX", 5)
    monkeypatch.setattr(ledger_mod, "BATCH", 2)
    store = StuckStore(store_url)
    g = make_guard(store=store)
    t = tid()

    @g.once(key=["n"])
    async def tool(n: int) -> int:
        return n

    with task(t):
        await tool(0)
        await asyncio.to_thread(store.writing.wait)  # the writer took a batch and is stuck writing it
        for n in range(1, 20):  # every call completes although the ledger cannot be written
            assert await tool(n) == n
    assert g.ledger_dropped > 0
    dropped = g.ledger_dropped
    store.release.set()
    await g.flush_ledger()
    entries = await g.attempts()
    calls = [e for e in entries if e.kind == "ran"]
    notes = [e for e in entries if e.kind == "dropped"]
    assert len(calls) + dropped == 20
    assert [e.detail for e in notes] == [f"{dropped} entries dropped (the store was not keeping up)"]


async def test_close_flushes_and_the_entries_are_swept_with_the_records(
    make_guard: Callable[..., Guard], store_url: str
) -> None:
    t = tid()
    g = Guard(store_url)

    @g.once
    async def send() -> str:
        return "sent"

    with task(t):
        await send()
    await g.aclose()  # nothing waited for the writer: closing wrote the entry
    reader = make_guard()
    assert [e.kind for e in await reader.timeline(t)] == ["ran"]
    await raw_exec(store_url, "UPDATE agentguard_calls SET expires_at = 0;"
                              " UPDATE agentguard_attempts SET expires_at = 0;")
    assert await reader.sweep() == 1
    assert await reader.attempts() == []


async def test_a_store_of_an_earlier_version_gets_the_ledger(make_guard: Callable[..., Guard], store_url: str) -> None:
    t = tid()
    old = make_guard()
    await old.ensure_schema()
    await old.aclose()
    await raw_exec(store_url, "DROP TABLE agentguard_attempts")  # as an earlier version made it
    g = make_guard()

    @g.once
    async def send() -> str:
        return "sent"

    with task(t):
        await send()
    await g.flush_ledger()
    assert [e.kind for e in await g.timeline(t)] == ["ran"]


async def test_forget_deletes_a_completed_record_never_a_running_claim(make_guard: Callable[..., Guard]) -> None:
    from agentguard import GuardError

    g = make_guard()
    t = tid()
    runs = 0
    gate, holding = asyncio.Event(), asyncio.Event()

    @g.once(key=["order"])
    async def charge(order: str) -> int:
        nonlocal runs
        runs += 1
        if order == "held":
            holding.set()
            await gate.wait()
        return runs

    with task(t):
        assert await charge("o-1") == 1
        key = (await g.records(task_id=t))[0].key
        held = asyncio.create_task(charge("held"))
        await holding.wait()
        running = next(r.key for r in await g.records(task_id=t) if r.state == "running")
        with pytest.raises(GuardError, match="running claim"):
            await g.forget(running)
        gate.set()
        await held
        gone = await g.forget(key)
        assert gone.state == "succeeded"
        assert await charge("o-1") == 3  # forgotten: it runs again
    with pytest.raises(GuardError, match="no record"):
        await g.forget("ag_" + "0" * 48)
    await g.flush_ledger()
    assert [e.kind for e in await g.attempts(key=key)] == ["ran", "forgotten", "ran"]


@pytest.mark.skipif(BACKEND != "sqlite", reason="one backend suffices: the guard's own option")
async def test_ledger_false_keeps_none(make_guard: Callable[..., Guard]) -> None:
    g = make_guard(ledger=False)

    @g.once
    async def send() -> str:
        return "sent"

    with task(tid()):
        await send()
    await g.flush_ledger()
    assert await g.attempts() == []


async def test_a_store_that_is_down_drops_the_entries_and_closing_ends(tmp_path: Any) -> None:
    from agentguard import StoreError

    (tmp_path / "a-file").write_text("not a folder")
    guard = Guard(f"sqlite+aiosqlite:///{tmp_path / 'a-file' / 'dir' / 'a.db'}")  # its folder cannot be made

    @guard.once
    async def charge() -> str:
        return "charged"

    with task(tid()), pytest.raises(StoreError):
        await charge()
    await guard.aclose()  # the entry cannot be written: dropped and counted, and closing ends
    assert guard.ledger_dropped >= 1


# Entries of every shape the ledger writes: a call's, a refusal before a task, an operator's act (no times), and
# integers where the columns are doubles; text with quotes, newlines, tabs, backslashes and non-ASCII.
SHAPES = [
    ("s", "k" * 64, "task-ü", "charge", "charge_card", "ran", "succeeded", 1, "call-1", "host:1",
     1_700_000_000.123456, 0.25, 1.5, 1_700_086_400.123456),
    ("", "", "", "tool", "tool", "refused", "missing task", 0, None, "host:1", 1_700_000_001.0, None, None,
     1_700_086_401.0),
    ("s2", "k2", "t'2\n\tx\\y", 'op "q"', "tool", "resolved", "succeeded (by an operator)", 3, "☃", "host:2",
     1_700_000_002, None, None, 1_700_086_402),
]


async def test_a_copied_batch_stores_what_the_inserts_store_but_a_refused_entry(store_url: str) -> None:
    """The ledger's batches go to the driver whole (Postgres' COPY; on SQLite one hop to aiosqlite's thread, where
    sqlite3 binds the rows), beside the general path's INSERT of each entry through SQLAlchemy (run here, as the
    reference): both store the same entries; a batch with an entry the database refuses stores its other entries
    (written again one by one) and says how many it left out; a store that cannot write at all (its table gone)
    says so as a ``StoreError``, trying no entry on its own."""
    from agentguard.stores._attempts import WRITTEN

    store = SQLStore(store_url)
    kept = (*SHAPES[0][:6], "kept beside a refused entry", *SHAPES[0][7:])
    try:
        assert await store.write_attempts(SHAPES) == 0
        bad = [kept, (*SHAPES[1][:2], None, *SHAPES[1][3:])]  # a task id missing
        assert await store.write_attempts(bad) == 1
        copied = [{k: v for k, v in e.as_dict().items() if k != "id"} for e in await store.read_attempts()]
        await raw_exec(store_url, "DELETE FROM agentguard_attempts")
        async with store.engine().begin() as conn:  # the general path's way, one INSERT per entry
            for row in (*SHAPES, kept):
                await conn.execute(store.ledger.sql.insert, dict(zip(WRITTEN, row, strict=True)))
        inserted = [{k: v for k, v in e.as_dict().items() if k != "id"} for e in await store.read_attempts()]
        await raw_exec(store_url, "DROP TABLE agentguard_attempts")
        with pytest.raises(StoreError, match="writing the attempt ledger"):
            await store.write_attempts(SHAPES)
    finally:
        await store.dispose()
    assert copied == inserted
    assert [tuple(e.values()) for e in copied] == [
        (*row[:10], float(row[10]), row[11], row[12]) for row in (SHAPES[0], kept, *SHAPES[1:])
    ]


def _inserts_into(seen: list[str], sql: str) -> None:
    """A trace callback: the ledger's INSERTs, as run."""
    if sql.startswith("INSERT") and " agentguard_attempts " in sql:
        seen.append(sql)


@pytest.mark.parametrize(("limit", "most"), [(32766, 64), (999, 32), (40, 2), (17, 1)])
async def test_a_sqlite_batch_in_a_few_inserts_stores_what_an_insert_per_entry_stores(limit: int, most: int) -> None:
    """On SQLite a batch's entries go in a few INSERTs of many rows each (``_chain.insert_rows``: a step per
    statement, not per entry), beside ``executemany`` of the one-row INSERT (the reference): the same rows in the
    same order (their ids), every value as bound (doubles exact, NULLs, quotes, newlines, non-ASCII). As many rows
    to a statement as the connection's limit of variables allows (999 before SQLite 3.32; one row at the least),
    at most ``ROWS_PER_INSERT``, the rest in powers of two: a handful of statements a batch, and of texts a
    connection compiles. An entry the database refuses ends the batch's transaction, the entries of the statements
    before its own too (``OR ROLLBACK``: as the batch's rollback ended it; then written again one by one)."""
    from sqlalchemy.dialects import sqlite as sqlite_dialect
    from sqlalchemy.schema import CreateTable

    from agentguard.stores import _chain
    from agentguard.stores._attempts import ATTEMPTS, WRITTEN, attempts

    ddl = str(CreateTable(attempts).compile(dialect=sqlite_dialect.dialect()))
    chain = _chain.Chain(ATTEMPTS, WRITTEN, "0")
    for n in (0, 1, 2, 3, 31, 64, 65, 127, 500):
        entries = [(*SHAPES[i % 3][:6], f"entry {i}", *SHAPES[i % 3][7:10], SHAPES[i % 3][10] + i / 7,
                    *SHAPES[i % 3][11:]) for i in range(n)]
        rows, _ = _chain.place(_chain.prepared(entries), {s[0]: (0, _chain.GENESIS) for s in SHAPES})
        stored = []
        inserts: list[str] = []
        for many in (False, True):
            conn = sqlite3.connect(":memory:", isolation_level=None)
            conn.execute(ddl)
            conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
            conn.set_trace_callback(functools.partial(_inserts_into, inserts))
            if many:
                conn.executemany(chain.sq_insert, rows)
            else:
                assert chain.rows_per_insert(conn) == most
                _chain.insert_rows(conn, chain, rows)
                assert len(inserts) == n // most + bin(n % most).count("1"), (n, most)
            stored.append(conn.execute(f"SELECT * FROM {ATTEMPTS} ORDER BY id").fetchall())
            conn.close()
        assert stored[0] == stored[1]
        assert [r[1:] for r in stored[0]] == [tuple(r) for r in rows]
        assert [r[0] for r in stored[0]] == list(range(1, n + 1))
    assert set(chain._inserts) <= {1 << b for b in range(7)}  # (powers of two up to 64: a handful of texts)

    entries = [(*SHAPES[0][:2], None if i == 2 * most + 1 else f"t-{i}", *SHAPES[0][3:]) for i in range(3 * most + 1)]
    rows, _ = _chain.place(_chain.prepared(entries), {"s": (0, _chain.GENESIS)})
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute(ddl)
        conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
        conn.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
            _chain.insert_rows(conn, chain, rows)
        assert not conn.in_transaction
        assert conn.execute(f"SELECT count(*) FROM {ATTEMPTS}").fetchone() == (0,)
    finally:
        conn.close()


async def _plan(store_url: str, sql: str, params: Any) -> str:
    """The database's plan of ``sql`` (the store's own, compiled for its driver) with ``params``."""
    if BACKEND == "sqlite":
        with sqlite3.connect(make_url(store_url).database or "") as conn:
            return "\n".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
    conn = await asyncpg.connect(pg_dsn(store_url))
    try:
        await conn.execute("ANALYZE agentguard_attempts; ANALYZE agentguard_calls; ANALYZE agentguard_ledger_keys")
        return "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, *params))
    finally:
        await conn.close()


def _noise(n: int, kind: str = "ran", scope: str = "s") -> list[tuple[Any, ...]]:
    """``n`` entries of keys of their own (five to a task), no record behind them, written straight to the ledger
    (each as its call ends: not late, see ``LATE``)."""
    keys = [derive_key(scope, f"noise-task-{i // 5}", f"op-{i}") for i in range(n)]
    now = time.time() - n
    return [(scope, k, f"noise-task-{i // 5}", "op", "tool", kind, "store unavailable" if kind == "refused" else
             "succeeded", 1, None, "h:1", now + i, None, None, 2e9) for i, k in enumerate(keys)]


async def test_a_keys_entries_are_read_through_its_task_while_it_has_a_record_and_after_it_is_gone(
    make_guard: Callable[..., Guard], store_url: str
) -> None:
    """``agentguard show KEY`` reads a key's entries through the ledger's task index, never a scan of the ledger:
    the key's task is found in its record while there is one, and once the record is gone — forgotten, or swept
    — in the row the records' trigger left for it in ``agentguard_ledger_keys``. The ledger keeps no index of
    keys (each entry would land on a page of its own in one)."""
    g = make_guard()
    await g.ensure_schema()
    store = g._store
    assert isinstance(store, SQLStore)
    await store.write_attempts(_noise(5000, scope="default"))  # (the scope of the calls below)
    t = tid()

    @g.once(key=["order"])
    async def charge(order: str) -> str:
        return order

    with task(t):
        for order in ("kept", "forgotten", "swept"):
            await charge(order)
            await charge(order)
    keys = {r.operation.split("=")[1].strip('"]'): r.key for r in await g.records(task_id=t)}
    await g.forget(keys["forgotten"])
    await raw_exec(store_url, f"UPDATE agentguard_calls SET expires_at = 0 WHERE key = '{keys['swept']}'")
    assert await g.sweep() == 1
    await g.flush_ledger()
    assert {name: [e.kind for e in await g.attempts(key=key)] for name, key in keys.items()} == {
        "kept": ["ran", "replayed"], "forgotten": ["ran", "replayed", "forgotten"], "swept": ["ran", "replayed"]}
    for key in keys.values():  # (in the key's scope, and with another scope's name, none)
        assert [e.key for e in await g.attempts(key=key, scope="default")] == [key] * (2 + (key == keys["forgotten"]))
        assert await g.attempts(key=key, scope="elsewhere") == []
    assert await g.attempts(key="ag_" + "0" * 48) == []

    sql, args = store._executor._compiled(store.ledger.sql.by_key, store.engine())
    for key in (keys["kept"], keys["forgotten"]):
        for scope in (None, "default"):
            plan = await _plan(store_url, sql, args({"key": key, "scope": scope, "since": None, "limit": 10}))
            assert "agentguard_attempts_task_idx" in plan, plan
            assert "SCAN agentguard_attempts" not in plan and "Seq Scan on agentguard_attempts" not in plan, plan
            assert "key_prefix_idx" not in plan


async def test_a_refusals_key_is_found_with_no_record_behind_it(store_url: str) -> None:
    """A refusal may have no record to find its key by (the store was down when the call came): the writer
    leaves the key's row beside its entry, in the same transaction; the entries of other kinds leave none."""
    store = SQLStore(store_url)
    try:
        await store.ensure_schema()
        refused, ran = _noise(3, "refused"), _noise(6)[3:]
        await store.write_attempts([*refused, *ran])
        found = [await store.read_attempts(key=row[1]) for row in refused]
        rows = await store.ledger._executor.run("test", _key_rows, body_ran=None)
    finally:
        await store.dispose()
    assert [[(e.key, e.kind, e.detail) for e in entries] for entries in found] == [
        [(row[1], "refused", "store unavailable")] for row in refused]
    assert rows == sorted((row[1], row[2], 2e9) for row in refused)


async def test_an_entry_written_late_is_found_by_its_key_with_its_record_and_row_gone(store_url: str) -> None:
    """An entry the writer delivers more than ``KEPT_AFTER`` after its call ended (a process paused with its queue)
    may find its key's record deleted and the key's row swept meanwhile, no entry of the key having been there to
    keep it: the writer leaves the key's row beside any entry older than ``LATE``, as beside a refusal, so that
    ``agentguard show KEY`` still finds it; an entry written on time leaves none."""
    from agentguard.stores._attempts import KEPT_AFTER, LATE

    assert LATE < KEPT_AFTER
    store = SQLStore(store_url)
    try:
        await store.ensure_schema()
        late = [(*row[:10], time.time() - LATE - 60, *row[11:]) for row in _noise(3)]
        on_time = _noise(6)[3:]
        await store.write_attempts([*late, *on_time])
        found = [await store.read_attempts(key=row[1]) for row in late]
        rows = await store.ledger._executor.run("test", _key_rows, body_ran=None)
    finally:
        await store.dispose()
    assert [[(e.key, e.kind) for e in entries] for entries in found] == [[(row[1], "ran")] for row in late]
    assert rows == sorted((row[1], row[2], 2e9) for row in late)


async def _key_rows(conn: Any) -> list[tuple[str, str, float]]:
    from sqlalchemy import text

    return [(r[0], r[1], float(r[2])) for r in
            await conn.execute(text("SELECT key, task_id, expires_at FROM agentguard_ledger_keys ORDER BY key"))]


@pytest.mark.parametrize("index", ["agentguard_attempts_key_prefix_idx", "agentguard_attempts_key_idx"])
async def test_a_store_with_a_key_index_gets_its_keys_rows_and_loses_the_index(store_url: str, index: str) -> None:
    """A store made by an earlier version has an index of the ledger's keys (their first characters, or older,
    ``(key, at)``) and no keys' table: opened, its keys' tasks are copied from the ledger and the index is
    dropped, under the schema lock, so that a key whose record is long gone is still read."""
    store = SQLStore(store_url)
    try:
        await store.ensure_schema()
        rows = _noise(40)
        await store.write_attempts(rows)
    finally:
        await store.dispose()
    column = "substr(key, 1, 16)" if index.endswith("prefix_idx") else "key"
    if BACKEND == "sqlite":
        drop = "DROP TRIGGER agentguard_calls_leave_keys;"
    else:
        drop = ("DROP TRIGGER agentguard_calls_leave_keys ON agentguard_calls;"
                " DROP FUNCTION agentguard_calls_leave_keys();")
    await raw_exec(store_url, f"{drop} DROP TABLE agentguard_ledger_keys;"
                              f" CREATE INDEX {index} ON agentguard_attempts ({column}, at);")
    store = SQLStore(store_url)
    try:
        await store.ensure_schema()
        found = [await store.read_attempts(key=row[1]) for row in rows[::7]]
        kept = await store.ledger._executor.run("test", _key_rows, body_ran=None)
        names = await store.ledger._executor.run("test", _index_names, body_ran=None)
    finally:
        await store.dispose()
    assert [[e.key for e in entries] for entries in found] == [[row[1]] for row in rows[::7]]
    assert kept == sorted((row[1], row[2], 2e9) for row in rows)
    assert index not in names and "agentguard_attempts_task_idx" in names, names


async def _index_names(conn: Any) -> set[str]:
    from sqlalchemy import text

    sql = ("SELECT name FROM sqlite_master WHERE type = 'index'" if BACKEND == "sqlite"
           else "SELECT indexname FROM pg_indexes WHERE tablename = 'agentguard_attempts'")
    return {r[0] for r in await conn.execute(text(sql))}


async def test_a_keys_row_lasts_while_an_entry_of_its_key_does(
    make_guard: Callable[..., Guard], store_url: str
) -> None:
    """The ledger's sweep deletes a key's row past its expiry only once no entry of the key is left; while one
    is, the row is moved on to that entry's expiry (looked at again then, not at every sweep)."""
    g = make_guard()
    t = tid()

    @g.once
    async def send() -> str:
        return "sent"

    with task(t):
        await send()
    key = (await g.records(task_id=t))[0].key
    await g.forget(key)
    await g.flush_ledger()
    far = 4e9
    await raw_exec(store_url, f"UPDATE agentguard_ledger_keys SET expires_at = 0 WHERE key = '{key}';"
                              f" UPDATE agentguard_attempts SET expires_at = {far} WHERE key = '{key}';")
    await g.sweep()
    store = g._store
    assert isinstance(store, SQLStore)
    assert [r[:2] for r in await store.ledger._executor.run("test", _key_rows, body_ran=None) if r[0] == key] == [
        (key, t)]
    assert [r[2] for r in await store.ledger._executor.run("test", _key_rows, body_ran=None) if r[0] == key] == [far]
    assert [e.kind for e in await g.attempts(key=key)] == ["ran", "forgotten"]
    await raw_exec(store_url, f"UPDATE agentguard_ledger_keys SET expires_at = 0 WHERE key = '{key}';"
                              f" UPDATE agentguard_attempts SET expires_at = 0 WHERE key = '{key}';")
    await g.sweep()
    assert await g.attempts(key=key) == []
    assert [r for r in await store.ledger._executor.run("test", _key_rows, body_ran=None) if r[0] == key] == []


async def test_an_entry_with_a_host_id_no_store_holds_does_not_take_its_batch_with_it(
    make_guard: Callable[..., Guard],
) -> None:
    """A host's id of an invocation reaches the ledger as it came (JSON can carry a NUL, which Postgres' text
    cannot hold, and a lone surrogate, which no store can): it is kept with U+FFFD in their place, and the
    entries written in the same batch are kept too."""
    g = make_guard()
    t = tid()

    async def body(key: str) -> str:
        return key

    await g.run("charge", body, task_id=t, audit={"tool_call_id": "a\x00b"})
    await g.run("refund", body, task_id=t, audit={"callId": "ok-1"})
    # (how the MCP proxy tells the ledger of a call refused before it had a task)
    g._machine.observer.missing_task("charge", json.dumps({"callId": "x\ud800y"}))
    await g.flush_ledger()
    assert g.ledger_dropped == 0
    assert [(e.kind, e.call_id) for e in await g.attempts(task_id=t)] == [("ran", "a\ufffdb"), ("ran", "ok-1")]
    refused = [e for e in await g.attempts() if e.detail == "missing task"]
    assert [e.call_id for e in refused] == ["x\ufffdy"]


async def test_a_key_reuse_naming_an_argument_no_store_holds_costs_the_ledger_nothing_else(
    make_guard: Callable[..., Guard],
) -> None:
    """An MCP host may name an argument ``"a\\x00b"`` (JSON carries a NUL) and the proxy fingerprints every
    argument, so a key reuse names it in its entry's detail. Postgres' text holds no NUL (no store holds a lone
    surrogate, which other texts may carry): that one entry made the store refuse its whole batch, the other
    calls' entries with it. Every text of an entry is kept with U+FFFD in their place, and cut to what its
    column holds (a scope's 255 characters, any other text's 4000)."""
    g = make_guard()
    t = tid()

    async def body(key: str) -> str:
        return "done"

    odd = "a\x00b"
    await g.run("charge", body, task_id=t, key="o-odd", arguments={odd: 1})
    for n in range(9):  # other calls, in the same batch
        await g.run("charge", body, task_id=t, key=f"o-{n}", arguments={"n": n})
    with pytest.raises(KeyReuseError):
        await g.run("charge", body, task_id=t, key="o-odd", arguments={odd: 2})
    # An entry with every text odd (how the ledger is told of a call: the writer's own door).
    g._ledger.add("s" * 300, "k", t, "op\x00", "tool\ud800", "refused", "x" * 10_000, 0, "id\x00", None, None)
    await g.flush_ledger()
    assert g.ledger_dropped == 0
    entries = await g.timeline(t)
    assert [(e.kind, e.detail) for e in entries][:11] == [
        ("ran", "succeeded"), *[("ran", "succeeded")] * 9, ("refused", "reuse (differing: a\ufffdb)")
    ]
    last = entries[11]
    assert (last.scope, last.operation, last.tool, last.call_id) == ("s" * 255, "op\ufffd", "tool\ufffd", "id\ufffd")
    assert last.detail == "x" * 4000
    assert len(entries) == 12


async def test_an_entry_the_store_refuses_costs_only_itself(make_guard: Callable[..., Guard]) -> None:
    """A batch the store refuses for one entry's value (here a task id missing: a NOT NULL column, refused by the
    database itself) is written again entry by entry: the others are kept, the refused one is dropped and
    counted like any other drop, and said so in the ledger."""
    g = make_guard()
    t = tid()

    async def body(key: str) -> str:
        return "done"

    for n in range(5):
        await g.run("charge", body, task_id=t, key=f"o-{n}")
        if n == 2:
            g._ledger.add("default", "k", None, "charge", "charge", "ran", "succeeded", 1,  # type: ignore[arg-type]
                          None, None, None)
    await g.flush_ledger()
    assert g.ledger_dropped == 1
    assert [e.kind for e in await g.timeline(t)] == ["ran"] * 5
    await g.run("charge", body, task_id=t, key="o-5")  # the next batch reports the drop
    await g.flush_ledger()
    notes = [e.detail for e in await g.attempts() if e.kind == "dropped"]
    assert notes == ["1 entries dropped (the store refused them)"]


async def test_a_went_away_attempt_in_a_scope_is_found_through_the_records_indexes(store_url: str) -> None:
    """The console reads a key's or a task's entries in its scope, a page at a time: the attempts whose worker
    went away (derived from the records) are found there through the records' primary key and their task index,
    never a scan of the records (at 420,000 records a task page of 100 operations took 2.6 s, one scan each)."""
    store = SQLStore(store_url)
    n = 5000
    try:
        await store.ensure_schema()
        values = ", ".join(
            f"('s', 'k-{i:05d}', 'task-{i // 4}', 'op[{i}]', '{'f' * 64}', '{{}}', "
            f"'{'running' if i == 1234 else 'succeeded'}', {i + 1}, {i + 1}, 'charge', 1, "
            f"{'1.0' if i == 1234 else 'NULL'}, {1.7e9 + i}, {1.7e9 + i}, 4e9, "
            f"{'NULL' if i == 1234 else chr(39) + 'r' + chr(39)})" for i in range(n))
        await raw_exec(store_url, "INSERT INTO agentguard_calls (scope, key, task_id, operation, fingerprint,"
                       " arg_hashes, state, fence, origin, tool, attempts, lease_until, created_at, updated_at,"
                       f" expires_at, result) VALUES {values}")
        by_key = await store.read_attempts(key="k-01234", scope="s")
        by_task = await store.read_attempts(task_id="task-308", scope="s")
        assert [(e.kind, e.key) for e in by_key] == [("went_away", "k-01234")] == [(e.kind, e.key) for e in by_task]
        assert await store.read_attempts(key="k-01235", scope="s") == []
        sql = store.ledger.sql
        plans = []
        # (a task in any scope too: its index begins with the task)
        for stmt, params in ((sql.gone_by_key_in_scope, {"key": "k-01234", "scope": "s"}),
                             (sql.gone_by_task_in_scope, {"task_id": "task-308", "scope": "s"}),
                             (sql.gone_by_task, {"task_id": "task-308", "scope": None})):
            text, args = store._executor._compiled(stmt, store.engine())
            plans.append((text, args({**params, "since": None, "limit": 10})))
    finally:
        await store.dispose()

    if BACKEND == "sqlite":
        with sqlite3.connect(make_url(store_url).database or "") as conn:
            explained = ["\n".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + text, args))
                         for text, args in plans]
        for p in explained:
            assert "SEARCH c USING" in p and "SCAN c" not in p, p
    else:
        conn = await asyncpg.connect(pg_dsn(store_url))
        try:
            await conn.execute("ANALYZE agentguard_calls")
            explained = ["\n".join(r[0] for r in await conn.fetch("EXPLAIN " + text, *args)) for text, args in plans]
        finally:
            await conn.close()
        for p in explained:
            assert "Seq Scan on agentguard_calls" not in p, p
