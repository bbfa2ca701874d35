"""Peers on the same machine, same run: DBOS steps on the same backend; AWS Powertools over Redis.

Each is optional: absent packages or binaries give a note, never a failure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
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


def _run_peer(module: str, args: list[str], what: str, timeout: float) -> dict[str, Any]:
    """``python -m benchmarks.<module> ...`` in its own process group (so whatever it started, such as a
    server, is killed with it on a timeout); returns its ``BENCH_JSON`` line, or a note."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.Popen([sys.executable, "-m", f"benchmarks.{module}", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env, start_new_session=True)

    def stop() -> None:
        """SIGTERM first, so the peer's own cleanup stops its server and removes its files; then the group."""
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the peer if it is still there, and anything left in its group
        proc.communicate()

    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop()
        return {"unavailable": f"{what} did not finish in {timeout:g} s"}
    finally:
        if proc.poll() is None:  # interrupted while waiting: take the peer and its server down too
            stop()
    for line in stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            out: dict[str, Any] = json.loads(line[len("BENCH_JSON "):])
            return out
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return {"unavailable": f"{what} failed (exit {proc.returncode}): {tail}"}


def powertools(ag_url: str, *, calls: int, reps: int) -> dict[str, Any]:
    """AWS Powertools ``@idempotent_function`` over a throwaway Redis against agentguard on ``ag_url``."""
    # boto3 too: Powertools' idempotency package imports its DynamoDB layer (and so boto3) unconditionally
    need = (("aws-lambda-powertools", "aws_lambda_powertools"), ("redis", "redis"), ("boto3", "boto3"))
    missing = [name for name, mod in need if importlib.util.find_spec(mod) is None]
    if shutil.which("redis-server") is None:
        missing.append("redis-server")
    if missing:
        return {"unavailable": f"skipped: {', '.join(missing)} not installed here (pip install"
                               " 'agentguard[bench]'; apt install redis-server)"}
    return _run_peer("_powertools_peer", ["--ag-url", ag_url, "--calls", str(calls), "--reps", str(reps)],
                     "the Powertools peer", 300)
