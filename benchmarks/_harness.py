"""Side-by-side measurement: variants interleaved, order rotated every rep, medians and per-rep ratios.

Every variant of a group runs over ``n`` fresh calls in each rep. The order of the variants rotates from
one rep to the next, so a slow minute on this shared machine hits every variant about equally. A ratio is
computed inside each rep (both variants measured minutes apart at most) and the median over reps is kept.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

Call = Callable[[int], Awaitable[Any]]
Prepare = Callable[[int, int], Awaitable[None]]  # (rep, n), untimed


class Unavailable(Exception):
    """Raised by a variant's setup when its feature or peer is not there: printed as "n/a (reason)"."""


@dataclass
class Variant:
    name: str
    call: Call
    prepare: Prepare | None = None
    note: str = ""
    ref: str = ""  # the variant this one's ratio is taken against


@dataclass
class Rep:
    us_per_call: float  # wall time / calls
    cpu_per_call: float  # client process CPU / calls
    p50: float  # median single-call latency (sequential only)
    calls_per_s: float


@dataclass
class Stat:
    name: str
    reps: list[Rep] = field(default_factory=list)
    note: str = ""
    unavailable: str = ""
    ref: str = ""

    def median(self, attr: str) -> float:
        return float(statistics.median(getattr(r, attr) for r in self.reps))

    def as_dict(self) -> dict[str, Any]:
        if self.unavailable:
            return {"name": self.name, "unavailable": self.unavailable}
        if not self.reps:
            return {"name": self.name, "unavailable": "not run"}
        return {
            "name": self.name,
            "us_per_call": round(self.median("us_per_call"), 2),
            "cpu_us_per_call": round(self.median("cpu_per_call"), 2),
            "p50_us": round(self.median("p50"), 2),
            "calls_per_s": round(self.median("calls_per_s"), 1),
            "reps": len(self.reps),
            "note": self.note,
        }


async def _run_seq(v: Variant, n: int) -> Rep:
    lat = []
    perf = time.perf_counter
    call = v.call
    c0, t0 = time.process_time(), perf()
    for i in range(n):
        s = perf()
        await call(i)
        lat.append(perf() - s)
    wall, cpu = perf() - t0, time.process_time() - c0
    return Rep(wall / n * 1e6, cpu / n * 1e6, statistics.median(lat) * 1e6, n / wall)


async def _run_conc(v: Variant, n: int, callers: int) -> Rep:
    go = asyncio.Event()
    call = v.call

    async def worker(w: int) -> None:
        await go.wait()
        for i in range(w, n, callers):
            await call(i)

    tasks = [asyncio.create_task(worker(w)) for w in range(callers)]
    await asyncio.sleep(0)  # let every worker reach the gate
    c0, t0 = time.process_time(), time.perf_counter()
    go.set()
    await asyncio.gather(*tasks)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Rep(wall / n * 1e6, cpu / n * 1e6, float("nan"), n / wall)


async def run_group(
    variants: list[Variant], *, n: int, reps: int, warmup: int, callers: int = 1,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Stat]:
    """Run every variant ``reps`` times over ``n`` calls, interleaved and rotated; return stats by name."""
    stats = {v.name: Stat(v.name, note=v.note, ref=v.ref) for v in variants}
    active = list(variants)
    # Warm-up (rep -1): connections opened, statements prepared, caches filled; not recorded.
    for v in list(active):
        try:
            if v.prepare is not None:
                await v.prepare(-1, warmup)
            if callers == 1:
                await _run_seq(v, warmup)
            else:
                await _run_conc(v, warmup, min(callers, warmup))
        except Unavailable as exc:
            stats[v.name].unavailable = str(exc)
            active.remove(v)
    for rep in range(reps):
        k = rep % len(active) if active else 0
        order = active[k:] + active[:k]
        for v in order:
            if v.prepare is not None:
                await v.prepare(rep, n)
            gc.collect()  # every variant starts from the same heap; its own garbage is its own cost
            r = await (_run_seq(v, n) if callers == 1 else _run_conc(v, n, callers))
            stats[v.name].reps.append(r)
        log(f"    rep {rep + 1}/{reps} done")
    return stats


def ratio(stats: dict[str, Stat], name: str, ref: str, attr: str = "us_per_call") -> float | None:
    """Median over reps of the per-rep ratio ``name / ref`` (both measured in the same rep)."""
    a, b = stats.get(name), stats.get(ref)
    if a is None or b is None or a.unavailable or b.unavailable or not a.reps or len(a.reps) != len(b.reps):
        return None
    return float(statistics.median(getattr(x, attr) / getattr(y, attr) for x, y in zip(a.reps, b.reps, strict=True)))
