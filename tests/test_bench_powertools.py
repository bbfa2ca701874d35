"""The optional Powertools peer of the benchmark runs, when its packages and ``redis-server`` are here.

Offline: the peer starts its own throwaway redis-server on loopback. Only deterministic things are
asserted (it prints its numbers, no replay ran its body, redis-server is gone afterwards); never a time.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
from pathlib import Path

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_powertools_peer_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = [m for m in ("aws_lambda_powertools", "redis", "boto3") if importlib.util.find_spec(m) is None]
    if shutil.which("redis-server") is None:
        missing.append("redis-server")
    if missing:
        pytest.skip(f"the Powertools peer needs {', '.join(missing)} (pip install -e '.[bench]'; a redis-server)")
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import _peers

    out = _peers.powertools(f"sqlite+aiosqlite:///{tmp_path / 'peer.db'}", calls=5, reps=1)
    assert "unavailable" not in out, out
    assert out["invalid"] == [], out
    for key in ("powertools_first_call_us", "powertools_replay_us", "agentguard_first_call_us",
                "agentguard_replay_us", "ratio_first_call", "ratio_replay"):
        assert out[key] > 0, out
    assert isinstance(out["pass"], bool)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", out["redis_port"]), timeout=2):
        pass  # the peer's redis-server is stopped
