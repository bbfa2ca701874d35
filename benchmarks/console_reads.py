"""What the console's pages cost, answered whole (the store's reads and the HTML), beside ``agentguard ls``.

    python -m benchmarks.console_reads [--tasks N] [--big N] [--url URL]

Fills a store with ``N`` tasks (default 100,000) of four records each by plain inserts — one task in a hundred
with a record held for a person, one in ten with a failed one — and one task of ``--big`` operations (default
20,000) by real guarded calls, so that it has its entries in the ledger too. Then asks the console's
application (in this process, through httpx's ASGI transport: no socket) for each page a few times, keeping
the median and the page's size, with ``agentguard ls`` (``Guard.records``, 100 records) as the yardstick. The
default store is a throwaway SQLite file; ``--url`` names another (an empty Postgres database, say; a store
filled by an earlier run is used as it is). Nothing is timed inside a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from sqlalchemy import text

from agentguard import Guard
from agentguard.console._app import Console
from agentguard.console._auth import Gate, new_token
from agentguard.stores import SQLStore

ROUNDS = 5
PER_TASK = 4
BIG = "big-task"


def _relaxed(url: str) -> dict[str, Any]:
    """Store options for the filling, which is not what is timed: commits that do not wait for the disk."""
    return {"sqlite_synchronous": "OFF"} if url.startswith("sqlite") else {"pg_synchronous_commit": "off"}


async def fill(url: str, tasks: int) -> None:
    """``tasks`` tasks of ``PER_TASK`` records (plain inserts in one transaction), if the store has fewer."""
    store = SQLStore(url, **_relaxed(url))
    n = tasks * PER_TASK

    def row(i: int) -> dict[str, Any]:
        t = i // PER_TASK
        held = i % PER_TASK == 3 and t % 100 == 7  # running, its worker gone inside the body, marked held
        failed = i % PER_TASK == 3 and t % 10 == 3
        return {
            "scope": "default", "key": f"ag_{i:048d}", "task_id": f"task-{t}",
            "operation": (f'refund[order_id="o-{i}"]' if failed else f'charge[order_id="o-{i}"]'),
            "fingerprint": "f" * 64, "arg_hashes": "{}",
            "state": "running" if held else "failed" if failed else "succeeded", "fence": i + 1,
            "origin": i + 1, "tool": "refund" if failed else "charge", "attempts": 1,
            "lease_until": 0.0 if held else None, "created_at": 1.7e9 + i, "updated_at": 1.7e9 + i + 0.5,
            "expires_at": 4e9, "result": None if held else '"x"',
        }

    try:
        await store.ensure_schema()
        async with store.engine().connect() as conn:  # (autocommit: the transaction is begun and ended here)
            have = int((await conn.execute(
                text(f"SELECT COUNT(*) FROM agentguard_calls WHERE task_id <> '{BIG}'"))).scalar_one())
            if have >= n:
                return
            await conn.exec_driver_sql(store.dialect.schema_begin)
            stmt = None
            for k in range(have, n, 5000):
                rows = [row(i) for i in range(k, min(k + 5000, n))]
                if stmt is None:
                    stmt = text(f"INSERT INTO agentguard_calls ({', '.join(rows[0])})"
                                f" VALUES ({', '.join(':' + c for c in rows[0])})")
                await conn.execute(stmt, rows)
            await conn.exec_driver_sql("COMMIT")
    finally:
        await store.dispose()


async def fill_big(url: str, operations: int) -> str:
    """One task of ``operations`` operations, each a real guarded call (its record and its ledger entry), made
    50 at a time by a guard whose commits do not wait for the disk (this is the filling, not what is timed).
    Returns the key of one of them."""
    async with Guard(url, **_relaxed(url)) as guard:
        have = len(await guard.records(task_id=BIG, limit=operations))

        async def body(key: str) -> str:
            return "done"

        async def one(i: int) -> str:
            return (await guard.run("pay", body, key={"n": i}, task_id=BIG, arguments={"n": i})).key

        for start in range(have, operations, 50):
            await asyncio.gather(*(one(i) for i in range(start, min(start + 50, operations))))
        return await one(operations // 2)  # (a replay)


async def median_ms(read: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    got = await read()  # warm: connections, statement caches
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        got = await read()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, got


async def main(url: str, tasks: int, big: int) -> None:
    console = Console(url, Gate(new_token(), "127.0.0.1", 8765))
    store, guard = console.store, console.guard
    try:
        started = time.perf_counter()
        await fill(url, tasks)
        one_key = await fill_big(url, big)
        print(f"filled in {time.perf_counter() - started:.0f} s")
        transport = httpx.ASGITransport(app=console.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as client:
            yardstick, _ = await median_ms(lambda: guard.records(limit=100))
            key = f"ag_{(tasks * PER_TASK) // 2:048d}"  # (a filler's)
            last = (tasks + 1 + 99) // 100
            pages = (
                ("/ (the first 100 tasks)", "/", {}),
                ("/?page=500", "/", {"page": "500"}),
                (f"/?page={last} (the last)", "/", {"page": str(last)}),
                ("/?state=held", "/", {"state": "held"}),
                ("/?state=failed", "/", {"state": "failed"}),
                ("/?operation=refund", "/", {"operation": "refund"}),
                ("/?task=task-4242 (a start)", "/", {"task": "task-4242"}),
                ("/?key=ag_ + 9 characters", "/", {"key": one_key[:12]}),
                ("/task (4 operations)", "/task", {"scope": "default", "id": f"task-{tasks // 2}"}),
                (f"/task ({big:,} operations)", "/task", {"scope": "default", "id": BIG}),
                (f"/task ({big:,}), last page", "/task", {"scope": "default", "id": BIG, "page": str(big // 100)}),
                ("/record", "/record", {"scope": "default", "key": key}),
            )
            print(f"{tasks:,} tasks ({tasks * PER_TASK + big:,} records) on {store.backend}; median of {ROUNDS}")
            print(f"{'page':<34}{'ms':>9}{'× ls':>8}{'KB':>8}  status")
            print(f"{'agentguard ls (100 records)':<34}{yardstick:>9.1f}{1:>8.2f}")
            for name, path, params in pages:
                ms, answer = await median_ms(lambda path=path, params=params: client.get(path, params=params))
                print(f"{name:<34}{ms:>9.1f}{ms / yardstick:>8.2f}{len(answer.content) / 1024:>8.0f}"
                      f"  {answer.status_code}")
    finally:
        await guard.aclose()


def run() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--big", type=int, default=20_000, help="operations of the one big task (default: 20,000)")
    p.add_argument("--url", help="the store (default: a throwaway SQLite file)")
    args = p.parse_args()
    if args.url:
        asyncio.run(main(args.url, args.tasks, args.big))
        return
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(f"sqlite+aiosqlite:///{tmp}/console.db", args.tasks, args.big))


if __name__ == "__main__":
    run()
