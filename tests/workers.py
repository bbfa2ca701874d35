"""Worker processes (``tests/proc_worker.py``) a test starts, releases together, SIGKILLs or lets finish: shared by
the tests of the guarantee across processes (``tests/core/test_processes.py`` and the whitebox tests beside it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKER = str(Path(__file__).with_name("proc_worker.py"))


class Worker:
    def __init__(self, url: str, task_id: str, effects: Path, mode: str, **opts: Any) -> None:
        argv = [sys.executable, WORKER, url, task_id, str(effects), mode]
        for k, v in opts.items():
            argv += [f"--{k.replace('_', '-')}"] if v is True else [f"--{k.replace('_', '-')}", str(v)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None

    def expect(self, line: str) -> None:
        assert self.proc.stdout is not None
        got = self.proc.stdout.readline().strip()
        assert got == line, f"worker said {got!r}, expected {line!r}"

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=30)  # reaps it and closes the pipes

    def result(self) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=90)
        assert self.proc.returncode == 0, out
        parsed: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return parsed


def effects_of(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def release_together(workers: list[Worker]) -> None:
    for w in workers:
        w.expect("ready")  # every process is warm (imported, connected, schema ready)
    for w in workers:
        w.go()


def killed_mid_body(store_url: str, t: str, effects: Path, **opts: Any) -> None:
    """A worker SIGKILLed inside the body, after its side effect: its claim is left running, its lease runs out."""
    victim = Worker(store_url, t, effects, "hang", lease=1.0, sleep=60, **opts)
    release_together([victim])
    victim.expect("started")
    victim.kill()


def survive(store_url: str, t: str, effects: Path, **opts: Any) -> dict[str, Any]:
    survivor = Worker(store_url, t, effects, "once", lease=1.0, **opts)
    release_together([survivor])
    return survivor.result()
