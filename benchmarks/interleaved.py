"""Where the rest of a guarded first call's time goes on Postgres (issue 34): the guard's own Python work, timed
between the round trips it sits between and back to back.

    python -m benchmarks.interleaved [--url URL] [--calls N] [--reps R]

``python -m benchmarks`` puts a first call at about 1.3× the raw asyncpg claim + complete while the store's own
verbs alone are about 1.05×, and the guard's whole Python work over the no-I/O stand-in is about 35 µs a call: the
guard's client CPU over the bare store is about twice that. This run takes the difference apart, pinned to one CPU
with its server as ``python -m benchmarks`` is, each variant in slices taken in turn within every rep:

- a guarded first call over a real store whose verbs are timed (``Timing``): the time the call spends outside its
  store's verbs, i.e. the guard's own work, with the ledger kept (as shipped) and not kept;
- the same guarded call over the no-I/O stand-in: the same work back to back, nothing in between;
- a fixed piece of plain Python (what the store-only caller of ``python -m benchmarks`` does besides its two verbs:
  a key, the result's JSON, the claim's parameters), timed between the store's claim and its completion, and the
  same piece back to back.

The ratio of each pair (between round trips ÷ back to back) is what the round trips do to the Python around them:
on this VM each round trip hands the CPU to the server's backend and back, and the code that runs next finds its
caches cold. Where the guard's share and the fixed piece's grow alike, the rest of the gap is the guard's own work,
and what lowers it is less of that work, not a cheaper statement or ledger.
"""

from __future__ import annotations

import inspect
import json
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentguard import Guard, task
from agentguard.stores import SQLStore, Store

from ._common import (
    AMOUNT,
    MEMBERS,
    Body,
    NoIOStore,
    _complete,
    claim_params,
    fake_key,
    guarded,
    observe,
    run_id,
)
from ._drivers import postgres_script


class Timing:
    """Any store, the time spent in each of its async verbs added up in ``inside`` (seconds)."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.inside = inner, 0.0


def _timed(name: str, member: Any) -> Any:
    if isinstance(member, property):
        return property(lambda self: getattr(self.inner, name))
    if not inspect.iscoroutinefunction(member):
        return lambda self, *args, **kwargs: getattr(self.inner, name)(*args, **kwargs)

    async def verb(self: Timing, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await getattr(self.inner, name)(*args, **kwargs)
        finally:
            self.inside += time.perf_counter() - started

    return verb


_complete(Timing, _timed)
assert all(hasattr(Timing, name) for name in MEMBERS)

Step = Callable[[int], Awaitable[float]]  # one call: the seconds of the part this variant times


async def measure(url: str, calls: int, reps: int, warmup: int = 100) -> dict[str, list[float]]:
    """Every variant's µs per call, one value per rep."""
    obs = await observe(url, {})
    scope, done = obs.claim["scope"], obs.complete
    body, piece, rid = Body(), Body(), run_id()  # (the guarded tools' body; the fixed piece's)
    timing = {ledger: Timing(SQLStore(url)) for ledger in (True, False)}
    guards = {ledger: Guard(store=timing[ledger], ledger=ledger) for ledger in (True, False)}
    no_io = Guard(store=NoIOStore())  # type: ignore[arg-type]
    tools = {name: guarded(g, body) for name, g in (("on", guards[True]), ("off", guards[False]), ("no-io", no_io))}
    store = SQLStore(url)
    rep = [0]

    def guard_outside(name: str, t: Timing | None) -> Step:
        async def call(i: int) -> float:
            before = t.inside if t is not None else 0.0
            started = time.perf_counter()
            with task(f"il-{rid}-{name}-{rep[0]}-{i}"):
                await tools[name](f"o-{i}", AMOUNT)
            return time.perf_counter() - started - ((t.inside - before) if t is not None else 0.0)

        return call

    async def prepare(i: int, tag: str) -> tuple[str, str, dict[str, Any]]:
        """The store-only caller's own work besides its verbs: a key, the result's JSON, the claim's parameters."""
        key = fake_key(rid, tag, rep[0], i)
        value = json.dumps(await piece(f"o-{i}", AMOUNT, key))
        return key, value, claim_params(obs, key, f"o-{i}", secrets.randbits(62))

    async def fixed_between(i: int) -> float:
        """The fixed piece, between the claim's round trip and the completion's (as a guarded call's own work is)."""
        key, value, params = await prepare(i, "between")
        fence = await store.claim(params)
        started = time.perf_counter()
        await prepare(i, "piece")
        took = time.perf_counter() - started
        if fence != params["fence"] or not await store.complete(scope, key, fence, done["state"], value,
                                                                done["retention"]):
            raise AssertionError("the store did not claim and complete a fresh key")
        return took

    async def fixed_back_to_back(i: int) -> float:
        started = time.perf_counter()
        await prepare(i, "tight")
        return time.perf_counter() - started

    variants: dict[str, Step] = {
        "guard's own work, between round trips (ledger kept)": guard_outside("on", timing[True]),
        "guard's own work, between round trips (no ledger)": guard_outside("off", timing[False]),
        "guard's own work, back to back (no-I/O stand-in)": guard_outside("no-io", None),
        "fixed Python piece, between round trips": fixed_between,
        "fixed Python piece, back to back": fixed_back_to_back,
    }
    out: dict[str, list[float]] = {name: [] for name in variants}
    slices = 8
    try:
        for step in variants.values():  # warm: connections, prepared statements, caches
            for i in range(warmup):
                await step(-1 - i)
        for rep[0] in range(reps):
            spent = dict.fromkeys(variants, 0.0)
            order = list(variants)[rep[0] % len(variants):] + list(variants)[:rep[0] % len(variants)]
            for s in range(slices):
                for name in order:
                    for i in range(s * calls // slices, (s + 1) * calls // slices):
                        spent[name] += await variants[name](i)
            for name, total in spent.items():
                out[name].append(1e6 * total / calls)
    finally:
        for g in (*guards.values(), no_io):
            await g.aclose()
        await store.dispose()
    if body.runs != 3 * (warmup + calls * reps):  # every guarded call was a first call: its body ran once
        raise SystemExit(f"benchmarks.interleaved: the guarded bodies ran {body.runs} times")
    return out


# (label, between round trips, back to back): the pairs whose ratio the report gives
PAIRS = (
    ("guard's own work [ledger kept]", "guard's own work, between round trips (ledger kept)",
     "guard's own work, back to back (no-I/O stand-in)"),
    ("guard's own work [no ledger]", "guard's own work, between round trips (no ledger)",
     "guard's own work, back to back (no-I/O stand-in)"),
    ("fixed Python piece", "fixed Python piece, between round trips", "fixed Python piece, back to back"),
)


def report(out: dict[str, list[float]]) -> str:
    lines = [f"{'variant':58} {'µs/call':>9}", "-" * 68]
    lines += [f"{name:58} {statistics.median(v):9.1f}" for name, v in out.items()]
    for label, between, tight in PAIRS:
        ratios = [a / b for a, b in zip(out[between], out[tight], strict=True)]
        lines.append(f"{label}: between round trips ÷ back to back {statistics.median(ratios):.2f}× "
                     f"(reps {min(ratios):.2f}–{max(ratios):.2f})")
    return "\n".join(lines)


if __name__ == "__main__":
    postgres_script("interleaved", __doc__ or "", "agentguard_interleaved", measure, report, calls=800, warmup=100)
