"""Whether a worker's memory stays flat over many guarded calls (issue 34, point 3).

    python -m benchmarks.memory [--calls N] [--url URL] [--sync] [--cache-size N]

One process makes ``N`` first calls (default 1,000,000) of one tool through one ``Guard``, ten calls per task (a
task id of its own every ten calls, as agents' tasks come and go), each call followed by its replay every tenth
call, and prints the resident set size (``VmRSS``) after 10k calls and at each tenfold after, with the ratio to
the figure at 10k. The target: RSS after 1M calls within 10% of after 10k. The store is a SQLite file of its own
at ``synchronous=OFF`` by default (the disk is not what is measured), or ``--url``; the ledger is kept, as
shipped, and flushed before each reading, so what it still holds is counted. Nothing is timed in a test.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
from pathlib import Path
from typing import Any

from agentguard import Guard, task

TARGET = 1.10  # RSS after the last reading ÷ after 10k calls, at most
FIRST = 10_000
PER_TASK = 10


def rss_kib() -> int:
    """This process's resident set size, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise SystemExit("benchmarks.memory: no VmRSS in /proc/self/status (Linux only)")


async def measure(url: str, calls: int, sync: bool, cache_size: int | None) -> list[tuple[int, int]]:
    kw: dict[str, Any] = {"sqlite_synchronous": "OFF"} if url.startswith("sqlite") else {}
    if cache_size is not None:
        kw["cache_size"] = cache_size
    readings: list[tuple[int, int]] = []
    marks = {FIRST * 10**i for i in range(8) if FIRST * 10**i <= calls} | {calls}
    async with Guard(url, **kw) as guard:

        @guard.once(key="order_id", operation="charge_sync")
        def charge_sync(order_id: str, amount_cents: int) -> dict[str, Any]:
            return {"charge_id": f"ch_{order_id}", "amount_cents": amount_cents}

        @guard.once(key="order_id", operation="charge_async")
        async def charge_async(order_id: str, amount_cents: int) -> dict[str, Any]:
            return {"charge_id": f"ch_{order_id}", "amount_cents": amount_cents}

        done = 0
        while done < calls:
            with task(f"mem-{done // PER_TASK}"):
                for i in range(PER_TASK):
                    order = f"o-{done + i}"
                    if sync:
                        charge_sync(order, 4900)
                    else:
                        await charge_async(order, 4900)
                if sync:
                    charge_sync(f"o-{done}", 4900)  # a replay
                else:
                    await charge_async(f"o-{done}", 4900)
            done += PER_TASK
            if done in marks:
                await guard.flush_ledger()
                gc.collect()
                readings.append((done, rss_kib()))
                print(f"{done:>10,} calls: RSS {readings[-1][1] / 1024:8.1f} MiB"
                      f"  ({readings[-1][1] / readings[0][1]:.3f}× the reading at {readings[0][0]:,})", flush=True)
    return readings


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--url", help="the store (default: a SQLite file of its own, synchronous=OFF)")
    ap.add_argument("--sync", action="store_true", help="a sync tool (default: an async one)")
    ap.add_argument("--cache-size", type=int, help="the guard's cache of completed results (default: the Guard's)")
    args = ap.parse_args()
    if args.calls < FIRST:
        raise SystemExit(f"--calls must be at least {FIRST:,}")
    with tempfile.TemporaryDirectory(prefix="agentguard-memory.") as tmp:
        url = args.url or f"sqlite+aiosqlite:///{Path(tmp) / 'memory.db'}"
        readings = asyncio.run(measure(url, args.calls, args.sync, args.cache_size))
    ratio = readings[-1][1] / readings[0][1]
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    print(f"{verdict}  RSS after {readings[-1][0]:,} calls ÷ after {readings[0][0]:,}: {ratio:.3f}× (<= {TARGET}×)")


if __name__ == "__main__":
    main()
