"""The benchmark harness interleaves variants slice by slice, so that a drift in this shared machine's speed
is shared by every variant of a rep. Checked on the order of the calls it makes (never on a time)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks._harness import Variant, ratios, run_group

pytestmark = pytest.mark.storeless  # independent of the store's backend


def _recording(log: list[tuple[str, int, int]], name: str, rep: list[int]) -> Variant:
    async def call(i: int) -> None:
        log.append((name, rep[0], i))

    async def prepare(r: int, k: int) -> None:
        rep[0] = r
        log.append((name, r, -1))  # -1: prepared

    return Variant(name, call, prepare)


def test_variants_run_slice_by_slice_and_rotate() -> None:
    log: list[tuple[str, int, int]] = []
    reps = [-1]
    variants = [_recording(log, name, reps) for name in ("a", "b", "c")]
    stats = asyncio.run(run_group(variants, n=8, reps=3, warmup=2, slices=4))

    assert all(len(s.reps) == 3 for s in stats.values())
    assert len(ratios(stats, "b", "a")) == 3
    for r in range(3):
        timed = [(name, i) for name, rep, i in log if rep == r and i >= 0]
        for name in "abc":  # every call of the rep exactly once, in order
            assert [i for n, i in timed if n == name] == list(range(8))
        # Prepared before any timed call of the rep, then slices of 2 calls taken in turn.
        first = ("abc" * 2)[r:r + 3]  # the order rotates by one each rep
        expected = [(name, i) for lo in range(0, 8, 2) for name in first for i in (lo, lo + 1)]
        assert timed == expected
        rep_log = [(n, i) for n, rep, i in log if rep == r]
        assert [i for _, i in rep_log[:3]] == [-1, -1, -1]


def test_concurrent_callers_run_each_rep_whole() -> None:
    log: list[tuple[str, int, int]] = []
    reps = [-1]
    variants = [_recording(log, name, reps) for name in ("a", "b")]
    stats = asyncio.run(run_group(variants, n=12, reps=2, warmup=4, callers=4))
    assert all(len(s.reps) == 2 for s in stats.values())
    for r in range(2):
        timed = [(name, i) for name, rep, i in log if rep == r and i >= 0]
        for name in "ab":
            assert sorted(i for n, i in timed if n == name) == list(range(12))
        names = [n for n, _ in timed]
        first = names[0]
        assert names == [first] * 12 + [("b" if first == "a" else "a")] * 12  # one variant after the other


def test_the_sqlite_floor_checkpoints_off_the_callers_thread_as_the_store_does(tmp_path: Path) -> None:
    """The stdlib ``sqlite3`` floor has the store's checkpoint policy (``_direct``): its own connection never
    checkpoints (``wal_autocheckpoint`` 0), and every ``CHECKPOINT_EVERY`` commits a thread of its own copies the WAL
    into the database. Checked through SQLite: the pragma read back, and the frames its checkpoints copied."""
    from benchmarks._common import fake_key, observe
    from benchmarks._drivers import CHECKPOINT_EVERY, sqlite3_raw, sqlite_url

    async def run() -> tuple[int, int, int]:
        path = tmp_path / "floor.db"
        floor = await sqlite3_raw(path, await observe(sqlite_url(path), {}), "NORMAL")
        try:
            for i in range(CHECKPOINT_EVERY // 2 + 10):  # (two commits a first call: past one checkpoint's count)
                await floor.first(fake_key("floor", i), f"o-{i}", '{"ok": 1}')
            checkpoints = floor.checkpoints  # type: ignore[attr-defined]
            for _ in range(500):  # (its thread, started by the commit that reached the count)
                if checkpoints.copied and not checkpoints.running():
                    break
                await asyncio.sleep(0.01)
            autocheckpoint = floor.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]  # type: ignore[attr-defined]
            return autocheckpoint, checkpoints.copied, checkpoints.commits
        finally:
            await floor.close()

    autocheckpoint, copied, commits = asyncio.run(run())
    assert autocheckpoint == 0
    assert copied > 0  # the frames of the first CHECKPOINT_EVERY commits, copied by the floor's own thread
    assert commits == 2 * (CHECKPOINT_EVERY // 2 + 10) - CHECKPOINT_EVERY  # (counted again from 0 at the checkpoint)
