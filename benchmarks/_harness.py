"""Side-by-side measurement: variants interleaved, order rotated every rep, medians and per-rep ratios.

Every variant of a group runs over ``n`` fresh calls in each rep, in ``chunks`` slices taken in turn: every
variant runs its first slice, then every variant its second, and so on, so that the speed of this shared
machine (which drifts by up to 2x within seconds) is shared by all of them. The order of the variants
rotates from one rep to the next. A ratio is computed inside each rep and the median over reps is kept.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
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


@dataclass
class _Tally:
    wall: float = 0.0
    cpu: float = 0.0
    calls: int = 0
    lat: list[float] = field(default_factory=list)

    def rep(self) -> Rep:
        n = self.calls
        p50 = statistics.median(self.lat) * 1e6 if self.lat else float("nan")
        return Rep(self.wall / n * 1e6, self.cpu / n * 1e6, p50, n / self.wall)


async def _run_seq(v: Variant, start: int, stop: int, tally: _Tally) -> None:
    lat = tally.lat
    perf = time.perf_counter
    call = v.call
    c0, t0 = time.process_time(), perf()
    for i in range(start, stop):
        s = perf()
        await call(i)
        lat.append(perf() - s)
    tally.wall += perf() - t0
    tally.cpu += time.process_time() - c0
    tally.calls += stop - start


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


def _slices(n: int, chunks: int) -> list[tuple[int, int]]:
    chunks = max(1, min(chunks, n))
    bounds = [n * k // chunks for k in range(chunks + 1)]
    return list(itertools.pairwise(bounds))


async def run_group(
    variants: list[Variant], *, n: int, reps: int, warmup: int, callers: int = 1, chunks: int = 8,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Stat]:
    """Run every variant ``reps`` times over ``n`` calls, interleaved (in ``chunks`` slices per rep; one
    caller only: concurrent callers run each rep whole) and rotated; return stats by name."""
    stats = {v.name: Stat(v.name, note=v.note, ref=v.ref) for v in variants}
    active = list(variants)
    # Warm-up (rep -1): connections opened, statements prepared, caches filled; not recorded.
    for v in list(active):
        try:
            if v.prepare is not None:
                await v.prepare(-1, warmup)
            if callers == 1:
                await _run_seq(v, 0, warmup, _Tally())
            else:
                await _run_conc(v, warmup, min(callers, warmup))
        except Unavailable as exc:
            stats[v.name].unavailable = str(exc)
            active.remove(v)
    for rep in range(reps):
        k = rep % len(active) if active else 0
        order = active[k:] + active[:k]
        if callers == 1:
            for v in order:
                if v.prepare is not None:
                    await v.prepare(rep, n)
            tallies = {v.name: _Tally() for v in order}
            for start, stop in _slices(n, chunks):
                gc.collect()  # each round of slices starts from the same heap; garbage made in it is its cost
                for v in order:
                    await _run_seq(v, start, stop, tallies[v.name])
            for v in order:
                stats[v.name].reps.append(tallies[v.name].rep())
        else:
            for v in order:
                if v.prepare is not None:
                    await v.prepare(rep, n)
                gc.collect()  # every variant starts from the same heap; its own garbage is its own cost
                stats[v.name].reps.append(await _run_conc(v, n, callers))
        log(f"    rep {rep + 1}/{reps} done")
    return stats


def ratios(stats: dict[str, Stat], name: str, ref: str, attr: str = "us_per_call") -> list[float]:
    """The per-rep ratios ``name / ref`` (both measured in the same rep); empty if either is missing."""
    a, b = stats.get(name), stats.get(ref)
    if a is None or b is None or a.unavailable or b.unavailable or not a.reps or len(a.reps) != len(b.reps):
        return []
    return [getattr(x, attr) / getattr(y, attr) for x, y in zip(a.reps, b.reps, strict=True)]


def ratio(stats: dict[str, Stat], name: str, ref: str, attr: str = "us_per_call") -> float | None:
    """Median over reps of the per-rep ratio ``name / ref``."""
    found = ratios(stats, name, ref, attr)
    return float(statistics.median(found)) if found else None
