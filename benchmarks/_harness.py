"""Side-by-side measurement: variants interleaved, order rotated every rep, medians and per-rep ratios.

Every variant of a group runs over ``n`` fresh calls in each rep, in ``slices`` slices taken in turn: every
variant runs its first slice, then every variant its second, and so on, so that the speed of this shared
machine (which drifts by up to 2x within seconds) is shared by all of them. The order of the variants
rotates from one rep to the next. A ratio is computed inside each rep and the median over reps is kept.
Concurrent callers run each rep whole (a slice of 64 callers would measure mostly their ramp-up).
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

SLICES = 8  # one caller's calls of a rep, in this many slices (python -m benchmarks --slices)
Call = Callable[[int], Awaitable[Any]]
Prepare = Callable[[int, int], Awaitable[None]]  # (rep, n), untimed; rep -1 is the warm-up


class Unavailable(Exception):
    """Raised by a variant's setup when its feature or peer is not there: printed as "n/a (reason)"."""


@dataclass
class Variant:
    name: str
    call: Call
    prepare: Prepare | None = None
    ref: str = ""  # the variant this one's ratio is taken against


@dataclass
class Rep:
    """One rep of one variant: its calls' wall and CPU time (this process's, every thread), their latencies."""

    wall: float = 0.0
    cpu: float = 0.0
    calls: int = 0
    lat: list[float] = field(default_factory=list)  # one caller only

    @property
    def us_per_call(self) -> float:
        return self.wall / self.calls * 1e6

    @property
    def cpu_per_call(self) -> float:
        return self.cpu / self.calls * 1e6

    @property
    def p50(self) -> float:
        return statistics.median(self.lat) * 1e6 if self.lat else float("nan")


@dataclass
class Stat:
    name: str
    ref: str = ""
    reps: list[Rep] = field(default_factory=list)
    unavailable: str = ""
    profile: cProfile.Profile | None = None  # the calling thread's CPU over every timed call (--profile)

    def median(self, attr: str) -> float:
        return float(statistics.median(getattr(r, attr) for r in self.reps))

    @property
    def ok(self) -> bool:
        return bool(self.reps) and not self.unavailable


async def _run_seq(call: Call, start: int, stop: int, tally: Rep, prof: cProfile.Profile | None = None) -> None:
    lat, perf = tally.lat, time.perf_counter
    if prof:
        prof.enable()
    c0, t0 = time.process_time(), perf()
    for i in range(start, stop):
        s = perf()
        await call(i)
        lat.append(perf() - s)
    if prof:
        prof.disable()
    tally.wall += perf() - t0
    tally.cpu += time.process_time() - c0
    tally.calls += stop - start


async def _run_conc(call: Call, n: int, callers: int, tally: Rep) -> None:
    go = asyncio.Event()

    async def worker(w: int) -> None:
        await go.wait()
        for i in range(w, n, callers):
            await call(i)

    tasks = [asyncio.create_task(worker(w)) for w in range(callers)]
    await asyncio.sleep(0)  # let every worker reach the gate
    c0, t0 = time.process_time(), time.perf_counter()
    go.set()
    await asyncio.gather(*tasks)
    tally.wall, tally.cpu, tally.calls = time.perf_counter() - t0, time.process_time() - c0, n


async def run_group(
    variants: list[Variant], *, n: int, reps: int, warmup: int, callers: int = 1, slices: int = SLICES,
    log: Callable[[str], None] = lambda s: None, profile: Iterable[str] = (),
) -> dict[str, Stat]:
    """Run every variant ``reps`` times over ``n`` calls, interleaved (in ``slices`` slices per rep; one
    caller only) and rotated; return stats by name. The variants named in ``profile`` run under cProfile."""
    stats = {v.name: Stat(v.name, v.ref) for v in variants}
    for name in set(profile) & set(stats):
        stats[name].profile = cProfile.Profile(time.thread_time)  # waiting for I/O is not "time" here
    active = list(variants)
    for v in variants:  # the warm-up (rep -1): connections opened, statements prepared, caches filled
        try:
            if v.prepare is not None:
                await v.prepare(-1, warmup)
            if callers == 1:
                await _run_seq(v.call, 0, warmup, Rep())
            else:
                await _run_conc(v.call, warmup, min(callers, warmup), Rep())
        except Unavailable as exc:
            stats[v.name].unavailable = str(exc)
            active.remove(v)
    for rep in range(reps):
        k = rep % len(active) if active else 0
        order = active[k:] + active[:k]
        for v in order:
            stats[v.name].reps.append(Rep())
            if v.prepare is not None:
                await v.prepare(rep, n)
        if callers == 1:
            for start, stop in itertools.pairwise([n * j // slices for j in range(slices + 1)]):
                gc.collect()  # each round of slices starts from the same heap; garbage made in it is its cost
                for v in order:
                    await _run_seq(v.call, start, stop, stats[v.name].reps[-1], stats[v.name].profile)
        else:
            for v in order:
                gc.collect()
                await _run_conc(v.call, n, callers, stats[v.name].reps[-1])
        log(f"    rep {rep + 1}/{reps} done")
    return stats


def ratios(stats: dict[str, Stat], name: str, ref: str, attr: str = "us_per_call") -> list[float]:
    """The per-rep ratios ``name / ref`` (both measured in the same rep); empty if either is missing."""
    a, b = stats.get(name), stats.get(ref)
    if a is None or b is None or not a.ok or not b.ok or len(a.reps) != len(b.reps):
        return []
    return [getattr(x, attr) / getattr(y, attr) for x, y in zip(a.reps, b.reps, strict=True)]


def ratio(stats: dict[str, Stat], name: str, ref: str, attr: str = "us_per_call") -> float | None:
    """Median over reps of the per-rep ratio ``name / ref``."""
    found = ratios(stats, name, ref, attr)
    return float(statistics.median(found)) if found else None


def us(stats: dict[str, Stat] | None, name: str, attr: str = "us_per_call") -> float | None:
    s = None if stats is None else stats.get(name)
    return s.median(attr) if s is not None and s.ok else None
