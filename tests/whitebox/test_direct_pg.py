"""Postgres' sync-thread executor, over psycopg (``stores/_direct_pg.py``): a sync tool's statements in its own
thread. Its statements and plans are proved equal to the general path's (asyncpg on the portal's loop) in
tests/whitebox/test_executors.py (and under the state machine, tests/whitebox/test_stateful_store.py); here, on a
real server: whole guarded calls leave the same records and report the same events either way; real threads run each
body once; the connections stay within the pool's capacity and are let go with their threads, carry the general
path's session settings, and a server that drops them, or goes away, never gets a body run twice."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from direct_calls import CALL_ROWS, General, check_whole_sync_calls, whole_sync_calls
from sqlalchemy.engine import make_url

from agentguard import Guard, GuardEvent, StoreError, task
from agentguard.stores import SQLStore
from agentguard.stores._direct_pg import DirectPostgres

from conftest import BACKEND, PG_URL, _pg_admin, pg_database, pg_database_done, pg_execute

pytestmark = [pytest.mark.postgres,
              pytest.mark.skipif(BACKEND != "postgres", reason="Postgres' shortcut: runs in the Postgres pass")]


@pytest.fixture
def databases() -> Iterator[Callable[[], str]]:
    """Fresh databases on the test server, as many as the test asks for; dropped at its end."""
    names: list[str] = []

    def make() -> str:
        name = pg_database()
        names.append(name)
        return make_url(PG_URL).set(database=name).render_as_string(hide_password=False)

    yield make
    for name in names:
        pg_database_done(name)


def _params(key: str, fence: int, fingerprint: str = "f", owner: str | None = None) -> dict[str, Any]:
    return {"scope": "s", "key": key, "task_id": "t", "operation": "op", "fingerprint": fingerprint,
            "arg_hashes": "{}", "fence": fence, "tool": "op", "arguments": None, "owner": owner or f"o{fence}",
            "lease": 30.0, "retention": 60.0, "audit": None}


def _direct(store: SQLStore) -> DirectPostgres:
    direct = store.direct()
    assert isinstance(direct, DirectPostgres)
    return direct


def _pids(direct: DirectPostgres) -> set[int]:
    return {c.info.backend_pid for c in list(direct._conns.values()) if c is not None and not c.closed}


def _backends(url: str, pids: set[int]) -> set[int]:
    """Which of ``pids`` are server backends now."""
    if not pids:
        return set()
    rows = pg_execute(url, f"SELECT pid FROM pg_stat_activity WHERE pid IN ({', '.join(map(str, pids))})")
    return {r[0] for r in rows}


def _backends_gone(url: str, pids: set[int]) -> bool:
    """Whether ``pids`` have all left the server (a closed connection's backend exits a moment later)."""
    for _ in range(3000):
        if not _backends(url, pids):
            return True
        threading.Event().wait(0.01)
    return False


def test_whole_sync_calls_equal_the_general_path(databases: Callable[[], str]) -> None:
    def run(store: SQLStore) -> tuple[Any, ...]:
        return whole_sync_calls(store, lambda: [tuple(r) for r in pg_execute(store.url, CALL_ROWS)],
                                lambda direct: direct is not None and bool(_pids(direct)))

    # (a replay from the store makes the task replaying; a claim won ends it)
    assert check_whole_sync_calls(run(SQLStore(databases())), run(General(databases()))) == [True, False]


def _threads(n: int, target: Callable[[int], None]) -> list[threading.Thread]:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    return threads


def test_threads_run_each_body_once(databases: Callable[[], str]) -> None:
    """16 threads race on one key and on 8 keys of their own each: every body runs exactly once."""
    guard = Guard(databases(), cache_size=0)
    runs: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)
    results: dict[str, set[str]] = {}

    @guard.once(key=["order_id"])
    def charge(order_id: str, idempotency_key: str = "") -> str:
        with lock:
            runs.append(order_id)
        return idempotency_key

    def worker(i: int) -> None:
        barrier.wait(60)
        with task("t-race"):
            for order in ["o-shared", *(f"o-{i}-{j}" for j in range(8)), "o-shared"]:
                key = charge(order)
                with lock:
                    results.setdefault(order, set()).add(key)

    try:
        with task("t-warm"):
            charge("o-warm")  # (the schema is made on the general path: the shortcut needs it made)
        runs.clear()
        _threads(16, worker)
        assert len(_pids(_direct(guard._store))) >= 2  # the threads claimed in their own threads
    finally:
        guard.close()
    assert sorted(runs) == sorted(["o-shared", *(f"o-{i}-{j}" for i in range(16) for j in range(8))])
    assert all(len(keys) == 1 for keys in results.values()) and len(results) == 1 + 16 * 8


def test_connections_stay_within_the_pool_and_leave_with_their_threads(databases: Callable[[], str]) -> None:
    """With a budget of 3 connections (max_connections): 8 threads whose bodies all run at
    once hold at most 3 connections in all, direct ones and the guard's pool's together, on the server too (the
    others claim and complete on the general path, each body once); once they end, the next thread's first call
    closes theirs, and their server backends go."""
    url = databases()
    guard = Guard(url, pool_size=1, cache_size=0, max_connections=3)
    runs: list[int] = []
    together = threading.Barrier(9)  # 8 bodies and the test, all at once

    @guard.once(key=["n"])
    def held(n: int) -> int:
        runs.append(n)
        if n >= 0:
            together.wait(60)  # every body runs now: every thread holds whatever it claimed with
            together.wait(60)  # (until the test has counted)
        return n

    try:
        with task("t-cap"):
            held(-1)  # (the schema is made on the general path)
        runs.clear()
        callers = [threading.Thread(target=_in_task, args=("t-cap", held, i)) for i in range(8)]
        for t in callers:
            t.start()
        together.wait(60)
        direct = _direct(guard._store)
        pids = _pids(direct)
        mine = pg_execute(url, "SELECT pid FROM pg_stat_activity WHERE application_name = 'agentguard'"
                               " AND datname = current_database()")
        assert len(mine) <= 3 and pids <= {r[0] for r in mine}  # the budget, on the server too
        together.wait(60)
        for t in callers:
            t.join(60)
        assert sorted(runs) == list(range(8))
        # What the ended threads left open (a thread's may have been closed for a caller waiting for a slot of
        # the budget meanwhile, and opened again for its completion).
        pids = _pids(direct)
        _in_task("t-cap", held, -2)  # a new thread's first call: the ended threads' connections are closed
        assert not pids & _pids(direct) and len(_pids(direct)) <= 1
        assert _backends_gone(url, pids)
    finally:
        guard.close()
    assert _pids(direct) == set()  # closed with the guard


def _in_task(task_id: str, tool: Any, n: int) -> Any:
    def run() -> None:
        with task(task_id):
            out.append(tool(n))

    out: list[Any] = []
    thread = threading.Thread(target=run)
    thread.start()
    thread.join(120)
    return out[0] if out else None


def test_killed_connections_never_run_a_body_twice(databases: Callable[[], str]) -> None:
    """The server drops the direct connections (pg_terminate_backend) between calls and inside a body (after
    the claim, before the completion): the general path completes the call, the outcome is recorded once, and
    the next call opens a new connection."""
    url = databases()
    guard = Guard(url, cache_size=0)
    runs: list[str] = []

    def kill_direct() -> None:
        pids = _pids(_direct(guard._store))
        assert pids
        pg_execute(url, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid IN"
                        f" ({', '.join(map(str, pids))})")
        assert _backends_gone(url, pids)

    @guard.once(key=["order_id"])
    def charge(order_id: str, idempotency_key: str = "") -> str:
        runs.append(order_id)
        if order_id.startswith("o-kill"):
            kill_direct()
        return idempotency_key

    try:
        with task("t-kill"):
            charge("o-warm")  # (the schema is made on the general path)
            first = charge("o-1")
            kill_direct()
            assert charge("o-2") and charge("o-1") == first  # the claim's connection was gone: the general path
            killed = charge("o-kill-1")  # its completion's connection is gone: the general path records it
            assert charge("o-kill-1") == killed and charge("o-3")
            assert _pids(_direct(guard._store))  # a new direct connection, after the lost one
    finally:
        guard.close()
    assert runs == ["o-warm", "o-1", "o-2", "o-kill-1", "o-3"]
    rows = pg_execute(url, "SELECT key, state FROM agentguard_calls WHERE state <> 'succeeded'")
    assert rows == []


def test_a_store_gone_fails_closed(databases: Callable[[], str]) -> None:
    """The database dropped under the guard: neither path can claim, and the call fails closed, unrun."""
    url = databases()
    guard = Guard(url, cache_size=0)
    runs: list[str] = []

    @guard.once(key=["order_id"])
    def charge(order_id: str) -> str:
        runs.append(order_id)
        return order_id

    try:
        with task("t-gone"):
            charge("o-warm")
            charge("o-1")  # (a direct connection is open)
            assert _pids(_direct(guard._store))
            asyncio.run(_pg_admin(f"DROP DATABASE {make_url(url).database} WITH (FORCE)"))
            for _ in range(2):
                with pytest.raises(StoreError, match="the tool was not run"):
                    charge("o-2")
    finally:
        guard.close()
    assert runs == ["o-warm", "o-1"]


class _AnswerLost:
    """The direct statements, but each claim's answer is lost after it committed (as when the connection dies
    at that moment)."""

    def __init__(self, direct: Any) -> None:
        self._direct = direct

    def claim(self, params: dict[str, Any], likely_taken: bool = False) -> Any:
        self._direct.claim(params, likely_taken)
        raise StoreError("the store failed (claiming the key: the connection was lost)", transient=True)

    def complete(self, *args: Any) -> bool:
        return bool(self._direct.complete(*args))

    def close(self) -> None:
        self._direct.close()


class LosesAnswers(SQLStore):
    def direct(self) -> Any:
        direct = super().direct()
        return None if direct is None else _AnswerLost(direct)


def test_a_claim_whose_answer_was_lost_is_found_ours(databases: Callable[[], str]) -> None:
    """A direct claim may commit and lose its answer: the general path, claiming as the same owner, finds the
    record its own and runs the body once, at once (not after the lease, as another caller's)."""
    url = databases()
    events: list[GuardEvent] = []
    guard = Guard(store=LosesAnswers(url), cache_size=0, lease=600, on_conflict="raise", on_event=events.append)
    runs: list[str] = []

    @guard.once(key=["order_id"])
    def charge(order_id: str, idempotency_key: str = "") -> str:
        runs.append(order_id)
        return idempotency_key

    try:
        with task("t-lost"):
            charge("o-warm")  # (the schema is made on the general path)
            events.clear()
            key = charge("o-1")
            assert charge("o-1") == key
    finally:
        guard.close()
    assert runs == ["o-warm", "o-1"]
    assert [(e.kind, e.attempt) for e in events] == [("claimed", 1), ("completed", 1), ("replayed", 1)]
    assert [tuple(r) for r in pg_execute(url, "SELECT state, attempts FROM agentguard_calls WHERE state <> 'x'"
                                              " ORDER BY key")] == [("succeeded", 1), ("succeeded", 1)]


def test_a_forked_child_opens_its_own_connection(databases: Callable[[], str]) -> None:
    """A child forked after its parent opened a direct connection never uses (or closes) the parent's."""
    url = databases()
    store = SQLStore(url)
    asyncio.run(store.ensure_schema())
    direct = _direct(store)
    assert direct.claim(_params("k-parent", 1)) == 1
    parent = _pids(direct)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a claim of its own, on a connection of its own
        code = 1
        try:
            got = direct.claim(_params("k-child", 2))
            os.write(write, f"{got} {' '.join(map(str, _pids(direct)))}".encode())
            direct.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    got, *child = os.read(read, 1000).decode().split()
    assert got == "2" and child and not set(map(int, child)) & parent
    assert _pids(direct) == parent and direct.claim(_params("k-parent", 3)).fence == 1  # the parent's still works
    direct.close()
    assert _backends_gone(url, parent)


def test_the_direct_connections_have_the_general_paths_settings(databases: Callable[[], str]) -> None:
    """The session the general path's connections get (application_name, synchronous_commit), and the claim's
    own ``set_config`` with pg_claim_unsynced: its transaction commits unsynced, a completion's does not."""
    url = databases()
    store = SQLStore(url, pg_synchronous_commit="local", pg_claim_unsynced=True)

    async def general() -> tuple[str, str]:
        await store.ensure_schema()
        async with store.engine().connect() as conn:
            got = await conn.exec_driver_sql("SELECT current_setting('application_name'),"
                                             " current_setting('synchronous_commit')")
            row = got.one()
            return row[0], row[1]

    try:
        there = asyncio.run(general())
        direct = _direct(store)
        assert direct.claim(_params("k", 1)) == 1
        conn = direct._local.conn[0]
        assert conn.execute("SELECT current_setting('application_name'), current_setting('synchronous_commit')"
                            ).fetchone() == there == ("agentguard", "local")
        claim_sql, claim_args = direct._compiled(store.sql.claim)
        complete_sql, complete_args = direct._compiled(store.sql.complete)
        for sql, args, expected in ((claim_sql, claim_args(_params("k2", 2)), "off"),
                                    (complete_sql, complete_args({**_params("k", 1), "state": "succeeded",
                                                                  "result": "r"}), "local")):
            with conn.transaction(force_rollback=True):
                conn.execute(sql, args)
                assert conn.execute("SHOW synchronous_commit").fetchone()[0] == expected
    finally:
        _direct(store).close()


def test_without_psycopg_or_with_url_parameters_the_general_path_runs(
        databases: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No shortcut where psycopg is missing, or where the URL carries parameters libpq would read otherwise:
    sync tools then take the general path, as before, with no error for it."""
    from agentguard.stores import _direct_pg

    assert _direct_pg.connect_kwargs(PG_URL + "?ssl=disable", None) is None
    monkeypatch.setattr(_direct_pg, "missing", lambda *modules: "psycopg")
    guard = Guard(databases(), cache_size=0)
    runs: list[str] = []

    @guard.once(key=["order_id"])
    def charge(order_id: str, idempotency_key: str = "") -> str:
        runs.append(order_id)
        return idempotency_key

    try:
        with task("t-none"):
            keys = [charge("o-1"), charge("o-2"), charge("o-1")]
        assert guard._store.direct() is None
    finally:
        guard.close()
    assert runs == ["o-1", "o-2"] and keys[0] == keys[2] != keys[1]


def test_closing_never_cuts_a_statement_running_in_another_thread(databases: Callable[[], str]) -> None:
    """``close()`` (a guard closing) while another thread's completion waits on a row lock: the connection is
    not freed under the statement, which completes; that thread then opens a new connection, and the old one
    leaves the server once dropped."""
    import psycopg

    from agentguard.stores._direct_pg import connect_kwargs

    url = databases()
    store = SQLStore(url)
    asyncio.run(store.ensure_schema())
    direct = _direct(store)
    done: list[Any] = []
    kwargs = connect_kwargs(url, None)
    assert kwargs is not None
    with psycopg.connect(**{**kwargs, "autocommit": False, "application_name": "locker"}) as locker:
        claimed = threading.Event()

        def complete() -> None:
            assert direct.claim(_params("k", 1)) == 1
            locker.execute("SELECT 1 FROM agentguard_calls WHERE key = 'k' FOR UPDATE")  # (its transaction open)
            done.append(_pids(direct))
            claimed.set()
            done.append(direct.complete("s", "k", 1, "succeeded", "r", 60.0))  # waits for the row lock
            done.append(direct.claim(_params("k", 2)))  # (on a new connection: the old one was let go)
            done.append(_pids(direct))

        thread = threading.Thread(target=complete)
        thread.start()
        assert claimed.wait(60)
        (pid,) = done[0]
        for _ in range(6000):  # until the completion waits on the lock
            waiting = pg_execute(url, f"SELECT wait_event_type FROM pg_stat_activity WHERE pid = {pid}")
            if waiting and waiting[0][0] == "Lock":
                break
            threading.Event().wait(0.01)
        direct.close()  # cannot close it under the running statement: leaves it to its thread
        assert _backends(url, {pid}) == {pid}
        locker.commit()
        thread.join(60)
    assert done[1] is True and done[2].state == "succeeded" and pid not in done[3]
    direct.close()
    assert _backends_gone(url, {pid} | done[3])
