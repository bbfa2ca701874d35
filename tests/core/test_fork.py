"""A guard used before its process forked (multiprocessing's ``fork``, gunicorn's ``--preload``, Celery's prefork
pool) works in the child: its own portal loop, connections, heartbeats and ledger writer; the parent's are
neither used nor closed there. Real forks, on the suite's backend, with sync and async tools.

Each test uses the guard in the parent first (a sync tool: its portal loop, its connections and its ledger
writer are up), then forks. The child's body waits for a file the parent makes, never for a fixed time; every
wait gives up after ``WAIT`` (a failure, never a timing the test asserts).
"""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing
import os
import socket
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from agentguard import Guard, GuardError, InProgressError, StoreError, task

from conftest import BACKEND, pg_execute, tid

pytestmark = [
    pytest.mark.slow,
    # Python 3.12+ warns that forking a process with threads (the guard's portal) may deadlock the child; these
    # tests fork such a process on purpose, with every thread of it idle.
    pytest.mark.filterwarnings("ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning"),
]

FORK = multiprocessing.get_context("fork")
LEASE = 2.0  # seconds: the child's body outlives it, and its heartbeat keeps the claim
WAIT = 60.0  # seconds after which any wait of these tests gives up


class Declined(Exception):
    """The provider's refusal: not a cached error, so the claim is released for a retry."""


def wait_for(cond: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def effects_of(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


def one_row(url: str, sql: str) -> tuple[Any, ...] | None:
    """One row of ``sql`` on the store's database, read behind the guard's back."""
    if url.startswith("sqlite"):
        path = make_url(url).database
        assert path
        conn = sqlite3.connect(path, timeout=30)
        try:
            row = conn.execute(sql).fetchone()
        finally:
            conn.close()
        return None if row is None else tuple(row)
    rows = pg_execute(url, sql)
    return tuple(rows[0]) if rows else None


def record_of(url: str, task_id: str) -> tuple[Any, ...] | None:
    """(state, lease_until, attempts) of the task's one record."""
    return one_row(url, f"SELECT state, lease_until, attempts FROM agentguard_calls WHERE task_id = '{task_id}'")


def backends(url: str) -> set[int]:
    """The server processes of the store's connections (Postgres): those the guard opened so far."""
    database = make_url(url).database
    rows = pg_execute(url, "SELECT pid FROM pg_stat_activity WHERE application_name = 'agentguard'"
                           f" AND datname = '{database}'")
    return {int(r[0]) for r in rows}


def ledger_of(url: str, task_id: str) -> list[tuple[str, str]]:
    """(kind, process) of the task's ledger entries, oldest first (read with a guard of its own)."""

    async def read() -> list[tuple[str, str]]:
        async with Guard(url) as reader:
            return [(a.kind, a.process) for a in await reader.attempts(task_id=task_id)]

    return asyncio.run(read())


class Tools:
    """The guarded tools of one test, on one guard, defined before the fork (so the child has them too). The
    body of ``charge`` records its side effect; in the child it then tells the parent it started and waits
    for the parent's word (``release``), and raises ``Declined`` if ``declines``."""

    def __init__(self, guard: Guard, tmp: Path, kind: str, *, declines: bool = False) -> None:
        self.effects, self.started, self.release = tmp / "effects", tmp / "started", tmp / "release"
        self.kind = kind
        self.parent = os.getpid()

        def effect(order_id: str) -> None:
            with self.effects.open("a") as f:
                f.write(f"{order_id} {os.getpid()}\n")

        def in_child() -> None:
            self.started.touch()
            assert wait_for(self.release.exists), "the parent never said to go on"
            if declines:
                raise Declined("card declined")

        @guard.once(key=["order_id"])
        def warm(order_id: str) -> str:
            effect(order_id)
            return f"warmed {order_id}"

        self.warm = warm
        if kind == "sync":

            @guard.once(key=["order_id"])
            def charge(order_id: str, idempotency_key: str = "") -> str:
                effect(order_id)
                if os.getpid() != self.parent:
                    in_child()
                return f"charged {order_id} in {os.getpid()}"

            self._charge: Callable[[str], Any] = charge
        else:

            @guard.once(key=["order_id"])
            async def acharge(order_id: str, idempotency_key: str = "") -> str:
                effect(order_id)
                if os.getpid() != self.parent:
                    await asyncio.to_thread(in_child)
                return f"charged {order_id} in {os.getpid()}"

            self._charge = acharge

    def charge(self, order_id: str) -> str:
        """Call the tool, from sync code (an async tool in an ``asyncio.run`` of its own)."""
        if self.kind == "sync":
            return self._charge(order_id)
        return asyncio.run(self._charge(order_id))


def child_main(guard: Guard, tools: Tools, task_id: str, out: Path, kind: str) -> int:
    """What a forked child does: one call of ``charge`` in the task, then the guard closed (``close()`` after a
    sync tool, ``aclose()`` in the child's own loop after an async one). Writes what it got to ``out``; returns
    the exit code: 0 for a result, 3 for ``Declined``."""
    got: dict[str, Any] = {}

    async def in_loop() -> None:
        try:
            with task(task_id):
                got["result"] = await tools._charge("o-1")
        except Declined as exc:
            got["declined"] = str(exc)
        finally:
            await guard.aclose()

    if kind == "sync":
        try:
            with task(task_id):
                got["result"] = tools.charge("o-1")
        except Declined as exc:
            got["declined"] = str(exc)
        finally:
            guard.close()
    else:
        asyncio.run(in_loop())
    got["closed"] = True
    gc.collect()  # (anything of the parent's merely dropped here, not kept, would be finalised now)
    out.write_text(json.dumps(got))
    return 3 if "declined" in got else 0


def on_parents_portal(guard: Guard) -> None:
    """A statement on the guard's portal loop, on the connections it held at the fork (with a bound: a
    connection of the parent's that a child closed, or took off the parent's selector, fails or never answers)."""
    done = asyncio.run_coroutine_threadsafe(guard._store.read("default", "no-such-key"), guard._portal.loop())
    assert done.result(timeout=WAIT) is None


def warmed(store_url: str, tmp: Path, kind: str, **options: Any) -> tuple[Guard, Tools]:
    """A guard in use in this process: a sync tool called (its portal loop, its connections and its ledger
    writer are up) and the ledger written, so no thread of this process is inside the store at the fork."""
    guard = Guard(store_url, lease=LEASE, on_conflict="raise")
    tools = Tools(guard, tmp, kind, **options)
    with task("t-warm"):
        assert tools.warm("o-warm") == "warmed o-warm"
    asyncio.run(guard.flush_ledger())
    if store_url.startswith("sqlite"):
        # A child forked with the SQLite file open is refused (its writes could be lost: the last test below);
        # closed first, as that refusal says, the guard is still the one the parent used, and reopens on use.
        guard.close()
    return guard, tools


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_forked_childs_long_body_is_renewed_by_its_own_heartbeat(store_url: str, tmp_path: Path,
                                                                   kind: str) -> None:
    """The child's body outlives the lease: the child's heartbeat renews its claim, so the parent calling the
    same key meanwhile is told it is in progress and never runs it (one side effect); then the parent replays
    the child's result, the child's close returned, the child's ledger entries landed, and the parent's own
    connections, untouched by the child, go on serving it."""
    guard, tools = warmed(store_url, tmp_path, kind)
    t = tid()
    parent_backends = backends(store_url) if not store_url.startswith("sqlite") else set()
    assert parent_backends or store_url.startswith("sqlite")  # (the parent's connections, open at the fork)
    out = tmp_path / "child.json"
    child = FORK.Process(target=lambda: sys.exit(child_main(guard, tools, t, out, kind)))
    child.start()
    in_progress: list[GuardError] = []
    try:
        assert wait_for(tools.started.exists), "the child's body never started"
        rec = record_of(store_url, t)
        assert rec is not None and rec[0] == "running"
        first = float(rec[1])
        # Renewed since first seen: only the child's heartbeat can have done it (waited for, not timed: a loaded
        # machine's child may take a while to renew, and its lease then runs on from the renewal).
        assert wait_for(lambda: float((record_of(store_url, t) or ("", first))[1]) > first), \
            "the child's lease was not renewed"
        rec = record_of(store_url, t)
        assert rec is not None and rec[0] == "running"
        try:
            with task(t):
                tools.charge("o-1")
        except InProgressError as exc:
            in_progress.append(exc)
    finally:
        tools.release.touch()
        child.join(WAIT)
        if child.exitcode is None:
            child.kill()
            child.join()
    assert child.exitcode == 0, "the child hung or failed"
    got = json.loads(out.read_text())
    assert got == {"result": f"charged o-1 in {child.pid}", "closed": True}
    assert in_progress, "the parent ran (or took over) the call the child was running"
    try:
        with task(t):
            assert tools.charge("o-1") == got["result"]  # the child's outcome, replayed in the parent
        assert [e for e in effects_of(tools.effects) if e.startswith("o-1")] == [f"o-1 {child.pid}"]
        assert record_of(store_url, t)[0::2] == ("succeeded", 1)
        # The parent's guard goes on, on its own connections (the child neither used nor closed them).
        on_parents_portal(guard)
        with task(t):
            assert tools.charge("o-2") == f"charged o-2 in {os.getpid()}"
        if parent_backends:
            assert parent_backends <= backends(store_url)
    finally:
        guard.close()
    # The child's ledger entries landed, under the child's own process.
    host = socket.gethostname()
    entries = ledger_of(store_url, t)
    assert (("ran", f"{host}:{child.pid}") in entries and ("refused", f"{host}:{os.getpid()}") in entries
            ), entries


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_body_that_raises_in_a_forked_child_releases_its_claim(store_url: str, tmp_path: Path,
                                                                kind: str) -> None:
    """The child's body raises: its claim is released and the error reaches the caller (no hang: the child
    exits with its own code), its close returns, its ``released`` entry lands; a retry in the parent claims
    the key again and runs (attempt 2). Forked with ``os.fork`` itself."""
    guard, tools = warmed(store_url, tmp_path, kind, declines=True)
    t = tid()
    out = tmp_path / "child.json"
    tools.release.touch()  # (the body declines at once)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = child_main(guard, tools, t, out, kind)
        finally:
            os._exit(code)
    exited: list[int] = []

    def reaped() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            exited.append(os.waitstatus_to_exitcode(status))
        return bool(done)

    try:
        if not wait_for(reaped):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert exited == [3], "the child hung or failed"
        assert json.loads(out.read_text()) == {"declined": "card declined", "closed": True}
        assert record_of(store_url, t)[0::2] == ("released", 1)
        on_parents_portal(guard)
        with task(t):
            assert tools.charge("o-1") == f"charged o-1 in {os.getpid()}"  # the retry runs, in the parent
        assert [e for e in effects_of(tools.effects) if e.startswith("o-1")] == [f"o-1 {pid}", f"o-1 {os.getpid()}"]
        assert record_of(store_url, t)[0::2] == ("succeeded", 2)
    finally:
        guard.close()
    host = socket.gethostname()
    assert ("released", f"{host}:{pid}") in ledger_of(store_url, t)


@pytest.mark.storeless
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_in_memory_store_refuses_in_a_forked_child(tmp_path: Path, kind: str) -> None:
    """An in-memory store lives in the process that made it: a forked child would see an empty database and
    run again what the parent ran. It refuses there, saying why, before any body runs; a replay the child
    already holds is served; the parent's store goes on."""
    guard = Guard("sqlite+aiosqlite://", lease=LEASE)
    tools = Tools(guard, tmp_path, kind)
    with task("t-warm"):
        assert tools.warm("o-warm") == "warmed o-warm"
    out = tmp_path / "child.json"

    def child() -> None:
        got: dict[str, Any] = {}
        with task("t-warm"):
            got["replayed"] = tools.warm("o-warm")  # (from the replay cache: the parent's outcome)
        try:
            with task(tid()):
                tools.charge("o-1")
        except StoreError as exc:
            got["refused"] = str(exc)
        if kind == "sync":
            guard.close()
        else:
            asyncio.run(guard.aclose())
        out.write_text(json.dumps(got))

    proc = FORK.Process(target=child)
    proc.start()
    proc.join(WAIT)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
    try:
        assert proc.exitcode == 0
        got = json.loads(out.read_text())
        assert got["replayed"] == "warmed o-warm"
        assert "forked" in got["refused"] and "the tool was not run" in got["refused"], got
        assert [e for e in effects_of(tools.effects) if e.startswith("o-1")] == []
        with task("t-fresh"):
            assert tools.charge("o-1") == f"charged o-1 in {os.getpid()}"
    finally:
        guard.close()


@pytest.mark.skipif(BACKEND != "sqlite", reason="SQLite's file locks: runs in the SQLite pass")
@pytest.mark.parametrize("closed_first", [False, True], ids=["open", "closed_first"])
def test_sqlite_open_at_the_fork_is_refused_and_closing_first_keeps_the_childs_writes(
        store_url: str, tmp_path: Path, closed_first: bool) -> None:
    """SQLite keeps its file locks per process, and a child inherits its parent's account of them: a child forked
    while the parent had the file open takes no lock of its own where the parent held one, so the parent closing
    its last connection may remove the write-ahead log under it and lose the child's records. Such a child fails
    closed: every call is refused before its body runs, saying how to avoid it. With the guard closed before the
    fork (the cure it names) the child works, and its writes survive the parent using the store again and then
    closing every connection it has while the child still writes."""
    guard = Guard(store_url, lease=LEASE)
    said, go, out = tmp_path / "said", tmp_path / "go", tmp_path / "out"
    runs = tmp_path / "runs"

    @guard.once(key=["n"])
    def tool(n: int) -> int:
        with open(runs, "a") as f:
            f.write(f"{n}\n")
        return n

    def child() -> None:
        with task("t-child"):
            try:
                answers: list[object] = [tool(1)]
            except StoreError as exc:
                answers = [str(exc)]
            said.touch()
            assert wait_for(go.exists)
            try:
                answers.append(tool(2))
            except StoreError as exc:
                answers.append(str(exc))
        out.write_text(json.dumps(answers))
        guard.close()

    try:
        with task("t-parent"):
            assert tool(0) == 0
        asyncio.run(guard.flush_ledger())
        if closed_first:
            guard.close()
        proc = FORK.Process(target=child)
        proc.start()
        try:
            assert wait_for(said.exists)
            if closed_first:
                with task("t-parent"):
                    assert tool(10) == 10  # (the parent's guard reopens its connections)
                guard.close()  # every connection the parent has, closed while the child still writes
        finally:
            go.touch()
            proc.join(WAIT)
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        assert proc.exitcode == 0
    finally:
        guard.close()
    answers = json.loads(out.read_text())
    ran = runs.read_text().split()
    if not closed_first:
        for said_ in answers:
            assert isinstance(said_, str) and "was forked from process" in said_
            assert "Close the guard before forking" in said_ and "the tool was not run" in said_
        assert ran == ["0"]  # nothing ran in the child
        return
    assert answers == [1, 2] and ran == ["0", "1", "10", "2"]
    path = make_url(store_url).database
    assert path
    conn = sqlite3.connect(path)
    try:
        operations = sorted(r[0] for r in conn.execute("SELECT operation FROM agentguard_calls"))
    finally:
        conn.close()
    assert operations == ["tool[n=0]", "tool[n=10]", "tool[n=1]", "tool[n=2]"]
