"""One sync per durable first call on SQLite: the claim's commit does not sync the WAL, the completion's does
(covering the claim's frames), and a replay syncs nothing. Counted with ``strace`` on a real process writing a
real file at ``synchronous=FULL``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BACKEND

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(BACKEND != "sqlite", reason="SQLite's syncs: runs once, in the SQLite pass"),
]

SCRIPT = """
import asyncio, sys
from pathlib import Path
from agentguard import Guard, task

async def main() -> None:
    folder = Path(sys.argv[1])
    guard = Guard(f"sqlite+aiosqlite:///{folder / 'agentguard.db'}", cache_size=0)  # FULL, the default

    @guard.once(key=["order_id"])
    async def charge(order_id: str) -> str:
        return order_id

    with task("warm"):
        await charge("warm")  # the schema, the WAL, the first connections
    for phase in ("first", "replay"):
        (folder / f"mark-{phase}").touch()
        with task("t"):
            for i in range(20):
                assert await charge(f"o-{i}") == f"o-{i}"
    (folder / "mark-end").touch()
    await guard.aclose()
    async with Guard(f"sqlite+aiosqlite:///{folder / 'agentguard.db'}") as reader:
        print(len(await reader.attempts()))  # the ledger was kept meanwhile (its commits unsynced)

asyncio.run(main())
"""


def test_a_first_call_syncs_once_and_a_replay_never(tmp_path: Path) -> None:
    strace = shutil.which("strace")
    assert strace, "strace is needed to count syncs (scripts/test.sh installs it)"
    trace = tmp_path / "trace.txt"
    run = subprocess.run([strace, "-f", "-qq", "-e", "trace=fsync,fdatasync,openat", "-o", str(trace),
                          sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    phase, syncs = "warm", {"warm": 0, "first": 0, "replay": 0, "end": 0}
    for line in trace.read_text().splitlines():
        if "openat(" in line:
            for name in ("first", "replay", "end"):
                if f"mark-{name}" in line:
                    phase = name
        elif "fsync(" in line or "fdatasync(" in line:
            syncs[phase] += 1
    assert run.stdout.split() == ["41"]  # an entry per call: the warm-up, 20 first calls, 20 replays
    assert syncs["first"] == 20, syncs  # one per first call: its completion's commit
    assert syncs["replay"] == 0, syncs
