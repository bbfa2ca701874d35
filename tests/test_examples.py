"""Every example under examples/ runs offline and ends well (they stay true as the code changes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BACKEND, ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(BACKEND != "sqlite", reason="examples run on their embedded SQLite default"),
]


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "multistep_ride.py"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTGUARD_")}
    out = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
