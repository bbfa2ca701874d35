"""Peers on the same machine, same run: DBOS steps on the same backend; AWS Powertools over Redis.

Each is optional: absent packages or binaries give a note, never a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).absolute().parent.parent


def dbos(backend: str, dbos_url: str, ag_url: str, *, workflows: int, steps: int, reps: int) -> dict[str, Any]:
    if importlib.util.find_spec("dbos") is None:
        return {"unavailable": "dbos is not installed (pip install 'agentguard[dbos]')"}
    if backend == "postgres" and importlib.util.find_spec("psycopg") is None:
        return {"unavailable": "DBOS on Postgres needs psycopg, which is not installed"}
    cmd = [sys.executable, "-m", "benchmarks._dbos_peer", "--backend", backend, "--dbos-url", dbos_url,
           "--ag-url", ag_url, "--workflows", str(workflows), "--steps", str(steps), "--reps", str(reps)]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"unavailable": "the DBOS peer did not finish in 300 s"}
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            out: dict[str, Any] = json.loads(line[len("BENCH_JSON "):])
            return out
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"unavailable": f"the DBOS peer failed (exit {proc.returncode}): {tail}"}


def powertools() -> dict[str, Any]:
    missing = [name for name, mod in (("aws-lambda-powertools", "aws_lambda_powertools"), ("redis", "redis"))
               if importlib.util.find_spec(mod) is None]
    if shutil.which("redis-server") is None:
        missing.append("redis-server")
    if missing:
        return {"unavailable": f"skipped: {', '.join(missing)} not installed here (optional peer; perf-floor.md "
                               "measured it at 207 µs new / 255 µs replay over a non-durable Redis)"}
    return {"unavailable": "skipped: the Powertools peer is not wired into this harness yet"}
