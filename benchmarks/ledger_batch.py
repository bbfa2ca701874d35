"""How a SQLite batch of the ledger's entries goes in: a step per entry, or a few statements of many rows each.

    python -m benchmarks.ledger_batch [--batches N] [--size S]

Each way writes its own file (the ledger's own table and indexes, WAL, ``synchronous=NORMAL``) with the same
entries, ``S`` to a batch (500, as the writer's), each batch in one ``BEGIN IMMEDIATE`` transaction, the ways taken
in turn batch by batch:

- ``executemany``: the one-row INSERT, one ``sqlite3_step`` per entry (the writer's way before);
- ``insert_rows``: ``_chain.insert_rows``, up to 64 entries to an ``INSERT OR ROLLBACK`` (the writer's way);
- ``insert_rows, plain INSERT``: the same statements without ``OR ROLLBACK``, so that SQLite keeps a statement
  journal of the pages each changes (shown, never used).

Each batch alone, and the next beside a thread that runs Python and makes a read now and then, as a caller of a
sync tool does between its statements: each step lets go of the GIL and must take it back from that thread. Prints
each way's median µs an entry, the thread's pace meanwhile (rounds a second, beside its pace alone), and the
thread's time lost to an entry (the share of its pace lost while the batch was written, times the batch's time an
entry). The files are then compared: every way must have stored the same rows (exit 1 otherwise). Nothing is
pinned: the point is two threads on two CPUs. docs/benchmarks.md, "The ledger's batch in a few statements".
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.schema import CreateIndex, CreateTable

from agentguard.stores import _chain
from agentguard.stores._attempts import ATTEMPTS, WRITTEN, attempts

CHAIN = _chain.Chain(ATTEMPTS, WRITTEN, "0")


class _PlainChain(_chain.Chain):
    """The chain's statements with the many-row INSERTs made plain (no ``OR ROLLBACK``)."""

    def sq_insert_rows(self, n: int) -> str:
        return super().sq_insert_rows(n).replace("INSERT OR ROLLBACK INTO", "INSERT INTO", 1)


PLAIN = _PlainChain(ATTEMPTS, WRITTEN, "0")


def _plain(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    _chain.insert_rows(conn, PLAIN, rows)


def _each(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    conn.executemany(CHAIN.sq_insert, rows)


def _rows(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    _chain.insert_rows(conn, CHAIN, rows)


WAYS: dict[str, Callable[[sqlite3.Connection, list[tuple[Any, ...]]], None]] = {
    "executemany": _each,
    "insert_rows": _rows,
    "insert_rows, plain INSERT": _plain,
}


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _entries(rng: random.Random, n: int, seq: int) -> list[tuple[Any, ...]]:
    """``n`` entries of tasks of their own (as first calls of new tasks are), placed after ``seq``."""
    at = 1_765_000_000.0 + seq / 1000
    out = [("", f"ag_{rng.getrandbits(192):048x}", f"task-{rng.getrandbits(48):012x}", 'charge[order_id="o"]',
            "charge", "ran", "succeeded", 1, None, "host:1", at + i / 1000, 0.05, None, at + 86400.0)
           for i in range(n)]
    rows, _ = _chain.place(_chain.prepared(out), {"": (seq, _chain.GENESIS)})
    return rows


class Caller(threading.Thread):
    """A thread that runs Python and makes a read every 200 additions, counting its rounds; idle while paused."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.rounds = 0
        self.going = threading.Event()
        self.stop = False

    def run(self) -> None:
        conn, x = _connect(self.path), 0
        try:
            while not self.stop:
                self.going.wait()
                for _ in range(200):
                    x += 1
                conn.execute("SELECT 1").fetchall()
                self.rounds += 1
        finally:
            conn.close()

    def pace(self, seconds: float) -> float:
        """Its rounds a second (thousands) going alone for ``seconds``."""
        self.going.set()
        time.sleep(0.2)
        first, started = self.rounds, time.perf_counter()
        time.sleep(seconds)
        return (self.rounds - first) / (time.perf_counter() - started) / 1000


def measure(batches: int, size: int, directory: Path) -> tuple[dict[tuple[str, bool], list[float]],
                                                               dict[str, list[float]], float]:
    """µs an entry by (way, beside the caller), the caller's pace (k rounds/s) by way, its pace alone. Batch by
    batch, each way alone and beside the caller, in turn."""
    conns = {way: _connect(directory / f"{i}.db") for i, way in enumerate(WAYS)}
    for conn in conns.values():
        conn.execute(str(CreateTable(attempts).compile(dialect=sqlite_dialect.dialect())))
        for index in attempts.indexes:
            conn.execute(str(CreateIndex(index).compile(dialect=sqlite_dialect.dialect())))
    caller = Caller(directory / "0.db")
    caller.start()
    alone = caller.pace(2.0)
    rng, seq = random.Random(34), 0
    times: dict[tuple[str, bool], list[float]] = {}
    pace: dict[str, list[float]] = {}
    try:
        for _ in range(batches):
            for beside in (False, True):
                rows = _entries(rng, size, seq)
                seq += size
                (caller.going.set if beside else caller.going.clear)()
                time.sleep(0.01)  # (the caller going, or idle, before the batches)
                for way, insert in WAYS.items():
                    conn, before = conns[way], caller.rounds
                    started = time.perf_counter()
                    conn.execute("BEGIN IMMEDIATE")
                    insert(conn, rows)
                    conn.execute("COMMIT")
                    took = time.perf_counter() - started
                    times.setdefault((way, beside), []).append(took / size * 1e6)
                    if beside:
                        pace.setdefault(way, []).append((caller.rounds - before) / took / 1000)
    finally:
        caller.stop = True
        caller.going.set()
        caller.join()
    stored = [conn.execute(f"SELECT * FROM {ATTEMPTS} ORDER BY id").fetchall() for conn in conns.values()]
    for conn in conns.values():
        conn.close()
    if any(s != stored[0] for s in stored) or len(stored[0]) != 2 * batches * size:
        sys.exit("the ways stored different rows")
    return times, pace, alone


def report(times: dict[tuple[str, bool], list[float]], pace: dict[str, list[float]], alone: float,
           size: int) -> str:
    lines = [f"== A batch of {size} ledger entries in one transaction (SQLite, NORMAL), µs an entry (median); the"
             f" same rows stored by every way",
             f"{'way':<28}{'alone':>10}{'beside a caller':>18}{'the caller meanwhile (k rounds/s)':>36}"
             f"{'its time lost an entry':>25}"]
    for way in WAYS:
        beside, meanwhile = statistics.median(times[way, True]), statistics.median(pace[way])
        lines.append(f"{way:<28}{statistics.median(times[way, False]):>10.2f}{beside:>18.2f}{meanwhile:>36.0f}"
                     f"{max(0.0, 1 - meanwhile / alone) * beside if alone else 0.0:>25.2f}")
    lines.append(f"the caller alone: {alone:.0f}k rounds/s (its time lost an entry: the share of its pace lost while"
                 f" the batch was written, times the batch's time an entry)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=60, help="batches of each way, alone and beside the caller")
    ap.add_argument("--size", type=int, default=500, help="entries a batch")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        print(report(*measure(args.batches, args.size, Path(directory)), args.size))


if __name__ == "__main__":
    main()
