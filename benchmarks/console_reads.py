"""What the console's pages cost the store, beside what ``agentguard ls`` costs on the same records.

    python -m benchmarks.console_reads [--records N] [--url URL]

Fills a store with ``N`` succeeded records (four per task; default 100,000) by plain inserts, then reads,
each a few times, keeping the median: the task list (``/``), the task list filtered to held records, a
task's page, a record's page, and ``agentguard ls`` (``Guard.records``) as the yardstick. Prints each
median and its ratio to ``ls``. The default store is a throwaway SQLite file; ``--url`` names another (an
empty Postgres database, say). Nothing is timed inside a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import text

from agentguard import Guard
from agentguard.stores import SQLStore
from agentguard.stores import _views as views

ROUNDS = 5


async def fill(store: SQLStore, n: int) -> None:
    async with store.engine().begin() as conn:
        have = int((await conn.execute(text("SELECT COUNT(*) FROM agentguard_calls"))).scalar_one())
        rows = [
            {"scope": "default", "key": f"ag_{i:048d}", "task_id": f"task-{i // 4}",
             "operation": f'charge[order_id="o-{i}"]', "fingerprint": "f" * 64, "arg_hashes": "{}",
             "state": "succeeded", "fence": i + 1, "origin": i + 1, "tool": "charge", "attempts": 1,
             "created_at": 1.7e9 + i, "updated_at": 1.7e9 + i + 0.5, "expires_at": 4e9, "result": '"x"'}
            for i in range(have, n)
        ]
        if rows:
            cols = ", ".join(rows[0])
            stmt = text(f"INSERT INTO agentguard_calls ({cols}) VALUES ({', '.join(':' + c for c in rows[0])})")
            for k in range(0, len(rows), 5000):
                await conn.execute(stmt, rows[k:k + 5000])


async def median_ms(read: Callable[[], Awaitable[Any]]) -> float:
    await read()  # warm: connections, statement caches
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        await read()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def main(url: str, n: int) -> None:
    store = SQLStore(url)
    guard = Guard(store=store)
    try:
        await store.ensure_schema()
        await fill(store, n)
        yardstick = await median_ms(lambda: guard.records(limit=100))
        print(f"{n} records on {store.backend}; median of {ROUNDS} reads")
        print(f"{'read':<34}{'ms':>9}{'× ls':>8}")
        print(f"{'agentguard ls (100 records)':<34}{yardstick:>9.1f}{1:>8.2f}")
        for name, read in (
            ("console / (100 tasks)", lambda: views.tasks(store, limit=100)),
            ("console /?state=held", lambda: views.tasks(store, state="held", limit=100)),
            ("console /task (one task)", lambda: views.task(store, "default", f"task-{n // 8}")),
            ("console /record (one record)", lambda: views.record(store, "default", f"ag_{n // 2:048d}")),
        ):
            ms = await median_ms(read)
            print(f"{name:<34}{ms:>9.1f}{ms / yardstick:>8.2f}")
    finally:
        await guard.aclose()


def run() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--url", help="the store (default: a throwaway SQLite file)")
    args = p.parse_args()
    if args.url:
        asyncio.run(main(args.url, args.records))
        return
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(f"sqlite+aiosqlite:///{tmp}/console.db", args.records))


if __name__ == "__main__":
    run()
