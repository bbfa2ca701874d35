"""Every example under examples/ runs offline, ends well and prints only its story (they stay true as the code
changes); each says which extra it needs and how to run it."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BACKEND, OWN_VIRTUALENV, ROOT, framework_absent

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(BACKEND != "sqlite", reason="examples run on their embedded SQLite default"),
]


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "multistep_ride.py"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path: Path, tmp_path: Path) -> None:
    for module in OWN_VIRTUALENV:
        if path.name.startswith(f"{module}_") and framework_absent(module):
            pytest.skip(f"{module} is not installed here: scripts/test.sh runs this example in a virtualenv of its own")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTGUARD_")}
    out = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    # Quiet: no library's log lines or warnings (they go to stderr), and no log-like line in the story either.
    assert out.stderr == "", out.stderr
    assert not LOG_LINE.search(out.stdout), out.stdout


LOG_LINE = re.compile(r"^.*\b(DEBUG|INFO|WARNING|WARN)\b.*$", re.MULTILINE)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_says_what_it_needs_and_how_to_run_it(path: Path) -> None:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    assert f"python examples/{path.name}" in doc, doc
    dist = "agentguard-idempotency"  # the distribution's name on the index
    needs = rf"^Needs (no extra|the [a-z0-9, -]+ extras?):\s+pip install ({dist}|'{dist}\[[a-z0-9,-]+\]')"
    assert re.search(needs, doc, re.MULTILINE), doc
