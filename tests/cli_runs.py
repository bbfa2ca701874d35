"""The `agentguard` command as a user runs it, and a store with records in it: shared by the command's tests
(``tests/core/test_cli.py`` and its neighbours, ``tests/stores/test_ledger_chain.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentguard import Guard, task


def run(*args: str, cwd: Path, env: dict[str, str] | None = None, stdout: Any = subprocess.PIPE,
        code: str | None = None) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it (or ``code`` run with ``python -c``, for an import blocked first)."""
    full = {k: v for k, v in os.environ.items() if k != "AGENTGUARD_URL"} | (env or {})
    argv = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "agentguard.cli", *args]
    return subprocess.run(argv, cwd=cwd, env=full, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)


def record(url: str, *, scope: str = "default", task_id: str = "t-1", n: int = 1) -> None:
    """Put ``n`` succeeded records of one task into the store at ``url``."""
    guard = Guard(url)

    @guard.once(key=["i"])
    def step(i: int) -> int:
        return i

    with task(task_id, scope=scope):
        for i in range(n):
            step(i)
    guard.close()
