"""Peer: AWS Powertools ``@idempotent_function`` over Redis against agentguard on SQLite, same process, interleaved.

Run in its own process (``python -m benchmarks._powertools_peer ...``) like the DBOS peer. It starts a
throwaway ``redis-server`` (from PATH) on a free loopback port, with no persistence (``--save ""
--appendonly no``) in a temporary directory, and stops it on the way out whatever happens.

Powertools runs its sync API (its only one, and its fastest) through its Redis persistence layer
(``CachePersistenceLayer`` with a ``redis.Redis`` client), keyed by ``event_key_jmespath="idempotency_key"``
on ``data_keyword_argument="payment"``, with a registered Lambda-like context (30 s remaining) as it would
have inside Lambda, and without its local cache. agentguard runs an async tool on SQLite (WAL,
``synchronous=OFF``). Each rep times N first calls (new keys) and then N replays of those keys; an
agentguard replay goes through a second Guard that has not seen the keys, so it reads the store (a cache
miss), as a Powertools replay reads Redis. The order of the two peers alternates each rep; per-call µs
and the agentguard / Powertools ratio are taken per rep, and the medians over reps are printed as one line
``BENCH_JSON {...}``.

Note what is compared: Redis without persistence keeps its records in memory only (a crash of the
server loses them), while SQLite with ``synchronous=OFF`` writes them to a file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

REMAINING_MS = 30_000  # what the fake Lambda context reports: the agentguard side's lease is 30 s too


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server(binary: str, tmp: Path, *, attempts: int = 3, wait_s: float = 10.0) -> Iterator[int]:
    """A throwaway ``redis-server`` on a free loopback port, no persistence; yields the port."""
    import redis

    last = "did not start"
    for _ in range(attempts):
        port = _free_port()
        log = tmp / f"redis-{port}.log"
        cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", str(tmp), "--daemonize", "no", "--logfile", str(log)]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
            deadline = time.monotonic() + wait_s
            up = False
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    up = bool(client.ping())
                    break
                except redis.exceptions.ConnectionError:
                    time.sleep(0.05)
            client.close()
            if up:
                yield port
                return
            text = log.read_text(errors="replace").strip() if log.exists() else ""
            last = (text.splitlines() or [f"exit {proc.poll()}"])[-1]
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    raise RuntimeError(f"redis-server did not start: {last}")


class _LambdaContext:
    """Just enough of a Lambda context for Powertools to set the in-progress expiry, as inside Lambda."""

    function_name = "agentguard-bench"

    def get_remaining_time_in_millis(self) -> int:
        return REMAINING_MS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ag-url", required=True, help="the agentguard store (a SQLite URL)")
    ap.add_argument("--calls", type=int, default=200, help="calls per side per phase per rep")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # so redis-server is stopped by the finally below

    signal.signal(signal.SIGTERM, on_term)
    os.environ.pop("POWERTOOLS_IDEMPOTENCY_DISABLED", None)  # it would skip the idempotency entirely
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    tmp = Path(tempfile.mkdtemp(prefix="agentguard-redis."))
    try:
        with redis_server(binary, tmp) as port:
            out = measure(port, args.ag_url, n=args.calls, reps=args.reps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("BENCH_JSON " + json.dumps(out), flush=True)


def measure(port: int, ag_url: str, *, n: int, reps: int) -> dict[str, Any]:
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

    from agentguard import Guard, task

    from . import _common as c

    client = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the class still carries a Redis-era deprecation
        persistence = CachePersistenceLayer(client=client)  # type: ignore[arg-type]  # its Protocol is narrower
    config = IdempotencyConfig(event_key_jmespath="idempotency_key")
    config.register_lambda_context(_LambdaContext())  # type: ignore[arg-type]
    pt_runs = [0]

    @idempotent_function(data_keyword_argument="payment", persistence_store=persistence,  # type: ignore[untyped-decorator]
                         config=config)
    def charge(payment: dict[str, Any]) -> dict[str, Any]:
        pt_runs[0] += 1  # the same trivial body as the agentguard tool (_common.Body)
        return {
            "charge_id": "ch_" + payment["idempotency_key"][:24],
            "order_id": payment["order_id"],
            "amount_cents": payment["amount_cents"],
            "currency": "eur",
            "status": "succeeded",
        }

    guard_kw: dict[str, Any] = {"sqlite_synchronous": "OFF"} if ag_url.startswith("sqlite") else {}
    loop = asyncio.new_event_loop()
    first_guard = Guard(ag_url, **guard_kw)
    replay_guard = Guard(ag_url, **guard_kw)  # another instance: an in-process cache in it has not seen the keys
    first_body, replay_body = c.Body(), c.Body()
    first_tool = c.guarded(first_guard, first_body)
    replay_tool = c.guarded(replay_guard, replay_body)
    rid = c.run_id()
    orders = [f"o-{i}" for i in range(n)]

    def ag(tool: Callable[..., Any], rep: int) -> float:
        async def go() -> float:
            t = time.perf_counter()
            with task(f"powertools-peer-{rid}-{rep}"):
                for o in orders:
                    await tool(o, c.AMOUNT)
            return time.perf_counter() - t

        return loop.run_until_complete(go())

    def pt(rep: int) -> float:
        payments = [{"idempotency_key": f"pt-{rid}-{rep}-{i}", "order_id": o, "amount_cents": c.AMOUNT}
                    for i, o in enumerate(orders)]
        t = time.perf_counter()
        for p in payments:
            charge(payment=p)
        return time.perf_counter() - t

    runs: dict[str, list[float]] = {"pt_first": [], "pt_replay": [], "ag_first": [], "ag_replay": []}
    invalid: list[str] = []
    try:
        for rep in range(-1, reps):  # rep -1 warms both up and is not kept
            for phase in ("first", "replay"):
                names = ["ag", "pt"] if rep % 2 == 0 else ["pt", "ag"]
                for name in names:
                    before = (pt_runs[0], first_body.runs, replay_body.runs)
                    if name == "pt":
                        secs = pt(rep)
                        ran = pt_runs[0] - before[0]
                    else:
                        secs = ag(first_tool if phase == "first" else replay_tool, rep)
                        ran = first_body.runs - before[1] + replay_body.runs - before[2]
                    want = n if phase == "first" else 0
                    if ran != want:
                        invalid.append(f"{name} {phase} rep {rep}: the body ran {ran} times, expected {want}")
                    if rep >= 0:
                        runs[f"{name}_{phase}"].append(secs / n * 1e6)
        rtt = []
        for _ in range(200):
            t = time.perf_counter()
            client.ping()
            rtt.append((time.perf_counter() - t) * 1e6)
        server = str(client.info("server").get("redis_version", "?"))
    finally:
        loop.run_until_complete(first_guard.aclose())
        loop.run_until_complete(replay_guard.aclose())
        loop.close()
        client.close()

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(runs[a], runs[b], strict=True))

    r_first, r_replay = ratio("ag_first", "pt_first"), ratio("ag_replay", "pt_replay")
    versions = {"redis-server": server}
    for dist in ("aws-lambda-powertools", "redis"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {
        "powertools_first_call_us": statistics.median(runs["pt_first"]),
        "powertools_replay_us": statistics.median(runs["pt_replay"]),
        "agentguard_first_call_us": statistics.median(runs["ag_first"]),
        "agentguard_replay_us": statistics.median(runs["ag_replay"]),
        "ratio_first_call": r_first,
        "ratio_replay": r_replay,
        "pass_first_call": r_first < 1 and not invalid,
        "pass_replay": r_replay < 1 and not invalid,
        "pass": r_first < 1 and r_replay < 1 and not invalid,
        "redis_ping_us": statistics.median(rtt),
        "invalid": invalid,
        "calls": n, "reps": reps, "versions": versions, "redis_port": port,
        "agentguard_backend": "SQLite WAL, synchronous=OFF" if guard_kw else ag_url.split(":", 1)[0],
        "redis": "redis-server on loopback TCP, --save '' --appendonly no (memory only)",
    }


if __name__ == "__main__":
    main()
