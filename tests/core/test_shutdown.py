"""Nothing leaks at shutdown: closing a guard (or ending its event loop) waits for every statement still
running on aiosqlite's threads, so none of them reports to a loop that has closed ("Event loop is closed")."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agentguard import Guard, task

from conftest import tid

pytestmark = pytest.mark.storeless  # independent of the store's backend

HOLD = (  # the write lock, held until told on stdin (or, if never told, for a minute)
    "import select, sqlite3, sys\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "c.execute('BEGIN EXCLUSIVE')\n"
    "print('locked', flush=True)\n"
    "select.select([sys.stdin], [], [], 60)\n"
    "c.execute('COMMIT')\n"
)


def _join_aiosqlite_threads() -> None:
    """Wait for aiosqlite's worker threads (daemons) to end: one still busy reports when it finishes."""
    for thread in threading.enumerate():
        if "_connection_worker_thread" in thread.name:
            thread.join(timeout=10)


def _run_with_lock_held(db: Path, main: Any) -> list[BaseException]:
    """Run ``asyncio.run(main())`` while another process holds the SQLite write lock; return what threads
    raised meanwhile and afterwards (until every aiosqlite thread has ended)."""
    raised: list[BaseException] = []
    with subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"

        def release() -> None:  # (told, not timed: a slow machine never lets the lock go too early)
            assert holder.stdin is not None
            holder.stdin.write(b"go\n")
            holder.stdin.flush()

        previous = threading.excepthook
        threading.excepthook = lambda args: raised.append(args.exc_value or RuntimeError("?"))
        try:
            asyncio.run(main(release))
            assert holder.wait(timeout=30) == 0
            _join_aiosqlite_threads()
        finally:
            threading.excepthook = previous
            holder.kill()
    return raised


def test_closing_a_guard_waits_for_a_statement_still_running(tmp_path: Path) -> None:
    db = tmp_path / "agentguard.db"
    url = f"sqlite+aiosqlite:///{db}"
    with Guard(url) as warm:  # the file and its WAL exist before the lock is taken
        warm.run_sync("warm", lambda key: key, task_id=tid())

    async def main(release: Any) -> None:
        guard = Guard(url)
        runs = 0

        @guard.once
        async def charge(amount: int) -> int:
            nonlocal runs
            runs += 1
            return amount

        async def call() -> None:
            with task(tid()):
                await charge(1)

        caller = asyncio.create_task(call())
        await asyncio.sleep(0.3)  # the claim waits for the write lock on aiosqlite's thread
        caller.cancel()  # the caller goes away; the statement goes on in the thread
        release()  # (the lock comes free only now: the statement ends after its caller went)
        with pytest.raises(asyncio.CancelledError):
            await caller
        await guard.aclose()  # must wait for it: the loop closes right after
        assert runs == 0

    assert _run_with_lock_held(db, main) == []


def test_a_loop_ending_while_the_schema_is_made_leaks_nothing(tmp_path: Path) -> None:
    db = tmp_path / "agentguard.db"
    db.touch()

    async def main(release: Any) -> None:
        guard = Guard(f"sqlite+aiosqlite:///{db}")
        making = asyncio.create_task(guard.ensure_schema())  # blocked on the write lock
        await asyncio.sleep(0.3)
        making.cancel()  # the schema task itself is shielded and goes on
        release()
        with pytest.raises(asyncio.CancelledError):
            await making
        # no aclose: asyncio.run ends the loop, which disposes the store's engine on its way out

    assert _run_with_lock_held(db, main) == []


def test_a_connect_in_flight_when_the_loop_ends_leaks_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """aiosqlite stops a connection whose connect was cancelled without waiting for its thread; the loop ending
    right then (a test's loop, ``asyncio.run``, a proxy shutting down under a host) must still wait for it. A
    slow file system is played by a connect that takes half a second on aiosqlite's thread."""
    import sqlite3
    import time

    real = sqlite3.connect

    def slow_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", slow_connect)
    raised: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: raised.append(args.exc_value or RuntimeError("?"))
    try:

        async def main() -> None:
            guard = Guard(f"sqlite+aiosqlite:///{tmp_path / 'agentguard.db'}")
            asyncio.get_running_loop().create_task(guard.ensure_schema())  # connecting when the loop ends
            await asyncio.sleep(0.1)

        asyncio.run(main())
        _join_aiosqlite_threads()
    finally:
        threading.excepthook = previous
    assert raised == []
