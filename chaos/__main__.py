"""``python -m chaos [--short | --long] [--seed N] [--only postgresql|sqlite] [--pg-url URL]``

A chaos run on a real fleet: 16 worker processes on one Postgres and 8 on one SQLite file, each making a
scripted agent's calls (``chaos/_worker.py``) through the guard against a local provider that honours
idempotency keys and counts charges (``chaos/_provider.py``). A quarter of the workers call async tools on an
event loop, a quarter a sync tool from several threads at once (beside an async tool on the main thread's
loop), a quarter a sync tool from their one thread, and a quarter async tools from several callers at once on
a pool of one, so that on Postgres their claims and completions are gathered into statements for many callers:
every way a call is claimed and completed (on the loop, alone or gathered, in a sync tool's own thread, on the
guard's portal) meets the faults, and sync and async callers race for the same records. Meanwhile the runner
SIGKILLs workers (and starts them again: the agent resumes), SIGSTOPs them past their lease and resumes them,
terminates their Postgres connections (psycopg's of sync tools' threads too; on SQLite: holds the file's write
lock for a while), and restarts Postgres once.

At the end it checks, and exits non-zero unless all hold:
- exactly one charge per operation at the provider, and one key per operation across every takeover;
- every caller got the stored result (the runner replays each operation through a guard whose bodies fail
  if run, async and sync) or a clear error (``InProgressError``, ``LeaseLostError``, ``StoreError``, the
  provider's refusal);
- no claim left held: every record is completed;
- sync tools' calls were claimed in their own threads where the store has a sync executor (a SQLite file;
  Postgres with psycopg), so the faults met that path and not only the portal's;
- on Postgres, the gathered workers' claims and completions went as statements for many callers;
and prints a summary (operations, faults injected, takeovers, replays) as its last lines.

``--short`` (the default, part of ``scripts/test.sh``) takes about a minute; ``--long`` several. The random
choices follow ``--seed``; the processes' timing does not, so two runs inject the same kinds of faults but
not at the same instants: the checks hold for any interleaving.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib.util
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from agentguard import Guard, Operation, task

from ._judge import SYNC_KINDS, judge
from ._provider import Provider
from ._worker import GATHERED_CALLERS, KINDS

GATHERED_ROUNDS = 4  # rounds of charges of its own a gathered worker makes first

LEASE = 2.0


@dataclass(frozen=True)
class Plan:
    workers: int
    operations: int
    fault_seconds: float  # how long faults are injected
    deadline: float  # the whole run, faults and the finish
    threads: int = 4  # the calling threads of each worker whose sync tool is called from threads
    lease: float = LEASE  # the workers' lease: short, so that a killed or stopped worker's claim is taken over


SHORT = {"postgresql": Plan(16, 48, 15.0, 300.0), "sqlite": Plan(8, 32, 12.0, 300.0)}
LONG = {"postgresql": Plan(16, 120, 90.0, 1200.0), "sqlite": Plan(8, 120, 60.0, 1200.0)}


@dataclass
class Faults:
    kills: int = 0
    stops: int = 0
    terminated: int = 0  # Postgres backends terminated
    locks: int = 0  # SQLite write locks held
    restarts: int = 0  # Postgres restarts
    in_body: collections.Counter[str] = field(default_factory=collections.Counter)  # "kill sync": inside a body

    def describe(self, backend: str) -> str:
        parts = [f"{self.kills} SIGKILL", f"{self.stops} SIGSTOP past the lease"]
        if self.in_body:
            parts.append("inside a body: " + ", ".join(f"{n} {k}" for k, n in sorted(self.in_body.items())))
        if backend == "postgresql":
            parts += [f"{self.terminated} connections terminated", f"{self.restarts} Postgres restart"]
        else:
            parts.append(f"{self.locks} write locks held")
        return ", ".join(parts)


@dataclass
class Worker:
    index: int
    kind: str  # how it calls its tools: chaos._worker.KINDS
    ops: frozenset[str]  # the operations it calls (a worker with only sync tools books nothing)
    script: Path
    results: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    stopped_until: float | None = None
    starts: int = 0
    failed: str | None = None
    read: int = 0  # how far the runner has read its results
    bodies: set[str] = field(default_factory=set)  # the orders whose body it runs now, as far as the runner knows


@dataclass
class Outcome:
    backend: str
    plan: Plan
    faults: Faults
    problems: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)


def operations(n: int, prefix: str) -> list[tuple[str, str, str, int]]:
    """The operations: (task id, tool, order id, amount); every third a multi-step booking."""
    return [(f"{prefix}-task-{i}", "book" if i % 3 == 0 else "charge", f"{prefix}-o{i}", 100 + i) for i in range(n)]


class Fleet:
    def __init__(self, backend: str, url: str, provider: Provider, plan: Plan, rng: random.Random, tmp: Path,
                 pg: Any = None) -> None:
        self.backend, self.url, self.provider, self.plan, self.rng, self.tmp, self.pg = (
            backend, url, provider, plan, rng, tmp, pg)
        self.faults = Faults()
        self.ops = operations(plan.operations, backend)
        self.workers: list[Worker] = []
        shared = list(self.ops)
        for i in range(plan.workers):
            # Each agent starts at another operation (so bodies run side by side from the start), then makes
            # every other one, and a few twice; every shared operation is called by every worker (a booking by
            # every worker with an async tool: a multi-step tool is async). A gathered worker first makes rounds
            # of charges of its own (``GATHERED_ROUNDS``), so that its callers' bodies run side by side and end
            # together whatever the other workers did first: their completions meet a lane in use.
            kind = KINDS[i % len(KINDS)]
            own = ([(f"{backend}-w{i}-task-{j}", "charge", f"{backend}-w{i}-o{j}", 100 + j)
                    for j in range(GATHERED_CALLERS * GATHERED_ROUNDS)] if kind == "gathered" else [])
            self.ops += own
            start = i * len(shared) // plan.workers
            script = [*own, *shared[start:], *shared[:start], *rng.sample(shared, 3)]
            ops = frozenset(t for t, tool, _, _ in script if kind != "sync" or tool == "charge")
            w = Worker(i, kind, ops, tmp / f"{backend}-{i}.json", tmp / f"{backend}-{i}.jsonl",
                       tmp / f"{backend}-{i}.log")
            w.script.write_text(json.dumps(script))
            self.workers.append(w)
        self.order_of = {task_id: order for task_id, _, order, _ in self.ops}

    # -- processes ----------------------------------------------------------------------------------------

    def start(self, w: Worker) -> None:
        w.starts += 1
        w.bodies.clear()
        with open(w.log, "ab") as log:
            w.proc = subprocess.Popen(
                [sys.executable, "-m", "chaos._worker", self.url, self.provider.url, str(w.script), str(w.results),
                 "--lease", str(self.plan.lease), "--tools", w.kind, "--threads", str(self.plan.threads)],
                stdout=subprocess.DEVNULL, stderr=log, cwd=Path(__file__).resolve().parent.parent,
            )

    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.proc is not None and w.proc.poll() is None and w.stopped_until is None]

    def reap(self) -> None:
        """Start again the workers we killed; note the ones that failed by themselves."""
        for w in self.workers:
            if w.proc is None or w.proc.poll() is None:
                continue
            code = w.proc.returncode
            if code == -signal.SIGKILL:
                self.start(w)
            elif code != 0 and w.failed is None:
                tail = w.log.read_text(errors="replace").strip().splitlines()[-5:]
                w.failed = f"worker {w.index} exited with {code}: " + " | ".join(tail)

    def done(self) -> bool:
        finished = all(w.proc is not None and w.proc.poll() == 0 for w in self.workers)
        return finished or any(w.failed for w in self.workers)

    # -- faults -------------------------------------------------------------------------------------------

    def target(self, fault: str) -> Worker | None:
        """A running worker to hit: most often one inside a body (a death or a pause there is the one that
        matters: its claim must be taken over, its stale completion refused), else any."""
        live = self.running()
        for w in live:
            self.follow(w)
        busy = [w for w in live if w.bodies]
        if busy and self.rng.random() < 0.75:
            w = self.rng.choice(busy)
            self.faults.in_body[f"{fault} {w.kind}"] += 1
            return w
        return self.rng.choice(live) if live else None

    def follow(self, w: Worker) -> None:
        """Read what ``w`` wrote since last time: the bodies it started and has not answered yet."""
        if not w.results.exists():
            return
        with open(w.results, "rb") as f:
            f.seek(w.read)
            new = f.read()
        whole = new[: new.rfind(b"\n") + 1]  # (a line being written is read next time)
        w.read += len(whole)
        for line in whole.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if "body" in entry:
                w.bodies.add(entry["body"])
            elif "op" in entry:  # answered (a result, or an error: a body that raised, a lease lost)
                w.bodies.discard(self.order_of.get(entry["op"]))

    def kill(self) -> None:
        if w := self.target("kill"):
            assert w.proc is not None
            w.proc.send_signal(signal.SIGKILL)
            w.proc.wait()
            self.faults.kills += 1

    def stop(self) -> None:
        if w := self.target("stop"):
            assert w.proc is not None
            w.proc.send_signal(signal.SIGSTOP)
            w.stopped_until = time.monotonic() + self.plan.lease + self.rng.uniform(0.5, 1.5)  # past its lease
            self.faults.stops += 1

    def resume(self, every: bool = False) -> None:
        now = time.monotonic()
        for w in self.workers:
            if w.stopped_until is not None and (every or w.stopped_until <= now):
                assert w.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGCONT)
                w.stopped_until = None

    def cut_connections(self) -> None:
        if self.backend == "postgresql":
            self.faults.terminated += asyncio.run(_terminate_backends(self.url))
        else:
            threading.Thread(target=_hold_write_lock, args=(self.url, self.rng.uniform(0.3, 1.0)), daemon=True).start()
            self.faults.locks += 1

    def restart_postgres(self) -> None:
        assert self.pg is not None
        self.pg.stop_server("fast")  # every client disconnected, new connections refused
        self.pg.start_server()
        self.faults.restarts += 1

    # -- the run ------------------------------------------------------------------------------------------

    def run(self) -> Outcome:
        outcome = Outcome(self.backend, self.plan, self.faults)
        started = time.monotonic()
        asyncio.run(_ensure_schema(self.url))
        for w in self.workers:
            self.start(w)
        began = time.monotonic()
        while sum(w.results.exists() for w in self.workers) < len(self.workers) // 2:  # most are calling
            if time.monotonic() - began > 60:
                break
            time.sleep(0.05)
            self.reap()
        began = time.monotonic()
        restart_at = began + self.plan.fault_seconds * 0.4 if self.pg is not None else None
        while time.monotonic() - began < self.plan.fault_seconds and not self.done():
            time.sleep(self.rng.uniform(0.15, 0.5))
            self.resume()
            self.reap()
            if restart_at is not None and time.monotonic() >= restart_at:
                restart_at = None
                self.restart_postgres()
                continue
            fault = self.rng.choices(["kill", "stop", "cut"], weights=[3, 3, 2])[0]
            {"kill": self.kill, "stop": self.stop, "cut": self.cut_connections}[fault]()
        self.resume(every=True)
        while not self.done():
            if time.monotonic() - began > self.plan.deadline:
                outcome.problems.append(f"the fleet did not finish within {self.plan.deadline:g}s")
                break
            time.sleep(0.1)
            self.reap()
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
            if w.failed:
                outcome.problems.append(w.failed)
        self.verify(outcome)
        outcome.summary.append(f"{self.backend}: {time.monotonic() - started:.0f}s")
        return outcome

    # -- the checks ---------------------------------------------------------------------------------------

    def verify(self, outcome: Outcome) -> None:
        stats = self.provider.stats()
        stored, held = asyncio.run(_replay_all(self.url, self.ops))
        held += _replay_sync(self.url, self.ops, stored)
        texts = [(w.index, w.results.read_text() if w.results.exists() else "") for w in self.workers]
        # A sync executor in the callers' threads: a SQLite file's (stdlib sqlite3), Postgres' if psycopg is here.
        own = self.backend == "sqlite" or importlib.util.find_spec("psycopg") is not None
        verdict = judge(self.ops, stats, stored, held, texts, expected={w.index: w.ops for w in self.workers},
                        kinds={w.index: w.kind for w in self.workers}, own_threads=own,
                        gathers=self.backend == "postgresql")
        outcome.problems += verdict.problems
        clear = ", ".join(f"{n} {k}" for k, n in sorted(verdict.errors.items())) or "none"
        events = verdict.events
        count = collections.Counter(w.kind for w in self.workers)
        kinds = "; ".join(
            f"{kind} ({count[kind]} workers{f' x {self.plan.threads} threads' if kind == 'threads' else ''}"
            f"{f' x {GATHERED_CALLERS} callers' if kind == 'gathered' else ''}): "
            f"{verdict.by_kind[kind]} calls, {verdict.bodies[kind]} bodies run"
            + (f", connections of their own threads {verdict.own[kind]}" if kind in SYNC_KINDS else "")
            + (f", statements for many callers: {verdict.gathered['claim']} claims, {verdict.gathered['complete']}"
               " completions" if kind == "gathered" and self.backend == "postgresql" else "")
            for kind in KINDS
        )
        outcome.summary = [
            f"{self.backend}: {len(self.workers)} workers ({sum(w.starts for w in self.workers)} processes), "
            f"{len(self.ops)} operations, {verdict.calls} calls: {verdict.charges} charges at the provider "
            f"({stats['requests']} requests, {stats['replayed']} answered from their key)",
            f"{self.backend}: faults: {self.faults.describe(self.backend)}",
            f"{self.backend}: takeovers {events['takeover']}, replays {events['replayed']}, lease lost "
            f"{events['lease_lost']}, releases {events['released']}, clear errors: {clear}",
            f"{self.backend}: tools {kinds}",
        ]


async def _ensure_schema(url: str) -> None:
    async with Guard(url) as guard:
        await guard.ensure_schema()


async def _replay_all(url: str, ops: list[tuple[str, str, str, int]]) -> tuple[dict[str, Any], list[str]]:
    """Every operation's stored result, replayed through a guard whose bodies fail if run; and the records
    left held (running or released) — there must be none."""
    results: dict[str, Any] = {}
    problems: list[str] = []
    async with Guard(url, lease=LEASE, on_conflict="raise", cache_size=0) as guard:

        @guard.once(key="order_id")
        async def charge_order(order_id: str, amount: int, idempotency_key: str = "") -> dict[str, Any]:
            raise AssertionError(f"{order_id} ran again after the chaos run")

        @guard.once(operation="book", key="order_id", on_unknown="retry")
        async def book(order_id: str, amount: int, op: Operation) -> dict[str, Any]:
            raise AssertionError(f"{order_id} ran again after the chaos run")

        tools: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {"charge": charge_order, "book": book}
        for task_id, tool, order_id, amount in ops:
            try:
                with task(task_id):
                    results[task_id] = await tools[tool](order_id, amount)
            except Exception as exc:
                problems.append(f"{task_id}: no stored result to replay ({type(exc).__name__}: {exc})")
        for rec in await guard.records(limit=10_000):
            if rec.state in ("running", "released"):
                problems.append(f"{rec.task_id}: left {rec.state} (lease left: {rec.lease_left})")
    return results, problems


def _replay_sync(url: str, ops: list[tuple[str, str, str, int]], stored: dict[str, Any]) -> list[str]:
    """Every charge replayed through a sync tool whose body fails if run: the result the async replay got."""
    problems: list[str] = []
    with Guard(url, lease=LEASE, on_conflict="raise", cache_size=0) as guard:

        @guard.once(key="order_id")
        def charge_order(order_id: str, amount: int, idempotency_key: str = "") -> dict[str, Any]:
            raise AssertionError(f"{order_id} ran again after the chaos run")

        for task_id, tool, order_id, amount in ops:
            if tool != "charge" or task_id not in stored:
                continue
            try:
                with task(task_id):
                    got = charge_order(order_id, amount)
            except Exception as exc:
                problems.append(f"{task_id}: no stored result for a sync tool ({type(exc).__name__}: {exc})")
                continue
            if got != stored[task_id]:
                problems.append(f"{task_id}: a sync tool replays {got}, an async one {stored[task_id]}")
    return problems


async def _terminate_backends(url: str) -> int:
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        n = await conn.fetchval(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'agentguard' AND pid <> pg_backend_pid()) t"
        )
        return int(n or 0)
    finally:
        await conn.close()


def _hold_write_lock(url: str, seconds: float) -> None:
    path = make_url(url).database
    assert path
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        time.sleep(seconds)
        conn.execute("COMMIT")
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n\n")[1])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--short", action="store_true", help="the test command's run (the default)")
    size.add_argument("--long", action="store_true", help="more operations, longer faults")
    p.add_argument("--seed", type=int, default=20260101)
    p.add_argument("--only", choices=["postgresql", "sqlite"])
    p.add_argument("--pg-url", help="a Postgres to use (then it is not restarted); default: a throwaway cluster")
    args = p.parse_args(argv)
    plans = LONG if args.long else SHORT
    rng = random.Random(args.seed)
    outcomes: list[Outcome] = []
    tmp = Path(tempfile.mkdtemp(prefix="agentguard-chaos."))
    provider: Provider | None = None
    try:
        for backend in ("postgresql", "sqlite"):
            if args.only and args.only != backend:
                continue
            if provider is not None:
                provider.stop()
            provider = Provider().start()  # a provider of its own for each fleet
            if backend == "sqlite":
                url = f"sqlite+aiosqlite:///{tmp / 'chaos.db'}"
                outcomes.append(Fleet(backend, url, provider, plans[backend], rng, tmp).run())
            elif args.pg_url:
                outcomes.append(Fleet(backend, args.pg_url, provider, plans[backend], rng, tmp).run())
            else:
                sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
                from benchmarks._pgserver import PgServer

                with contextlib.ExitStack() as stack:
                    pg = PgServer(fsync=False)
                    url = stack.enter_context(pg)
                    outcomes.append(Fleet(backend, url, provider, plans[backend], rng, tmp, pg=pg).run())
    finally:
        if provider is not None:
            provider.stop()
        if os.environ.get("AGENTGUARD_CHAOS_KEEP") != "1":
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    failed = [p for o in outcomes for p in o.problems]
    for problem in failed[:50]:
        print(f"chaos: PROBLEM: {problem}")
    for o in outcomes:
        for line in o.summary:
            print(f"chaos: {line}")
    print("chaos: FAILED" if failed else "chaos: OK: one charge per operation, every caller got the stored result "
          "or a clear error, no claim left held")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
