"""What keeping every attempt and chaining the ledger costs, beside the tree before (issue 32), side by side.

    python -m benchmarks.ledger_kept --base DIR [--pg-url URL] [--calls N] [--reps R] [--sync] [--no-ledger]
                                     [--burst B]

``DIR`` holds the tree to compare with (``git archive main | tar -x -C DIR``). Each window runs in a child
process whose ``agentguard`` is either that tree's or this one's, alternately, on a store of its own (a SQLite
file at ``synchronous=NORMAL``; with ``--pg-url``, also a Postgres database of its own, made and dropped
here): ``N`` first calls of an async tool (``--sync``: a sync tool, called on the loop's thread as the race
calls it), each of a task of its own, back to back (so that the ledger's writer writes its batches while they go
on; ``--burst B``: a pause of 5 ms after every ``B`` of them, as an agent's calls come, between its model's
turns), then ``flush_ledger()``; then 50 ``timeline`` reads of one task. ``--no-ledger``: guards that keep none, so
that what is left is the caller's path (the index of running records). Prints, per backend, the medians over the
windows of a first call's latency (p50, p99, p99.9, the slowest and the mean, on the caller's path), of a call all
told (the window with its ledger written, its pauses left out, ÷ N: the writer's chain on the portal thread
included), and of a ``timeline`` read, and each ratio this tree ÷ the other. Nothing here is asserted; nothing is
timed inside a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


async def _window(url: str, calls: int, ledger: bool, sync: bool, burst: int) -> dict[str, float]:
    """One child's window (run with the measured tree's ``agentguard`` first on ``sys.path``)."""
    from agentguard import Guard, task

    options: dict[str, object] = {"ledger": ledger}
    if url.startswith("sqlite"):
        options["sqlite_synchronous"] = "NORMAL"
    async with Guard(url, **options) as guard:  # type: ignore[arg-type]

        @guard.once(key=["order_id"])
        async def charge_async(order_id: str) -> str:
            return order_id

        @guard.once(key=["order_id"])
        def charge_sync(order_id: str) -> str:
            return order_id

        async def charge(order_id: str) -> str:
            return charge_sync(order_id) if sync else await charge_async(order_id)

        tag = uuid.uuid4().hex[:8]
        for i in range(200):  # warm: the schema, the connections, the ledger's writer
            with task(f"warm-{tag}-{i}"):
                await charge("o")
        await guard.flush_ledger()
        lat = []
        paused = 0.0
        began = time.perf_counter()
        for i in range(calls):
            with task(f"{tag}-{i}"):
                t0 = time.perf_counter()
                await charge("o")
                lat.append(time.perf_counter() - t0)
            if burst and (i + 1) % burst == 0:
                t0 = time.perf_counter()
                await asyncio.sleep(0.005)
                paused += time.perf_counter() - t0
        await guard.flush_ledger()
        whole = time.perf_counter() - began - paused
        reads = []
        for _ in range(50 if ledger else 0):
            t0 = time.perf_counter()
            await guard.timeline(f"{tag}-0")
            reads.append(time.perf_counter() - t0)
    ordered = sorted(lat)
    return {"p50": statistics.median(lat) * 1e6, "p99": statistics.quantiles(lat, n=100)[98] * 1e6,
            "p99.9": ordered[int(len(ordered) * 0.999)] * 1e6, "max": ordered[-1] * 1e6,
            "mean": statistics.fmean(lat) * 1e6,
            "all_told": whole / calls * 1e6, "timeline": statistics.median(reads) * 1e6 if reads else float("nan")}


def _child(tree: Path, url: str, calls: int, ledger: bool, sync: bool, burst: int) -> dict[str, float]:
    # Run by path: ``sys.path[0]`` is this directory (no ``agentguard`` in it), so ``tree``'s is imported.
    argv = [sys.executable, __file__, "--child", url, str(calls), "1" if ledger else "0", "1" if sync else "0",
            str(burst)]
    out = subprocess.run(argv, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree)}, timeout=1800, cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise SystemExit(f"the child of {tree} failed:\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def _pg(url: str, *sql: str) -> None:
    import asyncpg  # type: ignore[import-untyped,unused-ignore]
    from sqlalchemy.engine import make_url

    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        for s in sql:
            await conn.execute(s)
    finally:
        await conn.close()


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(asyncio.run(_window(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5] == "1",
                                             int(sys.argv[6])))))
        return
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ledger_kept", description=__doc__.split("\n\n")[1])
    ap.add_argument("--base", required=True, type=Path, help="the tree to compare with")
    ap.add_argument("--pg-url", help="a Postgres server (a database of each tree's is made there and dropped)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-ledger", action="store_true", help="guards that keep no ledger (what is left: the hot path)")
    ap.add_argument("--sync", action="store_true", help="a sync tool's first calls (an async tool's by default)")
    ap.add_argument("--burst", type=int, default=0, help="a 5 ms pause after every BURST calls (0: none)")
    args = ap.parse_args()
    trees = {"before": args.base.resolve(), "this": HERE}
    with tempfile.TemporaryDirectory() as tmp:
        backends = {"sqlite": {name: f"sqlite+aiosqlite:///{tmp}/{name}.db" for name in trees}}
        made: list[str] = []
        if args.pg_url:
            from sqlalchemy.engine import make_url

            backends["postgres"] = {}
            for name in trees:
                db = f"agbench_ledger_{name}_{uuid.uuid4().hex[:8]}"
                asyncio.run(_pg(args.pg_url, f"CREATE DATABASE {db}"))
                made.append(db)
                backends["postgres"][name] = make_url(args.pg_url).set(database=db).render_as_string(
                    hide_password=False)
        try:
            for backend, urls in backends.items():
                got: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
                for rep in range(args.reps):
                    for name in (trees if rep % 2 == 0 else reversed(list(trees))):  # alternated
                        got[name].append(_child(trees[name], urls[name], args.calls, not args.no_ledger, args.sync,
                                                args.burst))
                kept = "no ledger" if args.no_ledger else "the ledger kept"
                tool = "a sync tool's" if args.sync else "an async tool's"
                paced = f", a pause after every {args.burst}" if args.burst else ", back to back"
                print(f"== {backend}, {kept}: {args.calls} first calls ({tool}{paced}) per window, {args.reps} windows"
                      " each, medians")
                print(f"{'':<28}{'before':>12}{'this':>12}{'this ÷ before':>16}")
                fields = [("p50", "first call p50 (µs)"), ("p99", "first call p99 (µs)"),
                          ("p99.9", "first call p99.9 (µs)"), ("max", "slowest first call (µs)"),
                          ("mean", "first call mean (µs)"), ("all_told", "call all told (µs)"),
                          ("timeline", "timeline read (µs)")]
                for field, what in fields[:-1] if args.no_ledger else fields:
                    a = statistics.median(r[field] for r in got["before"])
                    b = statistics.median(r[field] for r in got["this"])
                    print(f"{what:<28}{a:>12.1f}{b:>12.1f}{b / a:>15.2f}×")
        finally:
            for db in made:
                assert args.pg_url
                asyncio.run(_pg(args.pg_url, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"))


if __name__ == "__main__":
    main()
