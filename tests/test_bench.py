"""The benchmark harness still works: ``python -m benchmarks --quick`` on this test run's backend.

Only deterministic things are asserted: it exits 0, prints its tables and targets, writes its JSON, and on
Postgres the durability counts are exact (2 commits per first call, 0 per replay). Never a time or a ratio:
this machine is shared and its fsync latency flips between ~0.2 ms and ~4 ms.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import BACKEND, ROOT


def test_quick_benchmark_runs(store_url: str, tmp_path: Path, python: str) -> None:
    out = tmp_path / "bench.json"
    cmd = [python, "-m", "benchmarks", "--quick", "--only", BACKEND, "--json", str(out)]
    if BACKEND == "postgres":
        cmd += ["--pg-url", store_url]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]

    text = proc.stdout
    assert "agentguard benchmark" in text
    assert "== Targets (issue 7)" in text
    title = "== SQLite WAL" if BACKEND == "sqlite" else "== PostgreSQL"
    assert title in text
    for variant in ("agentguard: first call", "agentguard: replay", "agentguard: cached replay", "unguarded call"):
        assert variant in text
    assert "INVALID" not in text  # a replay ran its body, or a first call did not

    doc = json.loads(out.read_text())
    assert {t["result"] for t in doc["targets"]} <= {"PASS", "FAIL", "n/a"}
    group = doc["groups"][f"{BACKEND}.sequential"]
    names = {v["name"] for v in group["variants"]}
    assert {"agentguard: first call", "agentguard: replay"} <= names

    if BACKEND == "postgres":
        counts = doc["postgres_counts"]
        assert counts["agentguard: first call"]["commits"] == 2
        assert counts["agentguard: replay"]["commits"] == 0
        assert counts["raw asyncpg: claim + complete"]["commits"] == 2
        assert counts["agentguard: first call"]["body_runs"] > 0
        assert counts["agentguard: replay"]["body_runs"] == 0
        cached = counts.get("agentguard: cached replay", {})
        if "commits" in cached:
            assert cached["commits"] == 0
            assert cached["transactions"] in (0, None)  # served in process: no round trip at all
