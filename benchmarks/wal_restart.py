"""Where a SQLite store's checkpoint thread restarts the WAL: the first calls' latency at each setting, side by side.

    python -m benchmarks.wal_restart [--frames 4000,16000] [--sizes 20000,100000,300000] [--rounds 2]
                                     [--synchronous NORMAL|FULL]

A restart holds the store's writers off while it copies the rest of the WAL and syncs the database
(``_direct.DirectSQLite._checkpoint``), so it is forced only past ``WAL_RESTART_FRAMES``; below it the WAL starts
again by itself when the writes pause as a checkpoint ends. Each setting runs in a child process of its own (the
settings alternated, ``--rounds`` times each), on a store of its own at ``--synchronous`` (``NORMAL`` unless told)
with the ledger as shipped: a sync tool's first calls in bursts of 500 (100 tasks of 5 calls, each a task's id of
its own), the ledger flushed between bursts (a pause of a few ms, as an agent's calls pause between its model's
turns, here shortened), the store grown by such bursts to each size and 10,000 calls then timed one by one (size 0:
from the store's first call, while its WAL file still grows). Prints, per size, each setting's mean, p50, p99.9 and
slowest call, and how many calls took over 2 ms and what they cost a call. Nothing here is asserted; nothing is
timed inside a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

BURST_TASKS, CALLS_PER_TASK = 100, 5
TIMED = 10_000
SLOW = 0.002  # seconds: a call this long met a long write of the store's (a restart, a ledger batch)


async def _child(frames: int, sizes: list[int], synchronous: str) -> list[dict[str, float]]:
    from agentguard import Guard, task
    from agentguard.stores import _direct

    _direct.WAL_RESTART_FRAMES = frames  # (read by the checkpoint thread as it runs)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        async with Guard(f"sqlite+aiosqlite:///{tmp}/s.db", sqlite_synchronous=synchronous, cache_size=0) as guard:

            @guard.once(key=["order_id"])
            def charge(order_id: str) -> dict[str, int]:
                return {"ok": 1}

            async def burst(lat: list[float] | None) -> None:
                for _ in range(BURST_TASKS):
                    with task(uuid.uuid4().hex):
                        for i in range(CALLS_PER_TASK):
                            t0 = time.perf_counter()
                            charge(f"o-{i}")
                            if lat is not None:
                                lat.append(time.perf_counter() - t0)
                await guard.flush_ledger()

            made = 0
            for size in sizes:
                while made < size:
                    await burst(None)
                    made += BURST_TASKS * CALLS_PER_TASK
                lat: list[float] = []
                while len(lat) < TIMED:
                    await burst(lat)
                made += len(lat)
                ordered = sorted(lat)
                slow = [x for x in lat if x > SLOW]
                out.append({"size": size, "mean": statistics.fmean(lat) * 1e6, "p50": ordered[len(lat) // 2] * 1e6,
                            "p99.9": ordered[int(len(lat) * 0.999)] * 1e6, "max": ordered[-1] * 1e6,
                            "slow": len(slow), "slow_cost": sum(slow) / len(lat) * 1e6})
    return out


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(asyncio.run(_child(int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")], sys.argv[4]))))
        return
    ap = argparse.ArgumentParser(prog="python -m benchmarks.wal_restart", description=__doc__.split("\n\n")[1])
    ap.add_argument("--frames", default="4000,16000", help="the settings of WAL_RESTART_FRAMES to compare")
    ap.add_argument("--sizes", default="20000,100000,300000", help="the store's sizes (first calls made) to time at")
    ap.add_argument("--rounds", type=int, default=2, help="children per setting, the settings alternated")
    ap.add_argument("--synchronous", default="NORMAL", choices=("NORMAL", "FULL"), help="the store's durability level")
    args = ap.parse_args()
    settings = [int(f) for f in args.frames.split(",")]
    got: dict[int, list[list[dict[str, float]]]] = {f: [] for f in settings}
    for _ in range(args.rounds):
        for frames in settings:
            run = subprocess.run([sys.executable, "-m", "benchmarks.wal_restart", "--child", str(frames), args.sizes,
                                  args.synchronous],
                                 capture_output=True, text=True, timeout=3600)
            if run.returncode != 0:
                raise SystemExit(f"the child for {frames} frames failed:\n{run.stderr}")
            got[frames].append(json.loads(run.stdout.strip().splitlines()[-1]))
    print(f"== a sync tool's first calls at {args.synchronous}, bursts of {BURST_TASKS * CALLS_PER_TASK} with the "
          f"ledger flushed between them; {TIMED} timed at each size; one line per child")
    print(f"{'size':>8} {'WAL restart past':>17} {'mean µs':>8} {'p50':>6} {'p99.9':>7} {'slowest':>8} "
          f"{'over 2 ms':>10} {'their µs a call':>16}")
    for i, size in enumerate(int(s) for s in args.sizes.split(",")):
        for frames in settings:
            for child in got[frames]:
                r = child[i]
                print(f"{size:>8} {frames:>17} {r['mean']:>8.1f} {r['p50']:>6.0f} {r['p99.9']:>7.0f} {r['max']:>8.0f} "
                      f"{r['slow']:>10.0f} {r['slow_cost']:>16.1f}")


if __name__ == "__main__":
    main()
