"""The optional Powertools peer of the benchmark runs, when its packages and ``redis-server`` are here.

Offline: the peer starts its own throwaway redis-server on loopback. Only deterministic things are
asserted (both variants ran, the first call ran its body each time, a replay never, redis-server is gone
afterwards); never a time.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import shutil
import socket

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_powertools_peer_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = [m for m in ("aws_lambda_powertools", "redis", "boto3") if importlib.util.find_spec(m) is None]
    if shutil.which("redis-server") is None:
        missing.append("redis-server")
    if missing:
        pytest.skip(f"the Powertools peer needs {', '.join(missing)} (pip install --group bench; a redis-server)")
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks._harness import run_group
    from benchmarks._peers import powertools

    notes: list[str] = []
    with powertools(notes) as peers:
        stats = asyncio.run(run_group([v for v, _ in peers], n=5, reps=1, warmup=2))
    assert all(s.ok for s in stats.values()), stats
    (_, first), (_, replay) = peers
    assert (first.runs, replay.runs) == (2 + 5, 0)
    port = re.search(r"port (\d+)", notes[0])
    assert port is not None, notes
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(port.group(1))), timeout=2):
        pass  # the peer's redis-server is stopped
