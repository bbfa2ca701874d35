"""The `agentguard` command: the demo end to end, ls and sweep, as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BACKEND

pytestmark = pytest.mark.slow


def agentguard(*args: str, cwd: Path, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("AGENTGUARD_URL", None)
    if url:
        env["AGENTGUARD_URL"] = url
    return subprocess.run([sys.executable, "-m", "agentguard.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(BACKEND != "sqlite", reason="the demo runs on the embedded SQLite default")
def test_demo_on_the_embedded_default(tmp_path: Path) -> None:
    for _ in range(2):  # re-runnable: each run is its own task
        out = agentguard("demo", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "OK: 3 charges for 3 orders" in out.stdout
        assert "worker exited with signal 9" in out.stdout and "refused, nothing executed" in out.stdout
    assert (tmp_path / "agentguard.db").exists()
    listed = agentguard("ls", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.count("succeeded") == 6


def test_ls_and_sweep(store_url: str, tmp_path: Path) -> None:
    assert "no records" in agentguard("ls", cwd=tmp_path, url=store_url).stdout
    swept = agentguard("sweep", "--batch", "10", cwd=tmp_path, url=store_url)
    assert swept.returncode == 0 and "deleted 0 expired records" in swept.stdout


def test_bad_url_is_a_clear_error(tmp_path: Path) -> None:
    out = agentguard("ls", cwd=tmp_path, url="mysql://nope/db")
    assert out.returncode == 1 and "unsupported store URL" in out.stderr and "Traceback" not in out.stderr
