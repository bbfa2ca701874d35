"""Peers, measured side by side with agentguard by the same harness.

- AWS Powertools ``@idempotent_function`` over its Redis layer (a throwaway ``redis-server`` with no
  persistence: memory only, while SQLite writes its records to a file), with no local cache and a Lambda-like
  context as inside Lambda: its first call and its replay are two more variants of the SQLite group.
- DBOS ``@DBOS.step`` (its sync API, its fastest) on the same backend at the same relaxed durability, in a
  process of its own (DBOS is a process-wide singleton: ``python -m benchmarks._peers URL URL ...``) whose
  group holds agentguard first calls too. A step costs (a workflow of K steps - an empty workflow) / K.

Each is optional: a missing package or binary gives a note, never a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

from agentguard import Guard, task

from ._common import AMOUNT, Body, guarded, run_id
from ._harness import Unavailable, Variant, run_group

ROOT = Path(__file__).absolute().parent.parent
STEPS = 10  # a DBOS workflow's steps


def _missing(*modules: str) -> str:
    gone = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"skipped: {', '.join(gone)} not installed here" if gone else ""


@contextlib.contextmanager
def powertools(notes: list[str]) -> Iterator[list[tuple[Variant, Body]]]:
    """Powertools' first call (a new key) and replay (of a key completed beforehand, whose run is not counted)
    as variants with their bodies, over a throwaway redis-server that lives as long as the block."""
    # boto3 too: Powertools' idempotency package imports its DynamoDB layer (and so boto3) unconditionally
    why = _missing("aws_lambda_powertools", "redis", "boto3") or ("" if shutil.which("redis-server") else
                                                                  "skipped: redis-server is not installed here")
    if why:
        async def unavailable(*_: int) -> None:
            raise Unavailable(f"{why} (pip install --group bench; apt install redis-server)")

        yield [(Variant(f"powertools: {n}", unavailable, unavailable), Body()) for n in ("first call", "replay")]
        return
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

    tmp = Path(tempfile.mkdtemp(prefix="agentguard-redis."))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen([str(shutil.which("redis-server")), "--port", str(port), "--bind", "127.0.0.1", "--save",
                               "", "--appendonly", "no", "--dir", str(tmp), "--logfile", str(tmp / "log")])
    client = redis.Redis(host="127.0.0.1", port=port, decode_responses=True, socket_connect_timeout=1)
    try:
        for _ in range(200):
            with contextlib.suppress(redis.exceptions.ConnectionError):
                if server.poll() is not None or client.ping():
                    break
            time.sleep(0.05)
        os.environ.pop("POWERTOOLS_IDEMPOTENCY_DISABLED", None)  # it would skip the idempotency entirely
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the class still carries a Redis-era deprecation
            persistence = CachePersistenceLayer(client=client)
        config = IdempotencyConfig(event_key_jmespath="idempotency_key")
        config.register_lambda_context(_LambdaContext())  # type: ignore[arg-type]
        rid = run_id()

        def variant(name: str) -> tuple[Variant, Body]:
            body, rep_of = Body(), [0]

            @idempotent_function(data_keyword_argument="payment", persistence_store=persistence, config=config)
            def charge(payment: dict[str, Any]) -> dict[str, Any]:
                return body.result(payment["order_id"], payment["amount_cents"], payment["idempotency_key"])

            async def call(i: int) -> None:
                charge(payment={"idempotency_key": f"pt-{rid}-{name}-{rep_of[0]}-{i}", "order_id": f"o-{i}",
                                "amount_cents": AMOUNT})

            async def prepare(rep: int, k: int) -> None:
                if server.poll() is not None:
                    raise Unavailable(f"redis-server did not start (exit {server.returncode})")
                rep_of[0], runs = rep, body.runs
                for i in range(k if name == "replay" else 0):  # what the replays replay, completed beforehand
                    await call(i)
                body.runs = runs

            return Variant(f"powertools: {name}", call, prepare), body

        yield [variant("first call"), variant("replay")]
        notes.append(f"powertools: Powertools {version('aws-lambda-powertools')} over redis-server"
                     f" {client.info('server').get('redis_version', '?')} on port {port} (memory only)")
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


class _LambdaContext:  # just enough for Powertools to set the in-progress expiry, as inside Lambda
    function_name = "agentguard-bench"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000  # the agentguard side's lease is 30 s too


def dbos(dbos_url: str, ag_url: str, *, reps: int, n: int = 10) -> dict[str, Any]:
    """The DBOS peer in its own process group (whatever it started dies with it): its figures, or a note."""
    why = _missing("dbos", *(("psycopg",) if dbos_url.startswith("postgres") else ()))
    if why:
        return {"unavailable": why}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks._peers", dbos_url, ag_url, str(reps), str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        return {"unavailable": "the DBOS peer did not finish in 300 s"}
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    found = [json.loads(line[11:]) for line in stdout.splitlines() if line.startswith("BENCH_JSON ")]
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return found[0] if found else {"unavailable": f"the DBOS peer failed (exit {proc.returncode}): {tail}"}


async def _dbos(dbos_url: str, ag_url: str, reps: int, n: int) -> dict[str, Any]:
    import logging

    import sqlalchemy as sa
    from dbos import DBOS, DBOSConfig

    logging.getLogger("dbos").setLevel(logging.WARNING)
    config: DBOSConfig = {"name": "agentguard-bench", "system_database_url": dbos_url, "log_level": "WARNING"}
    if dbos_url.startswith("sqlite"):  # DBOS's own default is a rollback journal at synchronous=FULL: give it ours
        engine = sa.create_engine(dbos_url)

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            for pragma in ("journal_mode = WAL", "synchronous = OFF", "busy_timeout = 30000"):
                dbapi_conn.execute(f"PRAGMA {pragma}")

        config["system_database_engine"] = engine
    DBOS(config=config)

    @DBOS.step()
    def step(i: int) -> dict[str, Any]:
        return Body().result(f"o-{i}", AMOUNT)

    @DBOS.workflow()
    def workflow(k: int) -> int:
        for i in range(k):
            step(i)
        return k

    DBOS.launch()
    guard = Guard(ag_url, **({"sqlite_synchronous": "OFF"} if ag_url.startswith("sqlite") else {}))
    tool, rid, tasks = guarded(guard, body := Body()), run_id(), itertools.count()

    async def steps(i: int) -> None:
        workflow(STEPS)

    async def empty(i: int) -> None:
        workflow(0)

    async def first_calls(i: int) -> None:
        with task(f"dbos-peer-{rid}-{next(tasks)}"):  # new keys every time
            for k in range(STEPS):
                await tool(f"o-{k}", AMOUNT)

    try:
        stats = await run_group([Variant("steps", steps), Variant("empty", empty), Variant("agentguard", first_calls)],
                                n=n, reps=reps, warmup=2)
    finally:
        await guard.aclose()
        DBOS.destroy()

    def per_rep(name: str) -> list[float]:
        return [r.us_per_call / STEPS for r in stats[name].reps]

    if body.runs != STEPS * (2 + n * reps):
        return {"unavailable": f"INVALID: agentguard's first calls ran the body {body.runs} times"}
    step_us = [s - e for s, e in zip(per_rep("steps"), per_rep("empty"), strict=True)]
    return {"dbos_step_us": statistics.median(step_us), "agentguard_first_call_us": statistics.median(per_rep(
        "agentguard")), "ratio": statistics.median(a / s for a, s in zip(per_rep("agentguard"), step_us, strict=True))}


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    dbos_url, ag_url, reps, n = sys.argv[1:]
    print("BENCH_JSON " + json.dumps(asyncio.run(_dbos(dbos_url, ag_url, int(reps), int(n)))), flush=True)
