"""``agentguard doctor``'s verdicts, from inside: the live race's count and the lines a test server cannot be
made to show honestly (the command against real stores: ``tests/core/test_doctor.py``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from agentguard import Guard

pytestmark = pytest.mark.slow


@pytest.mark.storeless
def test_the_race_counts_every_execution_two_stores_run_it_twice(tmp_path: Path) -> None:
    """Two workers pointed at two different files (a relative path from two working directories, say): each store
    lets its own callers run the body once, so the race sees two executions and fails."""
    from agentguard import _doctor

    async def go() -> tuple[Any, Any]:
        guards = [Guard(f"sqlite+aiosqlite:///{tmp_path / name}") for name in ("one.db", "two.db")]
        try:
            split = await _doctor.race(guards, _doctor.SCRATCH + "split", None)
        finally:
            for g in guards:
                await g.aclose()
        guards = [Guard(f"sqlite+aiosqlite:///{tmp_path / 'one.db'}") for _ in range(2)]
        try:
            shared = await _doctor.race(guards, _doctor.SCRATCH + "shared", None)
        finally:
            for g in guards:
                await g.aclose()
        return split, shared

    split, shared = asyncio.run(go())
    assert split.executions == 2 and shared.executions == 1
    line = _doctor.race_line(split, None)
    assert line.status == "FAIL" and ": 2 executions;" in line.found and "every worker's URL" in line.fix
    assert _doctor.race_line(shared, None).status == "ok"


@pytest.mark.storeless
def test_the_verdicts_of_a_far_clock_and_a_tight_role_limit() -> None:
    """Two lines a test server cannot be made to show honestly, judged from the values they are made of: a
    database clock 5 s ahead warns (leases follow the database's clock alone), and a role's CONNECTION LIMIT
    below one worker's budget fails naming the limit and a max_connections that fits."""
    from agentguard import _doctor

    async def ahead() -> float:
        return time.time() + 5.0

    line = asyncio.run(_doctor._clock(ahead))
    assert line.status == "warn" and line.found.startswith("+5000.0 ms ± ") and not line.fix, line
    line = _doctor.budget_line(pool_size=10, workers=2, max_connections=1000, reserved=3, in_use=0, role_limit=50,
                               db_limit=-1, pooling="none")
    assert line.status == "FAIL" and "more than the role's CONNECTION LIMIT 50 allows" in line.found, line
    assert line.fix == ("lower max_connections to 25, raise the role's CONNECTION LIMIT, or put a pooler in "
                        "session mode in front")
    assert 2 * _doctor.worker_connections(10, 25)[0] <= 50 < 2 * _doctor.worker_connections(10, 26)[0]
    assert _doctor.worker_connections(10)[0] == 32  # (Guard's default: 3 × pool_size + 2)
