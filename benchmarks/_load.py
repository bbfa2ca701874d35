"""``python -m benchmarks --load``: the load targets, measured side by side (counts and ratios, never a pass
on one timing alone).

- callers: C coroutines making distinct first calls for S seconds through a default ``Guard`` (10 + 20
  connections), and through a raw asyncpg pool of the same 30 connections running the store's two statements,
  in alternating windows: calls per caller (min / median / max), errors, the worst call, and throughput ÷ the
  raw pool's (Postgres);
- waiters in-process: W callers on one key while its body runs; the statements they sent after arriving and
  how long after the completion the last of them returned (both backends);
- waiters in another process (Postgres): W callers in a child process on a key this process holds; the same
  two figures, the statements counted in the child;
- sweeps: claims' p99 from this process while another connection sweeps N expired records, ÷ their p99 with
  no sweep, in alternating windows (both backends); and a sweep with nothing to delete on N records ÷ on 200;
- writers: 4 and 8 processes making first calls on one SQLite file (``_writers``).

The targets (issue 21): no errors, every caller within 3× of the median count, throughput ≥ 0.9× the raw
pool's; waiters' statements independent of W; sweeps' p99 within 2× of none.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg

from agentguard import Guard, task
from agentguard.stores import SQLStore

from ._common import observe
from ._drivers import asyncpg_raw, dsn_of

RESULT = {"charge_id": "ch_1", "amount_cents": 1999}
Log = Callable[[str], None]


# -- callers ---------------------------------------------------------------------------------------------------

def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (the 2nd is the parent's pid, the 12th and
    13th its CPU ticks, the 14th and 15th those of its children that ended), or None if there is no such
    process (ended, or not on this machine)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


async def _postmaster(url: str) -> int | None:
    """The server's postmaster pid, where it runs on this machine: a backend's parent."""
    conn = await asyncpg.connect(dsn_of(url))
    try:
        fields = _stat(await conn.fetchval("SELECT pg_backend_pid()"))
    finally:
        await conn.close()
    return None if fields is None else int(fields[1])


def _cpu(postmaster: int | None) -> tuple[float, float | None]:
    """CPU seconds so far: this process's, and the server's — the postmaster's, its live children's, and
    those of its children that ended (the postmaster's ``cutime``/``cstime``: a connection closed during a
    window keeps what it spent, and one opened in it counts from its start) — or None where the server is not
    on this machine."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    mine = usage.ru_utime + usage.ru_stime
    if postmaster is None:
        return mine, None
    ticks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat(pid)
        if fields is None:
            continue
        if int(pid) == postmaster:
            ticks += sum(int(f) for f in fields[11:15])  # its own, and its ended children's
        elif int(fields[1]) == postmaster:
            ticks += int(fields[11]) + int(fields[12])
    return mine, ticks / os.sysconf("SC_CLK_TCK")


async def _window(one: Callable[[int], Any], callers: int, seconds: float, counter: Iterator[int],
                  postmaster: int | None = None) -> dict[str, Any]:
    """``callers`` coroutines calling ``one(i)`` for ``seconds``, each ``i`` drawn from ``counter``: shared by
    every window of a run, so that no window replays another's keys (a replay costs less than a first call).
    With the CPU each call cost this process and the server (``postmaster``'s): on two cores they share, what
    throughput is."""
    cpu0 = _cpu(postmaster)
    stop = time.perf_counter() + seconds
    per, worst, errors = [0] * callers, [0.0], [0]

    async def caller(j: int) -> None:
        for i in counter:
            if time.perf_counter() > stop:
                return
            t = time.perf_counter()
            try:
                await one(i)
                per[j] += 1
            except Exception:
                errors[0] += 1
            worst[0] = max(worst[0], time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(j) for j in range(callers)))
    dt = time.perf_counter() - t0
    cpu1 = _cpu(postmaster)
    med, calls = statistics.median(per), max(sum(per), 1)
    server = None if cpu0[1] is None or cpu1[1] is None else round((cpu1[1] - cpu0[1]) / calls * 1e6)
    return {"calls_per_s": round(sum(per) / dt), "min": min(per), "median": med, "max": max(per),
            "errors": errors[0], "worst_s": round(worst[0], 3),
            "client_cpu_us": round((cpu1[0] - cpu0[0]) / calls * 1e6), "server_cpu_us": server,
            "fair": bool(med and min(per) >= med / 3 and max(per) <= med * 3),
            "spread": round(max(med - min(per), max(per) - med) / med, 3) if med else None}


async def callers(url: str, n: int, seconds: float, reps: int, log: Log) -> dict[str, Any]:
    obs = await observe(url, {})
    raw = await asyncpg_raw(url, obs, 30)
    rid = uuid.uuid4().hex[:8]
    postmaster = await _postmaster(url)
    out: dict[str, list[dict[str, Any]]] = {"agentguard": [], "raw pool": []}
    async with Guard(url) as guard:
        @guard.once(key=["order_id"])
        async def charge(order_id: str) -> dict[str, Any]:
            return RESULT

        async def ag(i: int) -> None:
            with task(f"load-{rid}-{i // 5}"):
                await charge(f"o-{i}")

        async def raw_one(i: int) -> None:
            await raw.first(f"ag_{rid}{i:040d}", f"o-{i}", '{"charge_id":"ch_1"}')

        counter = iter(range(10**9))
        for rep in range(reps):
            for name, one in (("agentguard", ag), ("raw pool", raw_one))[:: 1 if rep % 2 == 0 else -1]:
                log(f"  {n} callers, {name}, {seconds:g} s")
                out[name].append(await _window(one, n, seconds, counter, postmaster))
    await raw.close()
    ratios = [a["calls_per_s"] / r["calls_per_s"] for a, r in zip(out["agentguard"], out["raw pool"], strict=True)]
    return {"callers": n, "seconds": seconds, **out, "throughput_ratio": statistics.median(ratios),
            "ratios": [round(r, 3) for r in ratios]}


# -- waiters ---------------------------------------------------------------------------------------------------

class _Counting:
    """The real store, counting the claims and reads it is asked for (and marks, where it announces)."""

    def __init__(self, url: str) -> None:
        self.inner = SQLStore(url)
        self.asked = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, params: dict[str, Any], likely_taken: bool = False) -> Any:
        self.asked += 1
        return await self.inner.claim(params, likely_taken)

    async def read(self, scope: str, key: str) -> Any:
        self.asked += 1
        return await self.inner.read(scope, key)

    async def watch(self, *args: Any) -> Any:
        self.asked += 1
        return await self.inner.watch(*args)


async def _wait_here(url: str, task_id: str, waiters: int, ready: Callable[[], None] | None = None
                     ) -> tuple[int, float]:
    """``waiters`` callers on a key another caller holds: (statements after their first claims, the time the
    last returned)."""
    store = _Counting(url)
    waiting = [0]

    def on_event(event: Any) -> None:
        if event.kind == "waiting":
            waiting[0] += 1
            if waiting[0] == waiters and ready is not None:
                ready()

    async with Guard(store=store, on_event=on_event) as guard:  # type: ignore[arg-type]
        @guard.once(key=["order_id"])
        async def charge(order_id: str) -> dict[str, Any]:
            raise AssertionError("a waiter ran the body")

        with task(task_id):
            await asyncio.gather(*(charge("o-1") for _ in range(waiters)))
        return store.asked - waiters, time.time()


async def waiters_in_process(url: str, waiters: int, hold: float) -> dict[str, Any]:
    """The holder and the waiters share one guard: the holder's completion wakes them at once."""
    store = _Counting(url)
    async with Guard(store=store) as guard:  # type: ignore[arg-type]
        started, finish, done_at = asyncio.Event(), asyncio.Event(), [0.0]

        @guard.once(key=["order_id"])
        async def charge(order_id: str) -> dict[str, Any]:
            started.set()
            await finish.wait()
            return RESULT

        t = f"wait-{uuid.uuid4().hex[:8]}"
        with task(t):
            holder = asyncio.create_task(charge("o-1"))
            await started.wait()
            before = store.asked
            others = [asyncio.create_task(charge("o-1")) for _ in range(waiters)]
            await asyncio.sleep(hold)
            finish.set()
            await holder
            done_at[0] = time.perf_counter()
            await asyncio.gather(*others)
            lag = time.perf_counter() - done_at[0]
    return {"waiters": waiters, "hold_s": hold, "statements": store.asked - before - waiters,
            "lag_ms": round(lag * 1000, 2)}


async def waiters_elsewhere(url: str, waiters: int, hold: float) -> dict[str, Any]:
    """The waiters in a child process; this process holds the key and records the outcome."""
    async with Guard(url) as guard:
        started, finish = asyncio.Event(), asyncio.Event()

        @guard.once(key=["order_id"])
        async def charge(order_id: str) -> dict[str, Any]:
            started.set()
            await finish.wait()
            return RESULT

        t = f"wait-{uuid.uuid4().hex[:8]}"
        with task(t):
            holder = asyncio.create_task(charge("o-1"))
            await started.wait()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent.parent),
                                                                            os.environ.get("PYTHONPATH")]))}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "benchmarks._load", url, t, str(waiters), stdout=subprocess.PIPE, env=env)
            assert proc.stdout is not None
            assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"waiting"
            await asyncio.sleep(hold)
            finish.set()
            await holder
            done_at = time.time()
            report = json.loads(await asyncio.wait_for(proc.stdout.readline(), 120))
            await proc.wait()
    return {"waiters": waiters, "hold_s": hold, "statements": report["statements"],
            "lag_ms": round((report["returned"] - done_at) * 1000, 2)}


# -- sweeps ----------------------------------------------------------------------------------------------------

async def _fill_expired(url: str, n: int) -> None:
    """``n`` records past their retention (the sweep's work), written behind the store's back."""
    now = time.time()
    rows = [("default", f"ag_x{uuid.uuid4().hex}{i:08d}"[:51], "bulk", "op", "f" * 64, "{}", "succeeded", i, i,
             "op", None, 1, None, None, now - 10, now - 9, now - 3600, '{"a":1}', None) for i in range(n)]
    cols = ("scope, key, task_id, operation, fingerprint, arg_hashes, state, fence, origin, tool, arguments,"
            " attempts, owner, lease_until, created_at, updated_at, expires_at, result, audit")
    if url.startswith("sqlite"):
        import sqlite3

        db = sqlite3.connect(url.split("///", 1)[1], isolation_level=None)
        db.execute("BEGIN")
        db.executemany(f"INSERT INTO agentguard_calls ({cols}) VALUES ({', '.join('?' * 19)})", rows)
        db.execute("COMMIT")
        db.close()
        return
    import asyncpg  # type: ignore[import-untyped]

    from ._drivers import dsn_of

    conn = await asyncpg.connect(dsn_of(url))
    try:
        await conn.copy_records_to_table("agentguard_calls", records=rows, columns=[c.strip() for c in cols.split(",")])
    finally:
        await conn.close()


async def _claims(guard: Guard, rid: str, until: Callable[[], bool]) -> list[float]:
    """Distinct first calls, one after another, until ``until()``: each call's latency in ms."""
    @guard.once(key=["order_id"], operation="claim")
    async def charge(order_id: str) -> dict[str, Any]:
        return RESULT

    lat: list[float] = []
    with task(f"sweep-{rid}"):
        while not until() or len(lat) < 100:
            t = time.perf_counter()
            await charge(f"o-{len(lat)}")
            lat.append((time.perf_counter() - t) * 1000)
    return lat


def _p99(lat: list[float]) -> float:
    return statistics.quantiles(lat, n=100)[98]


async def sweeps(url: str, expired: int, reps: int, log: Log) -> dict[str, Any]:
    """Claims' p99 during a sweep of ``expired`` records ÷ their p99 with none (the sweep in another
    connection of another guard, as another process's would be). Each rep fills the records, then runs a
    window of claims for the whole sweep and a window of as long with none, in alternating order (an odd rep
    measures "none" first, as long as the previous sweep took): the machine's drift falls on both sides alike.
    Per-rep ratios and their median; the sweep's total time (its bound for ``expired`` records)."""
    kw = {"sqlite_synchronous": "OFF"} if url.startswith("sqlite") else {}
    reps = max(reps, 3)
    during: list[float] = []
    none: list[float] = []
    rates: dict[str, list[float]] = {"during": [], "none": []}
    swept_s: list[float] = []
    async with Guard(url, **kw) as guard, Guard(url, **kw) as sweeper:
        await guard.ensure_schema()
        await _claims(guard, "warm", lambda: True)
        last = 2.0
        for rep in range(reps):
            rid = uuid.uuid4().hex[:8]
            await _fill_expired(url, expired)

            async def quiet(seconds: float, rid: str = rid) -> None:
                stop = time.perf_counter() + seconds
                lat = await _claims(guard, rid + "n", lambda: time.perf_counter() > stop)
                none.append(_p99(lat))
                rates["none"].append(len(lat) / seconds)

            if rep % 2:
                await quiet(last)
            log(f"  sweep of {expired} expired records, rep {rep + 1}")
            t0 = time.perf_counter()
            sweeping = asyncio.create_task(sweeper.sweep())
            lat = await _claims(guard, rid + "d", sweeping.done)
            deleted = await sweeping
            last = time.perf_counter() - t0
            assert deleted >= expired, (deleted, expired)
            swept_s.append(last)
            during.append(_p99(lat))
            rates["during"].append(len(lat) / last)
            if not rep % 2:
                await quiet(last)
    ratios = [d / n for d, n in zip(during, none, strict=True)]
    return {"expired": expired, "p99_ms_during": [round(x, 2) for x in during],
            "p99_ms_none": [round(x, 2) for x in none], "ratios": [round(r, 2) for r in ratios],
            "ratio": statistics.median(ratios), "sweep_s": [round(x, 2) for x in swept_s],
            "claims_per_s_during": round(statistics.median(rates["during"])),
            "claims_per_s_none": round(statistics.median(rates["none"]))}


async def empty_sweep(url: str, big: int, log: Log) -> dict[str, Any]:
    """A sweep with nothing to delete on ``big`` live records ÷ on 200, each in a database of its own, both
    open at once and measured in alternating rounds (5 rounds of 9 sweeps each; the median of each side)."""
    from ._drivers import pg_exec, with_db

    kw = {"sqlite_synchronous": "OFF"} if url.startswith("sqlite") else {}
    sizes = (200, big)
    where, names = {}, {}
    for n in sizes:
        names[n] = name = f"agentguard_sweep_{n}_{uuid.uuid4().hex[:6]}"
        if url.startswith("sqlite"):
            where[n] = url.replace(".db", f"-{name}.db")
        else:
            await pg_exec(url, f"CREATE DATABASE {name}")
            where[n] = with_db(url, name)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    try:
        async with Guard(where[200], **kw) as small, Guard(where[big], **kw) as large:
            guards = {200: small, big: large}
            for n in sizes:
                await guards[n].ensure_schema()
                await _fill_live(where[n], n)
                await guards[n].sweep()
            for rnd in range(5):
                for n in sizes if rnd % 2 else sizes[::-1]:
                    for _ in range(9):
                        t = time.perf_counter()
                        await guards[n].sweep()
                        times[n].append((time.perf_counter() - t) * 1000)
    finally:
        if not url.startswith("sqlite"):
            for n in sizes:
                await pg_exec(url, f"DROP DATABASE IF EXISTS {names[n]} WITH (FORCE)")
    out = {n: statistics.median(times[n]) for n in sizes}
    for n in sizes:
        log(f"  empty sweep on {n} records: {out[n]:.3f} ms")
    return {"records": big, "ms_small": round(out[200], 3), "ms_big": round(out[big], 3),
            "ratio": out[big] / out[200]}


async def _fill_live(url: str, n: int) -> None:
    now = time.time()
    rows = [("default", f"ag_l{uuid.uuid4().hex}{i:08d}"[:51], "bulk", "op", "f" * 64, "{}", "succeeded", i, i,
             "op", None, 1, None, None, now, now, now + 86400, '{"a":1}', None) for i in range(n)]
    cols = ["scope", "key", "task_id", "operation", "fingerprint", "arg_hashes", "state", "fence", "origin", "tool",
            "arguments", "attempts", "owner", "lease_until", "created_at", "updated_at", "expires_at", "result",
            "audit"]
    if url.startswith("sqlite"):
        import sqlite3

        db = sqlite3.connect(url.split("///", 1)[1], isolation_level=None)
        db.execute("BEGIN")
        db.executemany(f"INSERT INTO agentguard_calls ({', '.join(cols)}) VALUES ({', '.join('?' * 19)})", rows)
        db.execute("COMMIT")
        db.close()
        return
    import asyncpg

    from ._drivers import dsn_of

    conn = await asyncpg.connect(dsn_of(url))
    try:
        await conn.copy_records_to_table("agentguard_calls", records=rows, columns=cols)
        await conn.execute("ANALYZE agentguard_calls")
    finally:
        await conn.close()


# -- the mode --------------------------------------------------------------------------------------------------

PARTS = ("callers", "waiters", "sweeps", "writers")


async def load(sqlite_dir: Path | None, pg_url: str | None, *, seconds: float, reps: int, log: Log,
               parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if pg_url and "callers" in parts:
        for n in (64, 256):
            log(f"== load: {n} callers on the default Guard and on a raw pool of 30 (Postgres)")
            doc[f"postgres callers {n}"] = await callers(pg_url, n, seconds, reps, log)
    for backend, url in (("sqlite", sqlite_dir and f"sqlite+aiosqlite:///{sqlite_dir / 'load.db'}"),
                         ("postgres", pg_url)):
        if not url:
            continue
        if "waiters" in parts:
            log(f"== load: waiters ({backend})")
            doc[f"{backend} waiters in-process"] = [await waiters_in_process(url, w, 1.0) for w in (4, 64)]
            if backend == "postgres":
                doc[f"{backend} waiters elsewhere"] = [await waiters_elsewhere(url, w, 1.0) for w in (4, 64)]
        if "sweeps" not in parts:
            continue
        log(f"== load: sweeps ({backend})")
        doc[f"{backend} sweep during claims"] = await sweeps(url, 100_000, reps, log)
        doc[f"{backend} empty sweep"] = await empty_sweep(url, 300_000, log)
    if sqlite_dir is not None and "writers" in parts:
        from ._writers import writers

        for n in (4, 8):
            log(f"== load: {n} writer processes on one SQLite file, {seconds:g} s")
            doc[f"sqlite writers {n}"] = await writers(sqlite_dir, n, seconds)
    return doc


def _cpus(windows: list[dict[str, Any]]) -> str:
    client = statistics.median(w["client_cpu_us"] for w in windows)
    server = [w["server_cpu_us"] for w in windows if w.get("server_cpu_us") is not None]
    return f"{client:.0f} / {statistics.median(server):.0f}" if server else f"{client:.0f} / (not seen)"


def load_table(doc: dict[str, Any]) -> str:
    lines = ["== Load (--load): side by side; targets from issues 21 and 34"]
    for name, v in doc.items():
        if "callers" in name:
            a = v["agentguard"]
            shares = ", ".join(f"{w['min']}/{w['median']:g}/{w['max']}" for w in a)
            spread = max((w["spread"] for w in a if w.get("spread") is not None), default=None)
            lines.append(f"{name}: throughput {v['throughput_ratio']:.2f}× the raw pool's (per window"
                         f" {', '.join(f'{r:.2f}' for r in v['ratios'])}; target ≥ 1.0, issue 34); agentguard"
                         f" calls per caller min/median/max {shares}"
                         + ("" if spread is None else f", every caller within {spread:.0%} of the median (target"
                            " 15%)") + ","
                         f" errors {sum(w['errors'] for w in a)}, worst {max(w['worst_s'] for w in a):.3f} s,"
                         f" fair {all(w['fair'] for w in a)}; raw pool worst"
                         f" {max(w['worst_s'] for w in v['raw pool']):.3f} s; CPU per call, this process /"
                         f" the server (µs, median of windows): agentguard {_cpus(a)}, raw pool"
                         f" {_cpus(v['raw pool'])}")
        elif "waiters" in name:
            lines.append(f"{name}: " + "; ".join(f"{w['waiters']} waiters: {w['statements']} statements after"
                                                 f" arriving, last returned {w['lag_ms']:.1f} ms after the"
                                                 " completion" for w in v))
        elif "during" in name:
            lines.append(f"{name}: claims' p99 during a sweep of {v['expired']} expired ÷ with none"
                         f" {v['ratio']:.2f}× (median; per rep {v['ratios']}; during {v['p99_ms_during']} ms,"
                         f" none {v['p99_ms_none']} ms; target ≤ 2); claims/s during {v['claims_per_s_during']},"
                         f" none {v['claims_per_s_none']}; the sweep took {v['sweep_s']} s")
        elif "writers" in name:
            lines.append(f"{name} processes x 8 coroutines at NORMAL: {v['calls_per_s']} calls/s, p99"
                         f" {v['p99_ms']} ms, worst {v['worst_ms']} ms, shares {v['shares']} (max ÷ min"
                         f" {v['spread']})")
        elif "empty" in name:
            lines.append(f"{name}: nothing to delete on {v['records']} records {v['ms_big']:.2f} ms ÷ on 200"
                         f" {v['ms_small']:.2f} ms = {v['ratio']:.2f}×")
    return "\n".join(lines)


async def _child(url: str, task_id: str, waiters: int) -> None:
    asked, returned = await _wait_here(url, task_id, waiters, lambda: print("waiting", flush=True))
    print(json.dumps({"statements": asked, "returned": returned}), flush=True)


if __name__ == "__main__":
    asyncio.run(_child(sys.argv[1], sys.argv[2], int(sys.argv[3])))
