"""``python -m benchmarks [--quick] [--json FILE] [--only sqlite|postgres] [--pg-url URL] [--profile] [--race]
[--load]``

Measures agentguard against the raw-driver floor, side by side in one run, and prints a table of medians
and ratios with PASS/FAIL beside each target. See docs/benchmarks.md for what each number means.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from agentguard.stores import SQLStore

from . import _report as rpt
from ._common import NoIOStore, Observed, observe, pin_one_cpu
from ._drivers import SYNCHRONOUS, aiosqlite_raw, asyncpg_raw, pg_settings, psycopg_raw, set_sync_commit, sqlite_url
from ._groups import calls, shortcuts
from ._harness import SLICES, Stat
from ._observe import observability
from ._peers import dbos, powertools
from ._profile import PROFILED, report
from ._race import race_postgres, race_sqlite, race_table
from ._race import targets as race_targets


@dataclass(frozen=True)
class Config:
    n: int  # calls per variant per rep, one caller
    reps: int
    warmup: int
    no_io_n: int
    conc_n: int
    callers: int
    counts_n: int
    peers: bool
    race_n: int
    slices: int = SLICES  # one caller's calls of a rep, in this many slices (the variants taken in turn in each)


FULL = Config(n=400, reps=5, warmup=100, no_io_n=600, conc_n=768, callers=64, counts_n=100, peers=True, race_n=200)
QUICK = Config(n=30, reps=2, warmup=10, no_io_n=200, conc_n=64, callers=16, counts_n=10, peers=False, race_n=20)
PG, SQ, REPLAY, FIRST = "postgres.sequential", "sqlite.sequential", "agentguard: replay", "agentguard: first call"
# (id, what, group, variant, op, limit, unit, against): "×" is the variant's ratio to ``against`` (else to its
# floor), taken in each rep
TARGETS = (
    # (issue 34: a first call and a cache-miss replay each within a quarter of the raw driver)
    ("pg_first", "Postgres, one caller: first call ÷ raw asyncpg claim + complete", PG, FIRST, "<=", 1.25, "×", ""),
    ("pg_replay", "Postgres, one caller: replay (cache miss) of a task's history ÷ raw SELECT", PG, REPLAY, "<=",
     1.25, "×", ""),
    ("pg_lone_replay", "Postgres: first replay of a task (cache miss), each call its own task ÷ raw SELECT", PG,
     "agentguard: replay, first of its task", "<=", 1.25, "×", ""),
    ("pg_first_sync", "Postgres, one caller: a sync tool's first call ÷ raw psycopg claim + complete", PG,
     "agentguard: sync tool, first call", "<=", 1.25, "×", ""),
    ("pg_replay_sync", "Postgres, one caller: a sync tool's replay (cache miss) ÷ raw psycopg SELECT", PG,
     "agentguard: sync tool, replay", "<=", 1.25, "×", ""),
    ("sqlite_first", "SQLite, one caller: first call ÷ raw aiosqlite claim + complete", SQ, FIRST, "<=", 2.0, "×", ""),
    ("sqlite_replay", "SQLite, one caller: replay (cache miss) ÷ raw aiosqlite SELECT", SQ, REPLAY, "<=", 2.0, "×", ""),
    ("cached_sqlite", "SQLite: cached replay", SQ, "agentguard: cached replay", "<=", 25, "µs", ""),
    ("cached_postgres", "Postgres: cached replay", PG, "agentguard: cached replay", "<=", 25, "µs", ""),
    ("python_first", "guard's own Python work (no I/O): a whole first call", "no_io", FIRST, "<=", 25, "µs", ""),
    ("python_replay", "guard's own Python work (no I/O): a whole replay (cache miss)", "no_io", REPLAY, "<=", 25, "µs",
     ""),
    ("pg_64", "Postgres, many callers: throughput ÷ the raw asyncpg pool's", "postgres.concurrent", FIRST, ">=", 0.6,
     "×", ""),
    ("powertools_first", "Peer: agentguard first call ÷ Powertools first call over Redis", SQ, FIRST, "<", 1, "×",
     "powertools: first call"),
    ("powertools_replay", "Peer: agentguard replay ÷ Powertools replay over Redis", SQ, REPLAY, "<", 1, "×",
     "powertools: replay"),
)
_T0 = time.perf_counter()


def _log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _meta(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    versions = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for dist in ("agentguard", "sqlalchemy", "asyncpg", "aiosqlite", "pydantic", "dbos", "aws-lambda-powertools"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    git = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        def out(*cmd: str) -> str:
            return subprocess.run(cmd, cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5).stdout

        git = out("git", "rev-parse", "--short", "HEAD").strip() + (
            " + uncommitted changes in agentguard/" if out("git", "status", "--porcelain", "../agentguard") else "")
    return {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "mode": "quick" if args.quick else "full",
            "config": asdict(cfg), "cpus": os.cpu_count(), "machine": platform.platform(), "versions": versions,
            "agentguard_git": git, "pinned_to_cpus": sorted(os.sched_getaffinity(0))}


class Run:
    def __init__(self, args: argparse.Namespace, cfg: Config, tmp: Path) -> None:
        self.args, self.cfg, self.tmp = args, cfg, tmp
        self.groups: dict[str, dict[str, Stat]] = {}
        self.doc: dict[str, Any] = {"meta": _meta(args, cfg), "groups": {}, "peers": {}, "race": {}}
        self.peers = cfg.peers and not args.no_peers and not args.profile
        self.racing = args.race or self.peers  # the agent-once race (``--race``: it alone)
        self.profile, self.profiles = PROFILED if args.profile else (), ["== Profiles (--profile)"]

    def want(self, backend: str) -> bool:
        return self.args.only in (None, backend)

    def add(self, key: str, what: str, n: int, stats: dict[str, Stat], notes: list[str], obs: Observed | None = None
            ) -> None:
        extra: dict[str, Any] = {}
        if obs is not None:  # one caller, a real store: what the guard adds, and what it asked of the store
            reads_first = obs.verbs["replay after a replay"] == ["claim (likely taken)"]
            bare = "store only (SQLStore): " + ("SELECT" if reads_first else "claim, existing key")
            gap = {path: rpt.fmt(rpt.cpu_gap(stats, f"agentguard: {path}", ref)) for path, ref in
                   (("first call", "store only (SQLStore): claim + complete"), ("replay", bare))}
            notes = [*notes, f"client CPU the Guard adds over the bare store: first call {gap['first call']} µs,"
                     f" replay {gap['replay']} µs (over {bare})", "store verbs per call (observed through a recording"
                     " store): " + "; ".join(f"{path}: {' + '.join(v) or 'none'}" for path, v in obs.verbs.items())]
            extra["verbs"] = obs.verbs
        for s in stats.values():
            if s.profile is not None:
                extra.setdefault("profile", {})[s.name], text = report(key, s, n * self.cfg.reps)
                self.profiles.append(text)
        self.groups[key] = stats
        self.doc["groups"][key] = rpt.group_json(stats, notes, title=f"{what} ({n} calls × {self.cfg.reps} reps)",
                                                 **extra)

    async def no_io(self) -> None:
        c, store = self.cfg, NoIOStore()
        _log("== the guard's own Python work: Guard(store=<a no-I/O stand-in>)")
        stats, notes = await calls(lambda: store, None, n=c.no_io_n, reps=c.reps, warmup=c.warmup, log=_log,
                                   slices=c.slices, profile=self.profile)
        if len(store.rows) < c.warmup + c.no_io_n * c.reps:  # a record per first call at least: it was used
            notes.append(f"INVALID: the guards kept only {len(store.rows)} records in the stand-in store")
        self.add("no_io", "No I/O: whole guarded calls over a stand-in store that answers at once", c.no_io_n, stats,
                 notes)
        if self.profile:
            return
        _log("== observing a call: telemetry and the ledger, beside telemetry off")
        stats, notes = await observability(n=c.no_io_n, reps=c.reps, warmup=c.warmup, log=_log)
        self.add("observe", "Observing a call (no I/O): OpenTelemetry and the ledger, each ÷ telemetry off",
                 c.no_io_n, stats, notes)
        _log("== shortcuts beside their general paths")
        stats, notes = await shortcuts(n=c.no_io_n, reps=c.reps, warmup=c.warmup, log=_log)
        self.add("shortcuts", "Pure shortcuts, each beside the general path it equals (its floor)", c.no_io_n, stats,
                 notes)

    async def sqlite(self) -> None:
        c, path = self.cfg, self.tmp / "bench.db"
        url, kw = sqlite_url(path), {"sqlite_synchronous": SYNCHRONOUS}
        _log(f"== SQLite, one caller ({c.n} calls × {c.reps} reps)")
        obs = await observe(url, kw)
        raw, pt_notes = await aiosqlite_raw(path, obs), []
        with powertools(pt_notes) if self.peers else contextlib.nullcontext([]) as peers:
            stats, notes = await calls(lambda: SQLStore(url, **kw), raw, n=c.n, reps=c.reps, warmup=c.warmup, log=_log,
                                       profile=self.profile, peers=peers, slices=c.slices)
        self.add(SQ, f"SQLite WAL, synchronous={SYNCHRONOUS}, one caller", c.n, stats, notes + pt_notes, obs=obs)
        if self.peers:
            await self.peer("dbos_sqlite", f"sqlite:///{self.tmp / 'dbos.sqlite'}", sqlite_url(self.tmp / "ag.db"))

    @contextlib.asynccontextmanager
    async def pg_database(self) -> AsyncIterator[str]:
        """The database to measure on: --pg-url as given, or a fresh one on a throwaway cluster."""
        from ._drivers import pg_exec, with_db
        from ._pgserver import PgServer

        if self.args.pg_url:
            yield self.args.pg_url
            return
        _log("== starting a throwaway PostgreSQL")
        atexit.register((server := PgServer()).stop)
        try:
            base = await asyncio.to_thread(server.start)
            await pg_exec(base, "CREATE DATABASE agentguard_bench")
            yield with_db(base, "agentguard_bench")
        finally:
            await asyncio.to_thread(server.stop)

    async def postgres(self, url: str) -> None:
        from ._counts import durability_counts

        c = self.cfg
        try:
            if not self.profile:
                _log(f"== Postgres durability counts ({c.counts_n} calls per phase, synchronous_commit=on)")
                self.doc["postgres_counts"] = await durability_counts(url, c.counts_n, _log)
            await set_sync_commit(url, "off")
            settings = self.doc["meta"]["postgres"] = await pg_settings(url)
            obs = await observe(url, {})
            _log(f"== Postgres, one caller ({c.n} calls × {c.reps} reps)")
            stats, notes = await calls(lambda: SQLStore(url), await asyncpg_raw(url, obs), n=c.n, reps=c.reps,
                                       warmup=c.warmup, log=_log, profile=self.profile, slices=c.slices,
                                       sync_raw=None if self.profile else psycopg_raw(url, obs))
            self.add(PG, f"PostgreSQL {settings['server_version'].split()[0]}, synchronous_commit=off,"
                     " one caller", c.n, stats, notes, obs=obs)
            if self.profile:
                return
            _log(f"== Postgres, {c.callers} callers ({c.conc_n} calls × {c.reps} reps)")
            stats, notes = await calls(lambda: SQLStore(url, pool_size=c.callers),
                                       await asyncpg_raw(url, obs, c.callers), n=c.conc_n, reps=c.reps,
                                       warmup=c.warmup, callers=c.callers, log=_log)
            self.add("postgres.concurrent", f"PostgreSQL, {c.callers} concurrent callers, distinct keys (throughput ÷"
                     " the floor's = 1 / × floor)", c.conc_n, stats, notes)
            if self.peers:
                await self.peer("dbos_postgres", url.replace("postgresql+asyncpg://", "postgresql://", 1), url)
        finally:
            with contextlib.suppress(Exception):  # the server may be gone already
                await set_sync_commit(url, None)

    async def peer(self, key: str, *urls: str) -> None:
        _log(f"== peer: {key}")
        self.doc["peers"][key] = await asyncio.to_thread(dbos, *urls, reps=self.cfg.reps)

    async def load(self) -> None:
        from ._load import load

        seconds = 2.0 if self.args.quick else self.args.load_seconds
        pg = self.pg_database() if self.want("postgres") else contextlib.nullcontext(None)
        async with pg as url:
            self.doc["load"] = await load(self.tmp if self.want("sqlite") else None, url, seconds=seconds,
                                          reps=self.cfg.reps, log=_log, parts=tuple(self.args.load_only))

    async def main(self) -> None:
        if self.args.load:
            await self.load()
            return
        alone, c, race = self.args.race, self.cfg, self.doc["race"]
        if not alone:
            await self.no_io()
        if self.want("sqlite"):
            if not alone:
                await self.sqlite()
            if self.racing:
                await race_sqlite(race, reps=c.reps, n=c.race_n, log=_log, grow=not self.args.quick)
        if self.want("postgres"):
            async with self.pg_database() as url:
                if not alone:
                    await self.postgres(url)
                if self.racing:
                    await race_postgres(race, url, reps=c.reps, n=c.race_n, log=_log)

    def targets(self) -> list[rpt.Target]:
        out = [rpt.of_stats(id, what, g, self.groups[g], name, op, limit, unit, against)
               for id, what, g, name, op, limit, unit, against in TARGETS
               if g in self.groups and {name, against} - {""} <= set(self.groups[g])]  # (a peer may not run)
        counts, peers = self.doc.get("postgres_counts"), self.doc["peers"]
        for id, name, want in (("first", "first call", 2.0), ("first_sync", "first call, sync tool", 2.0),
                               ("replay", "replay", 0.0), ("replay_sync", "replay, sync tool", 0.0)) if counts else ():
            out.append(rpt.Target(f"commits_{id}", f"Durability: commits per {name} (counted)",
                                  counts[f"agentguard: {name}"]["commits"], want, "==", "commits"))
        for id, what, value, why, limit in race_targets(self.doc["race"]):
            out.append(rpt.Target(id, what, value, limit, "<=", why_na=why))
        for key, label in (("dbos_sqlite", "SQLite"), ("dbos_postgres", "Postgres")):
            if key in peers:
                out.append(rpt.Target(key, f"Peer: agentguard first call ÷ DBOS step ({label})",
                                      peers[key].get("ratio"), 1.0, "<", why_na=peers[key].get("unavailable", "")))
        return out

    def render(self, targets: list[rpt.Target]) -> str:
        beside = {t.where: t.beside for t in targets}
        m = self.doc["meta"]
        parts = [f"agentguard benchmark — {m['mode']} run, {m['date']}, agentguard {m['agentguard_git']},"
                 f" {m['cpus']} CPUs, Python {platform.python_version()}",
                 "µs/call = wall time / calls; p50 = median single-call latency; CPU µs = this process's CPU per call"
                 " (all threads); × floor = µs/call ÷ the floor's, measured in the same rep, median over reps; (p50) ="
                 " the same ratio of p50s. The machine is shared: trust ratios and counts, not µs."]
        parts += [rpt.group_table(f"{g['title']}", g, {v: t for (k, v), t in beside.items() if k == key})
                  for key, g in self.doc["groups"].items()]
        if "postgres_counts" in self.doc:
            parts.append(rpt.counts_table(self.doc["postgres_counts"]))
        parts.append(rpt.peers_table(self.doc["peers"]) if self.doc["peers"] else "== Peers: skipped")
        if self.doc["race"]:
            parts.append(race_table(self.doc["race"]))
        return "\n\n".join([*parts, rpt.targets_table(targets)])


def _slices(text: str) -> int:
    """``--slices``: a whole number, 1 or more."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of slices (a whole number, 1 or more)")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[1])
    ap.add_argument("--quick", action="store_true", help="a few seconds: proves the harness works (CI)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    ap.add_argument("--only", choices=["sqlite", "postgres"], help="one backend only")
    ap.add_argument("--pg-url", help="use this Postgres database (filled and ALTERed) instead of a throwaway cluster")
    ap.add_argument("--reps", type=int, help="repetitions (default 5, quick 2)")
    ap.add_argument("--no-peers", action="store_true", help="skip DBOS / Powertools / agent-once")
    ap.add_argument("--load", action="store_true", help="instead: the load targets (many callers, waiters, sweeps)"
                    " side by side")
    ap.add_argument("--load-only", nargs="+", choices=["callers", "waiters", "sweeps", "writers"],
                    default=["callers", "waiters", "sweeps", "writers"], help="with --load: only these parts")
    ap.add_argument("--load-seconds", type=float, default=10.0, help="each --load window of callers (default 10)")
    ap.add_argument("--race", action="store_true", help="only the race with agent-once (SQLite FULL and NORMAL,"
                    " Postgres): first calls and replays, sync and async tools, cache off")
    ap.add_argument("--profile", action="store_true", help="instead: where a guarded call's time goes, per layer")
    ap.add_argument("--no-pin", action="store_true", help="let the scheduler place this process (and its servers)")
    ap.add_argument("--slices", type=_slices, help=f"one caller's calls of a rep in this many slices, the variants"
                    f" taken in turn in each (default {SLICES}; 1: each variant's calls back to back)")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    cfg = replace(cfg, reps=args.reps) if args.reps else cfg
    cfg = replace(cfg, slices=args.slices) if args.slices is not None else cfg

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # so the throwaway cluster is stopped by the finally/atexit handlers

    signal.signal(signal.SIGTERM, on_term)
    if not args.no_pin:
        pin_one_cpu()
    tmp = Path(tempfile.mkdtemp(prefix="agentguard-bench."))
    try:
        asyncio.run((run := Run(args, cfg, tmp)).main())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.profile:
        print("\n\n".join(run.profiles))
    elif args.load:
        from ._load import load_table

        print(load_table(run.doc["load"]))
    else:
        targets = run.targets()
        run.doc["targets"] = [t.as_dict() for t in targets]
        run.doc["meta"]["wall_seconds"] = round(time.perf_counter() - _T0, 1)
        print(run.render(targets) + f"\n\n(total {run.doc['meta']['wall_seconds']} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(run.doc, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
