"""``python -m benchmarks [--quick] [--json FILE] [--only sqlite|postgres] [--pg-url URL]``

Measures agentguard against the raw-driver floor, side by side in one run, and prints a table of medians
and ratios with PASS/FAIL beside each target of issue 7. See docs/benchmarks.md for what each number means.
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

from . import _report as rpt
from ._harness import Stat, ratio, ratios


@dataclass(frozen=True)
class Config:
    sqlite_n: int
    pg_n: int
    reps: int
    warmup: int
    conc_n: int
    callers: int
    counts_n: int
    overhead_n: int
    peers: bool
    dbos_workflows: int
    dbos_steps: int
    powertools_calls: int


FULL = Config(sqlite_n=400, pg_n=400, reps=5, warmup=100, conc_n=768, callers=64, counts_n=100,
              overhead_n=600, peers=True, dbos_workflows=10, dbos_steps=10,
              powertools_calls=200)
QUICK = Config(sqlite_n=30, pg_n=30, reps=2, warmup=10, conc_n=64, callers=16, counts_n=10,
               overhead_n=200, peers=False, dbos_workflows=2, dbos_steps=5,
               powertools_calls=20)


_T0 = time.perf_counter()


def _log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for dist in ("agentguard", "sqlalchemy", "asyncpg", "aiosqlite", "greenlet", "pydantic", "dbos"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


def _git() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "agentguard"], cwd=root, capture_output=True,
                               text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}{' + uncommitted changes in agentguard/' if dirty else ''}" if rev else "unknown"


PIECES = ("piece: bind + fingerprint + key (_Spec.call)", "piece: codec encode + decode", "piece: with task(...)")
HARNESS = "harness: an empty call"  # what timing one call costs the harness itself (a coroutine, two clocks)


class Run:
    def __init__(self, args: argparse.Namespace, cfg: Config, tmp: Path) -> None:
        self.args, self.cfg, self.tmp = args, cfg, tmp
        self.groups: dict[str, tuple[str, dict[str, Stat], list[str], bool]] = {}
        self.profiles: list[str] = []
        self.doc: dict[str, Any] = {
            "meta": {
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "mode": "quick" if args.quick else "full",
                "config": asdict(cfg), "cpus": os.cpu_count(), "machine": platform.platform(),
                "event_loop": "asyncio (default)", "versions": _versions(), "agentguard_git": _git(),
            },
        }

    def want(self, backend: str) -> bool:
        return self.args.only in (None, backend)

    def add(self, key: str, title: str, stats: dict[str, Stat], notes: list[str], concurrent: bool = False,
            **extra: Any) -> None:
        self.groups[key] = (title, stats, notes, concurrent)
        self.doc.setdefault("groups", {})[key] = rpt.group_json(stats, notes, title=title, **extra)

    def stats(self, key: str) -> dict[str, Stat] | None:
        g = self.groups.get(key)
        return None if g is None else g[1]

    # -- the measurements ---------------------------------------------------------------------------------

    async def overhead(self) -> None:
        from . import _overhead

        _log("== the guard's own Python work (no I/O)")
        c = self.cfg
        stats, notes = await _overhead.overhead(self.tmp, n=c.overhead_n, reps=c.reps, warmup=c.warmup, log=_log)
        self.add("overhead", f"The guard's own Python work, no I/O ({c.overhead_n} calls × {c.reps} reps)",
                 stats, notes)

    async def sqlite(self) -> None:
        from . import _sqlite

        c = self.cfg
        path = self.tmp / "bench.db"
        _log(f"== SQLite, one caller ({c.sqlite_n} calls × {c.reps} reps)")
        obs = await _sqlite.observe(path)
        stats, notes = await _sqlite.sequential(path, obs, n=c.sqlite_n, reps=c.reps, warmup=c.warmup, log=_log)
        self.add("sqlite.sequential", f"SQLite WAL, synchronous=OFF, one caller ({c.sqlite_n} calls × {c.reps} reps,"
                 " medians; × floor = per-rep ratio to the raw aiosqlite floor of the same kind)", stats, notes,
                 statements=_statements(obs))

    @contextlib.asynccontextmanager
    async def pg_database(self) -> AsyncIterator[tuple[str, str]]:
        """The database to measure on: --pg-url as given, or a fresh one on a throwaway cluster."""
        from . import _pg
        from ._pgserver import PgServer

        if self.args.pg_url:
            yield self.args.pg_url, "the server given by --pg-url"
            return
        _log("== starting a throwaway PostgreSQL")
        server = PgServer()
        atexit.register(server.stop)
        try:
            base = await asyncio.to_thread(server.start)
            await _pg._exec(_pg.dsn_of(base), "CREATE DATABASE agentguard_bench")
            yield _pg.with_db(base, "agentguard_bench"), "a throwaway cluster (fsync on, autovacuum off)"
        finally:
            await asyncio.to_thread(server.stop)

    async def profile(self) -> None:
        from . import _pg, _profile, _sqlite

        n = 100 if self.args.quick else 1000
        if self.want("sqlite"):
            _log("== profiling SQLite")
            url = _sqlite.url_of(self.tmp / "profile.db")
            prof = await _profile.profile_backend(url, n, {"sqlite_synchronous": _sqlite.SYNCHRONOUS})
            self.doc.setdefault("profile", {})["sqlite"] = prof
            self.profiles.append(_profile.render("SQLite (WAL, synchronous=OFF)", prof))
        if self.want("postgres"):
            async with self.pg_database() as (url, _where):
                _log("== profiling Postgres")
                await _pg.set_sync_commit(url, "off")
                try:
                    prof = await _profile.profile_backend(url, n, {})
                finally:
                    await _pg.set_sync_commit(url, None)
            self.doc.setdefault("profile", {})["postgres"] = prof
            self.profiles.append(_profile.render("PostgreSQL (synchronous_commit=off)", prof))

    async def postgres(self) -> None:
        async with self.pg_database() as (url, where):
            await self._postgres(url, where)

    async def _postgres(self, url: str, where: str) -> None:
        from . import _pg
        from ._common import observe

        c = self.cfg
        try:
            _log(f"== Postgres durability counts ({c.counts_n} calls per phase, synchronous_commit=on)")
            counts = await _pg.durability_counts(url, c.counts_n, _log)
            counts["where"] = where
            self.doc["postgres_counts"] = counts
            await _pg.set_sync_commit(url, "off")
            settings = await _pg.settings(url)
            self.doc["meta"]["postgres"] = {**settings, "where": where}
            obs = await observe(url)
            _log(f"== Postgres, one caller ({c.pg_n} calls × {c.reps} reps)")
            stats, notes = await _pg.sequential(url, obs, n=c.pg_n, reps=c.reps, warmup=c.warmup, log=_log)
            self.add("postgres.sequential", f"PostgreSQL {settings.get('server_version', '').split()[0]},"
                     f" synchronous_commit=off, one caller ({c.pg_n} calls × {c.reps} reps, medians; × floor ="
                     " per-rep ratio to the raw asyncpg floor of the same kind)", stats, notes,
                     statements=_statements(obs))
            _log(f"== Postgres, {c.callers} callers ({c.conc_n} calls × {c.reps} reps)")
            stats, notes = await _pg.concurrent(url, n=c.conc_n, reps=c.reps, warmup=c.warmup, callers=c.callers,
                                                log=_log)
            self.add("postgres.concurrent", f"PostgreSQL, {c.callers} concurrent callers, distinct keys"
                     f" ({c.conc_n} calls × {c.reps} reps; × floor thr. = throughput / the raw pool's)",
                     stats, notes, concurrent=True)
            if self.cfg.peers and not self.args.no_peers:
                from . import _peers

                _log("== peer: DBOS on Postgres")
                dbos_url = url.replace("postgresql+asyncpg://", "postgresql://", 1)
                self.doc.setdefault("peers", {})["dbos_postgres"] = await asyncio.to_thread(
                    _peers.dbos, "postgres", dbos_url, url, workflows=c.dbos_workflows, steps=c.dbos_steps,
                    reps=c.reps)
        finally:
            with contextlib.suppress(Exception):  # the server may be gone already
                await _pg.set_sync_commit(url, None)

    def sqlite_peer(self) -> None:
        from . import _peers

        _log("== peer: DBOS on SQLite")
        c = self.cfg
        self.doc.setdefault("peers", {})["dbos_sqlite"] = _peers.dbos(
            "sqlite", f"sqlite:///{self.tmp / 'dbos.sqlite'}", f"sqlite+aiosqlite:///{self.tmp / 'peer.db'}",
            workflows=c.dbos_workflows, steps=c.dbos_steps, reps=c.reps)

    def powertools_peer(self) -> None:
        from . import _peers

        _log("== peer: AWS Powertools over Redis (agentguard on SQLite)")
        c = self.cfg
        self.doc.setdefault("peers", {})["powertools_redis"] = _peers.powertools(
            f"sqlite+aiosqlite:///{self.tmp / 'powertools-peer.db'}", calls=c.powertools_calls, reps=c.reps)

    async def main(self) -> None:
        if self.args.profile:
            await self.profile()
            return
        await self.overhead()
        if self.want("sqlite"):
            await self.sqlite()
        if self.want("postgres"):
            await self.postgres()
        if self.cfg.peers and not self.args.no_peers:
            if self.want("sqlite"):
                await asyncio.to_thread(self.sqlite_peer)
            await asyncio.to_thread(self.powertools_peer)

    # -- the report ---------------------------------------------------------------------------------------

    def targets(self) -> list[rpt.Target]:
        T = rpt.Target

        def R(id: str, what: str, st: dict[str, Stat], name: str, ref: str, limit: float) -> rpt.Target:
            """A ratio target: the median of the per-rep ratios, and the ratios themselves."""
            return T(id, what, ratio(st, name, ref), limit, "<=", per_rep=ratios(st, name, ref))

        pg, sq, conc, ov = (self.stats(k) for k in ("postgres.sequential", "sqlite.sequential",
                                                     "postgres.concurrent", "overhead"))
        out: list[rpt.Target] = []
        if pg is not None:
            out += [
                R("pg_first", "Postgres, one caller: first call / asyncpg claim+complete", pg,
                  "agentguard: first call", "raw asyncpg: claim + complete", 1.5),
                R("pg_replay", "Postgres, one caller: replay / one raw SELECT", pg,
                  "agentguard: replay", "raw asyncpg: SELECT", 1.5),
                R("pg_lone_replay", "Postgres: first replay of a task / raw SELECT (stricter)", pg,
                  "agentguard: replay, first of its task", "raw asyncpg: SELECT", 1.5),
            ]
        if sq is not None:
            out += [
                R("sqlite_first", "SQLite, one caller: first call / aiosqlite claim+complete", sq,
                  "agentguard: first call", "raw aiosqlite: claim + complete", 2.0),
                R("sqlite_replay", "SQLite, one caller: replay / one raw aiosqlite SELECT", sq,
                  "agentguard: replay", "raw aiosqlite: SELECT", 2.0),
            ]
        for key, label, st in (("sqlite", "SQLite", sq), ("postgres", "Postgres", pg)):
            if st is not None:
                s = st.get("agentguard: cached replay")
                out.append(T(f"cached_{key}", f"{label}: cached replay, wall time per call",
                             rpt.us(st, "agentguard: cached replay"), 25, "<=", "µs",
                             s.unavailable if s is not None else ""))
        if ov is not None:
            # The list — fingerprint, codec, context — is the sum of the three timed pieces; the whole
            # decorated call without I/O (the state machine, events, cache and heartbeat too) is held to the
            # same 25 µs as a stricter target.
            # Each piece is timed as one harness call; what the harness spends on a call that does nothing
            # is the guard's work of none of them, so it is taken off each.
            harness = rpt.us(ov, HARNESS) or 0.0
            pieces = [rpt.us(ov, n) for n in PIECES]
            missing = [n for n, v in zip(PIECES, pieces, strict=True) if v is None]
            out.append(T("python_pieces", "guard's own Python work: fingerprint + codec + context",
                         None if missing else sum(max(0.0, v - harness) for v in pieces if v is not None), 25,
                         "<=", "µs", f"not measured: {', '.join(missing)}" if missing else ""))
            for name in ("first call", "replay"):
                s = ov.get(f"no-I/O guard: {name}")
                out.append(T(f"python_{name.split()[0]}", f"whole guarded {name} without I/O (stricter)",
                             rpt.us(ov, f"no-I/O guard: {name}"), 25, "<=", "µs",
                             s.unavailable if s is not None else ""))
        if conc is not None:
            r = ratio(conc, "agentguard: first call", "raw asyncpg pool (reset= no-op): claim + complete")
            out.append(T("pg_64", f"Postgres, {self.cfg.callers} callers: throughput / raw asyncpg pool",
                         None if r is None else 1 / r, 0.6, ">="))
        counts = self.doc.get("postgres_counts")
        if counts is not None:
            for name, want in (("first call", 2.0), ("replay", 0.0)):
                row = counts.get(f"agentguard: {name}", {})
                out.append(T(f"commits_{name.split()[0]}", f"Durability: commits per {name} (counted)",
                             row.get("commits"), want, "==", "commits"))
        peers = self.doc.get("peers", {})
        for key, label in (("dbos_sqlite", "SQLite"), ("dbos_postgres", "Postgres")):
            if key in peers:
                p = peers[key]
                out.append(T(key, f"Peer: agentguard first call / DBOS step ({label})", p.get("ratio"), 1.0, "<",
                             why_na=p.get("unavailable", "")))
        if "powertools_redis" in peers:
            p = peers["powertools_redis"]
            why = p.get("unavailable") or "; ".join(f"INVALID: {m}" for m in p.get("invalid", []))
            for name, key in (("first call", "first_call"), ("replay", "replay")):
                out.append(T(f"powertools_{key}", f"Peer: agentguard {name} / Powertools {name} over Redis",
                             p.get(f"ratio_{key}"), 1.0, "<", why_na=why))
        return out

    def render(self, targets: list[rpt.Target]) -> str:
        by_variant: dict[str, dict[str, str]] = {}
        spots = {
            "pg_first": ("postgres.sequential", "agentguard: first call"),
            "pg_replay": ("postgres.sequential", "agentguard: replay"),
            "pg_lone_replay": ("postgres.sequential", "agentguard: replay, first of its task"),
            "sqlite_first": ("sqlite.sequential", "agentguard: first call"),
            "sqlite_replay": ("sqlite.sequential", "agentguard: replay"),
            "cached_sqlite": ("sqlite.sequential", "agentguard: cached replay"),
            "cached_postgres": ("postgres.sequential", "agentguard: cached replay"),
            "python_first": ("overhead", "no-I/O guard: first call"),
            "python_replay": ("overhead", "no-I/O guard: replay"),
            "pg_64": ("postgres.concurrent", "agentguard: first call"),
        }
        for t in targets:
            if t.id in spots:
                g, v = spots[t.id]
                lim = f"{t.op} {t.limit:g}{t.unit if t.unit == '×' else ' ' + t.unit}"
                by_variant.setdefault(g, {})[v] = f"{lim} {t.result}"
        parts = [f"agentguard benchmark — {self.doc['meta']['mode']} run, {self.doc['meta']['date']},"
                 f" agentguard {self.doc['meta']['agentguard_git']}, {os.cpu_count()} CPUs, Python"
                 f" {platform.python_version()}",
                 "µs/call = wall time / calls; p50 = median single-call latency; CPU µs = this process's CPU per call"
                 " (all threads); × floor = ratio of µs/call to the reference measured in the same rep, median over"
                 " reps; (p50) = the same ratio of p50s. The machine is shared: trust ratios and counts, not µs."]
        for key, (title, stats, notes, concurrent) in self.groups.items():
            extra = list(notes)
            if key in ("sqlite.sequential", "postgres.sequential"):
                gap_f = rpt.cpu_gap(stats, "agentguard: first call", "store only (SQLStore): claim + complete")
                st = self.doc["groups"][key].get("statements", {})
                bare = ("store only (SQLStore): SELECT" if st.get("replay_next") == ["SELECT (read)"]
                        else "store only (SQLStore): claim, existing key")  # what the replay asks of the store
                gap_r = rpt.cpu_gap(stats, "agentguard: replay", bare)
                extra.append(f"client CPU the Guard adds over the bare store: first call {rpt._fmt(gap_f)} µs,"
                             f" replay {rpt._fmt(gap_r)} µs")
                extra.append(f"statements per first call: {' + '.join(st.get('first_call', [])) or '?'};"
                             f" per replay (cache miss), the first of its task:"
                             f" {' + '.join(st.get('replay', [])) or '?'}; after a replay in the same task:"
                             f" {' + '.join(st.get('replay_next', [])) or '?'}")
            parts.append(rpt.group_table(title, stats, concurrent=concurrent, targets=by_variant.get(key),
                                         notes=extra))
        counts = self.doc.get("postgres_counts")
        if counts is not None:
            s = counts["settings"]
            lines = [f"== Postgres durability cost per call (synchronous_commit=on, fsync={s.get('fsync')},"
                     f" {counts['calls']} calls; counted from pg_stat_database, pg_stat_wal, xids)",
                     f"{'variant':<32}  {'commits':>7}  {'transactions':>12}  {'rows written':>12}  {'WAL flushes':>11}"
                     f"  {'WAL bytes':>9}"]
            for name, row in counts.items():
                if not isinstance(row, dict) or name in ("settings",):
                    continue
                if "unavailable" in row:
                    lines.append(f"{name:<32}  n/a ({row['unavailable']})")
                    continue
                lines.append(f"{name:<32}  {rpt._fmt(row['commits'], 2):>7}  {rpt._fmt(row['transactions'], 2):>12}"
                             f"  {rpt._fmt(row['rows_written'], 2):>12}  {rpt._fmt(row['wal_flushes'], 2):>11}"
                             f"  {rpt._fmt(row['wal_bytes'], 0):>9}{'  (noisy)' if row.get('noisy') else ''}")
            lines.append("  commits = transactions that were assigned an xid (each one a commit record to flush);"
                         " transactions = round trips (pg_stat_database.xact_commit)")
            if s.get("fsync") != "on":
                lines.append("  note: fsync is off on this server, so WAL flushes are not counted (—)")
            parts.append("\n".join(lines))
        peers = self.doc.get("peers")
        if peers:
            lines = ["== Peers (same machine, same run)"]
            for key, p in peers.items():
                if "unavailable" in p:
                    lines.append(f"{key}: n/a ({p['unavailable']})")
                elif key == "powertools_redis":
                    lines.append(f"{key}: Powertools @idempotent_function first call"
                                 f" {rpt._fmt(p['powertools_first_call_us'])} µs, replay"
                                 f" {rpt._fmt(p['powertools_replay_us'])} µs (Redis"
                                 f" {p.get('versions', {}).get('redis-server', '?')}, memory only, PING"
                                 f" {rpt._fmt(p['redis_ping_us'])} µs); agentguard on {p['agentguard_backend']}:"
                                 f" first call {rpt._fmt(p['agentguard_first_call_us'])} µs →"
                                 f" {p['ratio_first_call']:.2f}×, replay (cache miss)"
                                 f" {rpt._fmt(p['agentguard_replay_us'])} µs → {p['ratio_replay']:.2f}×")
                    lines += [f"  INVALID: {m}" for m in p.get("invalid", [])]
                else:
                    lines.append(f"{key}: DBOS step {rpt._fmt(p['dbos_step_us'])} µs (whole workflow per step"
                                 f" {rpt._fmt(p['dbos_workflow_per_step_us'])} µs), agentguard first call"
                                 f" {rpt._fmt(p['agentguard_first_call_us'])} µs → {p['ratio']:.2f}×")
            parts.append("\n".join(lines))
        elif not self.cfg.peers:
            parts.append("== Peers: skipped in --quick mode")
        parts.append(rpt.targets_table(targets))
        return "\n\n".join(parts)


def _verb(sql: str) -> str:
    from ._common import verb

    return verb(sql)


def _statements(obs: Any) -> dict[str, list[str]]:
    return {"first_call": [_verb(s) for s in obs.first], "replay": [_verb(s) for s in obs.replay],
            "replay_next": [_verb(s) for s in obs.replay_next]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[1])
    ap.add_argument("--quick", action="store_true", help="a few seconds: proves the harness works (CI)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    ap.add_argument("--only", choices=["sqlite", "postgres"], help="one backend only")
    ap.add_argument("--pg-url", help="use this Postgres database (it is filled and ALTERed) instead of a"
                                     " throwaway cluster")
    ap.add_argument("--reps", type=int, help="repetitions (default 5, quick 2)")
    ap.add_argument("--no-peers", action="store_true", help="skip DBOS / Powertools")
    ap.add_argument("--profile", action="store_true", help="instead: where a guarded call's time goes, per layer")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.reps:
        cfg = replace(cfg, reps=args.reps)

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # so the throwaway cluster is stopped by the finally/atexit handlers

    signal.signal(signal.SIGTERM, on_term)
    tmp = Path(tempfile.mkdtemp(prefix="agentguard-bench."))
    started = time.perf_counter()
    try:
        run = Run(args, cfg, tmp)
        asyncio.run(run.main())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.profile:
        print("\n\n".join(run.profiles))
        if args.json:
            Path(args.json).write_text(json.dumps(run.doc, indent=2, default=str) + "\n")
        return 0
    targets = run.targets()
    run.doc["targets"] = [t.as_dict() for t in targets]
    run.doc["meta"]["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(run.render(targets))
    print(f"\n(total {run.doc['meta']['wall_seconds']} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(run.doc, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
