"""The console as its tests use it: a store seeded by real guarded calls (a held outcome made by a real
SIGKILL inside a step), and ``agentguard console`` started in a subprocess on a free port and stopped after.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentguard import Guard

HERE = Path(__file__).resolve().parent
SEED = HERE / "console_seed.py"


def seed(store_url: str, mode: str, task_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SEED), store_url, mode, task_id], capture_output=True, text=True,
                          timeout=120, cwd=HERE)


async def _held(store_url: str) -> list[dict[str, Any]]:
    async with Guard(store_url) as guard:
        return await guard.unknown(limit=1000)


def held(store_url: str) -> dict[str, dict[str, Any]]:
    """The operations held on an unknown outcome, by task id. (Read on a thread of its own: Playwright's sync
    API keeps an event loop running in the test's thread.)"""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        found = pool.submit(asyncio.run, _held(store_url)).result()
    return {h["task_id"]: h for h in found}


def many(store_url: str, task_ids: list[str], *, operations: int = 1, scope: str = "default",
         replays: int = 0) -> dict[str, list[str]]:
    """Real guarded calls, 50 at a time: ``operations`` operations in each task, each then replayed ``replays``
    times at once (from the guard's replay cache: within a millisecond or so). Returns each task's keys.
    (On a thread of its own, as ``held``.)"""

    async def go() -> dict[str, list[str]]:
        async with Guard(store_url) as guard:
            async def body(key: str) -> str:
                return key[-6:]

            async def one(t: str, i: int) -> str:
                return (await guard.run("pay", body, key={"n": i}, task_id=t, scope=scope, arguments={"n": i})).key

            calls = [(t, i) for t in task_ids for i in range(operations)]
            keys: dict[str, list[str]] = {}
            for k in range(0, len(calls), 50):
                batch = calls[k:k + 50]
                for (t, _), key in zip(batch, await asyncio.gather(*(one(t, i) for t, i in batch)), strict=True):
                    keys.setdefault(t, []).append(key)
            for t, i in calls if replays else ():
                await asyncio.gather(*(one(t, i) for _ in range(replays)))
            await guard.flush_ledger()
            return keys

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


def seeded(store_url: str, *, done: tuple[str, ...] = ("t-done",), hold: tuple[str, ...] = ("t-held",),
           release: tuple[str, ...] = ()) -> dict[str, str]:
    """Seed the store; returns the key of each held (and released) task's booking. A held one is made by a
    worker SIGKILLed inside its charge step; it is held once its lease (1 s, by the database's clock) ran out,
    which this waits for by reading the store, never by a fixed sleep."""
    for t in done:
        out = seed(store_url, "done", t)
        assert out.returncode == 0, out.stderr
    keys = {}
    for t in release:
        out = seed(store_url, "release", t)
        assert out.returncode == 0, out.stderr
        keys[t] = json.loads(out.stdout)["key"]
    workers = [subprocess.Popen([sys.executable, str(SEED), store_url, "hold", t], cwd=HERE) for t in hold]
    for w in workers:
        assert w.wait(timeout=120) == -signal.SIGKILL
    for _ in range(600):  # at most a minute; each look is one read of the store
        found = held(store_url)
        if set(hold) <= found.keys():
            return keys | {t: found[t]["key"] for t in hold}
        time.sleep(0.1)
    raise AssertionError(f"the held operations did not appear: {held(store_url)}")


@dataclass
class Running:
    base: str  # http://127.0.0.1:PORT
    token: str
    store_url: str
    process: subprocess.Popen[str]

    @property
    def sign_in(self) -> str:
        return f"{self.base}/?token={self.token}"


@contextlib.contextmanager
def console(store_url: str, log: Path, *args: str) -> Iterator[Running]:
    """``agentguard console --url STORE --port 0`` until the block ends (SIGTERM, then its exit is awaited)."""
    env = {k: v for k, v in os.environ.items() if k != "AGENTGUARD_URL"}
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "agentguard.cli", "console", "--url", store_url, "--port", "0",
                                 *args], stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=HERE)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # the socket listens before the URL is printed
            lines.append(line)
            if "read-only:" in line:
                break
        found = re.search(r"(http://127\.0\.0\.1:\d+)/\?token=(\S+)", "".join(lines))
        assert found, "".join(lines) + log.read_text()
        yield Running(found[1], found[2], store_url, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()
