"""The sweep's pace: short batches, each followed by a rest several times as long as it worked.

A batch is one DELETE. On SQLite it holds the database's only write lock while it runs, so a claim from any
process that arrives meanwhile waits for it (in short sleeps, ``_aiosqlite.written``); on Postgres it holds no
lock a claim needs, but takes the server's CPU and I/O (on a small machine, the callers' cores too). Either way
a claim that meets a batch is delayed by about the batch's length, and the share of claims that meet one is
about the share of time the sweep works. So the claims' p99 stays near its value without a sweep when both
are small:

- each batch is short: its size follows what the last one took, aiming at ``SLICE`` seconds whatever a row
  costs on this machine and database (doubling at most per batch, never above the caller's ``batch``, never
  below ``FLOOR`` rows, so that a slow machine still gets on);
- after each batch the sweep rests ``REST`` times as long as the batch took: it uses at most a
  ``1 / (REST + 1)`` share of the database's time, and a claim meets a batch rarely.

The total is bounded: ``n`` expired records take about ``(REST + 1) × (n × a row's cost + n / size × a
statement's cost)``: 9–32 s for 100k records on a small shared machine (99 s once, the machine busy;
docs/benchmarks.md). A sweep is upkeep: slow and steady costs nothing, a stall costs every caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

SLICE = 0.005  # seconds: what one batch should take, its statement's own overhead (a thread hop, a round trip) included
REST = 5  # the sweep rests this many times as long as each batch took
FIRST = 64  # rows in the first batch, before anything was measured
FLOOR = 64  # the fewest rows in a batch (its statement's overhead amortised)


async def paced(run: Callable[[int], Awaitable[int]], batch: int) -> int:
    """Call ``run(size)`` (delete up to ``size`` records, return how many it deleted) until a batch finds fewer
    than it may delete, pacing the batches as above; ``batch`` is the largest size. Returns the total."""
    loop = asyncio.get_running_loop()
    size, total = min(batch, FIRST), 0
    while True:
        started = loop.time()
        n = await run(size)
        took = loop.time() - started
        total += n
        if n < size:
            return total
        aimed = int(size * SLICE / took) if took > 0 else 2 * size
        size = min(batch, 2 * size, max(FLOOR, aimed))
        await asyncio.sleep(took * REST)
