"""The benchmark harness still works: ``python -m benchmarks --quick`` on this test run's backend.

Only deterministic things are asserted: it exits 0, prints its tables and targets, writes its JSON, and on
Postgres the durability counts are exact (2 commits per first call, 0 per replay). Never a time or a ratio:
this machine is shared and its fsync latency flips between ~0.2 ms and ~4 ms.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import asyncpg
import pytest

from benchmarks import _load, _race
from benchmarks._drivers import dsn_of

from conftest import BACKEND, ROOT

# On Postgres it needs the server to itself: its transaction ids and WAL counters are the cluster's, and other
# tests' would count. On SQLite it counts nothing shared, and runs beside the others.
_serial_on_postgres = pytest.mark.serial if BACKEND == "postgres" else pytest.mark.slow


@_serial_on_postgres
def test_quick_benchmark_runs(store_url: str, tmp_path: Path, python: str) -> None:
    out = tmp_path / "bench.json"
    cmd = [python, "-m", "benchmarks", "--quick", "--only", BACKEND, "--json", str(out), "--slices", "3"]
    if BACKEND == "postgres":
        cmd += ["--pg-url", store_url]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]

    text = proc.stdout
    assert "agentguard benchmark" in text
    assert "== Targets" in text
    assert ("== SQLite WAL" if BACKEND == "sqlite" else "== PostgreSQL") in text
    assert "== No I/O" in text and "== Pure shortcuts" in text
    assert "INVALID" not in text  # a replay ran its body, or a first call did not

    doc = json.loads(out.read_text())
    assert {t["result"] for t in doc["targets"]} <= {"PASS", "FAIL", "n/a"}
    assert doc["meta"]["config"]["slices"] == 3  # (one caller's calls of a rep in 3 slices, as asked)
    # Every group ran every variant (a variant whose set-up failed would say n/a, with the reason).
    for key in ("no_io", "observe", "shortcuts", f"{BACKEND}.sequential"):
        assert all("unavailable" not in v for v in doc["groups"][key]["variants"]), doc["groups"][key]
    names = {v["name"] for v in doc["groups"][f"{BACKEND}.sequential"]["variants"]}
    assert {"unguarded call", "agentguard: first call", "agentguard: replay", "agentguard: replay, first of its task",
            "agentguard: cached replay", "store only (SQLStore): claim + complete",
            "agentguard, the state machine alone: replay"} <= names
    if BACKEND == "postgres":  # a sync tool, beside the driver on its own thread (psycopg, as its statements are)
        assert {"raw psycopg: claim + complete", "raw psycopg: SELECT", "agentguard: sync tool, first call",
                "agentguard: sync tool, replay"} <= names
        assert {"pg_first_sync", "pg_replay_sync"} <= {t["id"] for t in doc["targets"]}, doc["targets"]
    # What each path asked of the store, observed through a recording store passed with Guard(store=...): a
    # replay right after a replay in the same task asks its claim as likely taken on Postgres (the store then
    # reads first: a read is cheaper than an insert that finds the key there); a cached replay asks nothing.
    verbs = doc["groups"][f"{BACKEND}.sequential"]["verbs"]
    assert verbs["first call"] == ["claim", "complete"] and verbs["replay"] == ["claim"], verbs
    assert verbs["replay after a replay"] == (["claim (likely taken)"] if BACKEND == "postgres" else ["claim"]), verbs
    assert verbs["cached replay"] == [], verbs

    if BACKEND == "postgres":
        counts = doc["postgres_counts"]

        def commits(name: str) -> float:
            row = counts[name]
            # Transaction ids are cluster-wide: on a server shared with other clients the harness may not
            # get two agreeing measurements; then the per-database count of rows written stands in (each
            # of the guard's write statements is its own autocommit transaction).
            return float(row["rows_written"] if row["noisy"] else row["commits"])

        assert commits("raw asyncpg: claim + complete") == 2, counts
        assert commits("agentguard: first call") == 2, counts
        assert commits("agentguard: replay") == 0, counts
        assert counts["agentguard: first call"]["body_runs"] > 0, counts
        assert counts["agentguard: replay"]["body_runs"] == 0, counts
        assert commits("agentguard: cached replay") == 0, counts
        assert counts["agentguard: cached replay"]["transactions"] in (0, None), counts  # no round trip


@pytest.mark.postgres
def test_the_load_harness_runs_and_counts_each_sides_cpu(store_url: str, tmp_path: Path, python: str) -> None:
    """``--load --load-only callers`` in short windows: every caller served without an error on both sides,
    and the CPU per call counted for this process and for the (local) server, found from a backend's parent."""
    out = tmp_path / "load.json"
    cmd = [python, "-m", "benchmarks", "--load", "--load-only", "callers", "--only", "postgres", "--pg-url",
           store_url, "--load-seconds", "1", "--reps", "1", "--no-pin", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CPU per call, this process / the server" in proc.stdout and "(not seen)" not in proc.stdout
    doc = json.loads(out.read_text())["load"]
    assert set(doc) == {"postgres callers 64", "postgres callers 256"}
    for run in doc.values():
        for side in ("agentguard", "raw pool"):
            (window,) = run[side]
            assert window["errors"] == 0 and window["min"] >= 1, window
            assert window["client_cpu_us"] > 0 and window["server_cpu_us"] > 0, window


@pytest.mark.postgres
@pytest.mark.anyio
async def test_the_servers_cpu_keeps_what_a_closed_connection_spent(store_url: str) -> None:
    """``--load`` counts the server's CPU as the postmaster's, its live children's and its ended children's
    (``cutime``): a connection closed inside a window keeps what it spent there, so a side that closes
    connections (the guard's lane gives idle ones back) is not counted cheaper than it was."""
    postmaster = await _load._postmaster(store_url)
    assert postmaster is not None  # the test run's server is local
    conn = await asyncpg.connect(dsn_of(store_url))
    pid = await conn.fetchval("SELECT pg_backend_pid()")

    def own() -> int:
        fields = _load._stat(pid)
        assert fields is not None
        return int(fields[11]) + int(fields[12])

    before = _load._cpu(postmaster)[1]
    own0 = own()
    await conn.fetchval("SELECT count(*) FROM generate_series(1, 5000000)")
    spent = own() - own0
    await conn.close()
    for _ in range(1000):  # until the postmaster has reaped it (its CPU then in the postmaster's cutime)
        if _load._stat(pid) is None:
            break
        await asyncio.sleep(0.01)
    after = _load._cpu(postmaster)[1]
    assert before is not None and after is not None
    assert spent > 0
    assert round((after - before) * os.sysconf("SC_CLK_TCK")) >= spent


@pytest.mark.slow
def test_the_scale_benchmark_runs(store_url: str, tmp_path: Path, python: str) -> None:
    """``python -m benchmarks.scale`` at one small size on this run's backend: it fills the records and as many
    ledger entries, measures, reads the counters (Postgres) or the plans (SQLite), and finds nothing read whole.
    The ratios are printed, never asserted."""
    out = tmp_path / "scale.json"
    cmd = [python, "-m", "benchmarks.scale", "--only", BACKEND, "--sizes", "10k", "--calls", "10", "--reps", "1",
           "--json", str(out)]
    if BACKEND == "postgres":
        cmd += ["--url", store_url]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "== Scale" in proc.stdout and "nothing read whole at 10k" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    (doc,) = json.loads(out.read_text())
    (size,) = doc["sizes"].values()
    if BACKEND == "postgres":
        assert size["seq_rows_read"] == 0 and size["index_scans"] > 0, size
        assert size["index_rows_fetched"] <= 2 * size["index_scans"], size
    else:
        assert size["whole_table_reads"] == [], size
    assert size["swept"] == 0  # (every record is retained for a day)
    assert size["ledger_filled"] == 10_000  # (as many ledger entries as records, in the table)


@pytest.mark.serial  # (it sets synchronous_commit on the test's database while it runs)
@pytest.mark.skipif(BACKEND != "postgres", reason="measures round trips to Postgres: runs in the Postgres pass")
def test_the_interleaved_benchmark_runs(store_url: str, python: str) -> None:
    """``python -m benchmarks.interleaved`` on a small run: every variant measured, each ratio printed, and the
    guarded calls each ran their body once (the script checks it and exits otherwise). No time is asserted."""
    cmd = [python, "-m", "benchmarks.interleaved", "--url", store_url, "--calls", "16", "--reps", "2", "--warmup", "4"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for variant in ("guard's own work, between round trips (ledger kept)", "guard's own work, back to back",
                    "fixed Python piece, between round trips", "fixed Python piece, back to back"):
        assert any(line.startswith(variant) and float(line.split()[-1]) > 0 for line in lines), proc.stdout
    assert sum("between round trips ÷ back to back" in line for line in lines) == 3, proc.stdout


@pytest.mark.serial  # (it sets synchronous_commit on the test's database while it runs)
@pytest.mark.skipif(BACKEND != "postgres", reason="measures round trips to Postgres: runs in the Postgres pass")
def test_the_inline_ledger_benchmark_runs(store_url: str, python: str) -> None:
    """``python -m benchmarks.ledger_inline`` on a small run: every variant measured beside the floor, and before
    the report every call left its entry and the chained variants' chains verify (the script checks both and exits
    otherwise). No time is asserted."""
    cmd = [python, "-m", "benchmarks.ledger_inline", "--url", store_url, "--calls", "24", "--reps", "2",
           "--warmup", "4"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for variant in ("floor: claim + complete", "entry in the completion's statement, not chained",
                    "entry in the completion's statement, chained", "the writer's batches as shipped",
                    "the writer's batches, COPY only"):
        assert any(line.startswith(variant) and "µs" in line and "×" in line for line in lines), proc.stdout


@pytest.mark.storeless  # (SQLite only: its floor is stdlib sqlite3 on a file of its own)
@pytest.mark.slow
def test_the_least_guard_benchmark_runs(python: str) -> None:
    """``python -m benchmarks.least`` on a small run: the least guard's key and fingerprint are agentguard's for
    every record (the script checks them and exits otherwise), no replay ran a body, and every variant's ratio to
    the floor and agentguard's work beyond the least guard are printed. No time or ratio is asserted."""
    cmd = [python, "-m", "benchmarks.least", "--calls", "16", "--reps", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for variant in ("floor:", "least guard:", "agentguard: sync tool replay", "agentguard: async tool replay",
                    "  its store alone:", "  its state machine:", "  its call without the ledger:"):
        assert any(line.startswith(variant) and "×" in line for line in lines), proc.stdout
    assert sum("its own work beyond the least guard's" in line for line in lines) == 2, proc.stdout
    assert any(line.startswith("an async tool's replay by layer") and "of which the ledger's entry" in line
               and "the limit leaves" in line for line in lines), proc.stdout
    assert any(line.startswith("the issue's limit for a replay: 1.5×") for line in lines), proc.stdout


@pytest.mark.storeless
def test_the_digests_benchmark_runs(python: str) -> None:
    """``python -m benchmarks.digests`` on a small run: both digests give the same results (the script checks it
    and fails otherwise), and a row is printed for each argument length with a time for each digest. No time or
    ratio is asserted."""
    cmd = [python, "-m", "benchmarks.digests", "--calls", "20", "--reps", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[1:2] == ["characters"]]
    assert [int(r[0]) for r in rows] == [20, 300, 2000], proc.stdout
    assert all(float(r[2]) > 0 for r in rows), proc.stdout


@pytest.mark.storeless
def test_the_ledger_batch_benchmark_runs(python: str) -> None:
    """``python -m benchmarks.ledger_batch`` on a small run: every way stored the same rows (the script compares
    its files and fails otherwise), and a row is printed for each way with a time alone and beside the caller, the
    caller's pace and its time lost. No time or ratio is asserted."""
    cmd = [python, "-m", "benchmarks.ledger_batch", "--batches", "2", "--size", "70"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = {line[:28].strip(): line[28:].split() for line in proc.stdout.splitlines()[2:-1]}
    assert list(rows) == ["executemany", "insert_rows", "insert_rows, plain INSERT"], proc.stdout
    assert all(len(r) == 4 and float(r[0]) > 0 and float(r[1]) > 0 and float(r[3]) >= 0 for r in rows.values()), (
        proc.stdout)
    assert "the same rows stored by every way" in proc.stdout


@pytest.mark.storeless  # (SQLite only: the race's stores are files of its own)
@pytest.mark.slow
def test_the_race_runs_on_grown_stores(python: str, tmp_path: Path) -> None:
    """``python -m benchmarks --race --only sqlite --reps 1``: at ``FULL`` and at ``NORMAL`` every store (agentguard's,
    agent-once's and the stdlib ``sqlite3`` floor's) is grown first, in chunks, and its first calls in the growth are
    timed apart; the bodies ran once per first call, the growth's included, and never for a replay (the race checks
    it: ``valid``); and every target of the race is judged. No time or ratio is asserted."""
    out = tmp_path / "race.json"
    cmd = [python, "-m", "benchmarks", "--race", "--only", "sqlite", "--reps", "1", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    race = json.loads(out.read_text())["race"]
    assert sorted(race) == ["agent_once", "sqlite FULL", "sqlite NORMAL"], race
    for level in ("sqlite FULL", "sqlite NORMAL"):
        got = race[level]
        assert got["valid"] is True, got["runs"]
        fresh = got["fresh store"]
        assert fresh["calls"] == _race.FRESH
        assert sorted(fresh["grown"]) == sorted(fresh["us"]) == ["agent-once", "agentguard", "stdlib sqlite3"], fresh
        assert all(n >= _race.FRESH and n % _race.GROW_CHUNK == 0 for n in fresh["grown"].values()), fresh
        assert all(us > 0 for us in fresh["us"].values()), fresh
        ratios = [v for v in got.values() if isinstance(v, dict) and "ratios" in v]
        assert len(ratios) == 10 and all(len(r["ratios"]) == 1 and r["ratio"] > 0 for r in ratios), got
    targets = {t["id"]: t["result"] for t in json.loads(out.read_text())["targets"]}
    assert len(targets) == 16 and set(targets.values()) <= {"PASS", "FAIL"}, targets
    assert all(level in proc.stdout for level in ("sqlite FULL", "sqlite NORMAL", "fresh store")), proc.stdout


@pytest.mark.storeless
@pytest.mark.parametrize("slices", ["0", "-2", "x"])
def test_a_bad_number_of_slices_is_refused_before_anything_runs(python: str, slices: str) -> None:
    """``--slices`` takes a whole number, 1 or more; anything else is refused by name (exit 2), nothing started."""
    proc = subprocess.run([python, "-m", "benchmarks", "--slices", slices], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"argument --slices: {slices!r} is not a number of slices (a whole number, 1 or more)" in proc.stderr
    assert "==" not in proc.stdout + proc.stderr  # (no group was started)

