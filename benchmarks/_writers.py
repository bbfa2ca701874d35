"""``python -m benchmarks --load --load-only writers``: several writer processes on one SQLite file.

P processes (4 and 8), each a default ``Guard`` at ``synchronous=NORMAL`` with 8 coroutines making distinct
first calls for S seconds, all on one file: calls per second in all, p99 and worst single call, and each
process's share (max ÷ min). Issue 21: find where the wait goes, and make it fair. The writers run on every
CPU, not on the harness's one: contention between processes is the point.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentguard import Guard, task

CALLERS = 8  # coroutines per process


async def _child(path: str, seconds: float, tag: str) -> list[float]:
    """One writer process: its calls' latencies."""
    async with Guard(f"sqlite+aiosqlite:///{path}", sqlite_synchronous="NORMAL") as guard:
        @guard.once(key=["order_id"])
        async def charge(order_id: str) -> str:
            return order_id

        with task(f"{tag}-warm"):
            await charge("warm")  # (the schema is made by the parent first)
        latencies: list[float] = []
        stop, ids = time.perf_counter() + seconds, iter(range(10**9))

        async def caller() -> None:
            for i in ids:
                if time.perf_counter() > stop:
                    return
                t = time.perf_counter()
                with task(f"{tag}-{i}"):
                    await charge(f"o-{i}")
                latencies.append(time.perf_counter() - t)

        await asyncio.gather(*(caller() for _ in range(CALLERS)))
    return latencies


async def writers(folder: Path, processes: int, seconds: float) -> dict[str, Any]:
    path = folder / f"writers-{processes}.db"
    await _child(str(path), 0.0, "schema")  # the file and its schema, before the processes race
    children = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks._writers", str(path), str(seconds), f"p{k}",
        stdout=subprocess.PIPE) for k in range(processes)]
    outs = [json.loads((await c.communicate())[0]) for c in children]
    every = sorted(x for out in outs for x in out)
    shares = [len(out) for out in outs]
    return {"processes": processes, "calls_per_s": round(len(every) / seconds),
            "p99_ms": round(every[int(len(every) * 0.99)] * 1000, 1) if every else None,
            "worst_ms": round(every[-1] * 1000) if every else None, "shares": shares,
            "spread": round(max(shares) / max(min(shares), 1), 2)}


if __name__ == "__main__":
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))  # (the harness pins itself, and so its children)
    print(json.dumps(asyncio.run(_child(sys.argv[1], float(sys.argv[2]), sys.argv[3]))))
