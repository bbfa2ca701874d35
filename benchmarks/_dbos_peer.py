"""Peer: a DBOS ``@DBOS.step`` against an agentguard first call, same backend, same process, interleaved.

Run in its own process (``python -m benchmarks._dbos_peer ...``) because DBOS is a process-wide singleton
with background threads. The per-step cost is (W workflows of K steps - W empty workflows) / (W*K), so
the workflow's own records are not charged to the step. DBOS runs its sync API (its fastest); agentguard
runs an async tool. Both databases are set to the same relaxed durability as the rest of the benchmark.
Prints one line ``BENCH_JSON {...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["sqlite", "postgres"], required=True)
    ap.add_argument("--dbos-url", required=True)
    ap.add_argument("--ag-url", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--workflows", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    import sqlalchemy as sa
    from dbos import DBOS, DBOSConfig

    from agentguard import Guard, task

    from . import _common as c

    logging.getLogger("dbos").setLevel(logging.WARNING)
    config: DBOSConfig = {"name": "agentguard-bench", "system_database_url": args.dbos_url, "log_level": "WARNING"}
    ag_kw: dict[str, Any] = {}
    if args.backend == "sqlite":
        # DBOS's default SQLite settings are a rollback journal with synchronous=FULL; give it ours.
        engine = sa.create_engine(args.dbos_url)

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = OFF")
            cur.execute("PRAGMA busy_timeout = 30000")
            cur.close()

        config["system_database_engine"] = engine
        ag_kw["sqlite_synchronous"] = "OFF"
    DBOS(config=config)

    @DBOS.step()
    def step(i: int) -> dict[str, Any]:
        return {"order_id": f"o-{i}", "amount_cents": c.AMOUNT, "status": "succeeded"}

    @DBOS.workflow()
    def workflow(k: int) -> int:
        for i in range(k):
            step(i)
        return k

    DBOS.launch()
    loop = asyncio.new_event_loop()
    guard = Guard(args.ag_url, **ag_kw)
    tool = c.guarded(guard, c.Body())
    rid = c.run_id()
    W, K = args.workflows, args.steps

    def dbos_steps() -> float:
        t = time.perf_counter()
        for _ in range(W):
            workflow(K)
        return time.perf_counter() - t

    def dbos_empty() -> float:
        t = time.perf_counter()
        for _ in range(W):
            workflow(0)
        return time.perf_counter() - t

    def agentguard(rep: int) -> float:
        async def go() -> float:
            t = time.perf_counter()
            with task(f"dbos-peer-{rid}-{rep}"):
                for i in range(W * K):
                    await tool(f"o-{i}", c.AMOUNT)
            return time.perf_counter() - t

        return loop.run_until_complete(go())

    try:
        agentguard(-1)
        dbos_steps()
        dbos_empty()
        runs: dict[str, list[float]] = {"steps": [], "empty": [], "agentguard": []}
        for rep in range(args.reps):
            order = ["steps", "empty", "agentguard"]
            order = order[rep % 3:] + order[:rep % 3]
            for name in order:
                runs[name].append(agentguard(rep) if name == "agentguard" else
                                  dbos_steps() if name == "steps" else dbos_empty())
        n = W * K
        step_us = [(s - e) / n * 1e6 for s, e in zip(runs["steps"], runs["empty"], strict=True)]
        ag_us = [a / n * 1e6 for a in runs["agentguard"]]
        out = {
            "dbos_step_us": statistics.median(step_us),
            "dbos_workflow_per_step_us": statistics.median(s / n * 1e6 for s in runs["steps"]),
            "dbos_empty_workflow_us": statistics.median(e / W * 1e6 for e in runs["empty"]),
            "agentguard_first_call_us": statistics.median(ag_us),
            "ratio": statistics.median(a / s for a, s in zip(ag_us, step_us, strict=True)),
            "workflows": W, "steps": K, "reps": args.reps,
        }
    finally:
        loop.run_until_complete(guard.aclose())
        loop.close()
        DBOS.destroy()
    print("BENCH_JSON " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
