"""How close any guard could come to the SQLite floor on a replay (issue 34): the least a guard must add to it.

    python -m benchmarks.least [--calls N] [--reps R] [--synchronous NORMAL|FULL]

The race (``python -m benchmarks --race``) puts a replay that misses the cache at about 2.5× its floor, the store's
read run by stdlib ``sqlite3`` on the caller's thread and the result's ``json.loads``; the issue's limit is 1.5×.
This run says whether that limit is within reach of a guard at all. Beside the floor it times **the least guard**:
what no guard keeping the guarantee can skip before its read — the task id from a context variable, the
arguments' canonical JSON, the fingerprint's SHA-256 and the key's — then the floor's read by that key, the stored
fingerprint compared with the call's, and the result's ``json.loads``; written plainly, for one tool whose argument
names it knows. Its key and fingerprint are checked, record by record, against those agentguard stored, so it is
the same identity, not a cheaper one. And beside both, agentguard's own replays of a sync and an async tool
(``cache_size=0``, the ledger as shipped: each slice ends with its entries written, so that on the one CPU the
ledger's writer costs the variant that queued them, not the one that happens to run next). Every variant reads
records of its own, each rep new ones (no memo or cache has seen them: a resumed agent's replays), in slices taken
in turn within each rep, one CPU.

The least guard's ratio is how far the limit is from physics; agentguard's minus the least guard's (in µs) is its
own work that the limit asks it to lose. Two more variants take an async tool's replay apart by layer: the store
alone (its claim, likely taken, which reads the record; the result's ``json.loads``) and the state machine (the
claim plan driven on the loop as the async driver drives it, the replay decoded), each on calls whose identity was
derived beforehand; what the whole call costs beyond the machine is the decorator's (binding, the identity), the
driver's and the observer's (the ledger's entry). A third, the same replay by a ``Guard(ledger=False)``, tells the
ledger's entry (queued by the caller, then formed, hashed into its chain and inserted by the writer) from the
rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import hashlib
import json
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentguard import Guard, task
from agentguard._drive import run as drive_plan
from agentguard._lease import new_owner
from agentguard.stores import SQLStore
from agentguard.stores._schema import TABLE

from ._common import pin_one_cpu
from ._drivers import _pragmas
from ._race import RESULT

SCOPE = "default"
SLICES = 8  # each rep's calls in slices, the variants taken in turn in each
LIMIT = 1.5  # a replay (cache miss) ÷ the floor, at most (issue 34)
FLOOR, LEAST = "floor: the store's read + json.loads", "least guard: the identity, the read, the check"
SYNC, ASYNC = "agentguard: sync tool replay (cache off)", "agentguard: async tool replay (cache off)"
STORE, MACHINE = "  its store alone: the claim's read + json.loads", "  its state machine: the claim plan, the decode"
UNLEDGERED = "  its call without the ledger: Guard(ledger=False)"
ASYNC_TOOL = (ASYNC, STORE, MACHINE, UNLEDGERED)  # (records of the async tool)

_escape, _escape_ascii = json.encoder.encode_basestring, json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]
_task: contextvars.ContextVar[str] = contextvars.ContextVar("least_task")


def identity(task_id: str, order_id: str, amount_cents: int) -> tuple[str, str]:
    """``(key, fingerprint)`` of ``charge(order_id, amount_cents)`` in ``task_id``, as agentguard derives them
    (its canonical JSON of the arguments, and of the scope, task and operation), written for this one tool."""
    order = _escape(order_id)
    fingerprint = hashlib.sha256(f'{{"amount_cents":{amount_cents:d},"order_id":{order}}}'.encode()).hexdigest()
    operation = f"charge[order_id={order}]"
    text = f"[{_escape_ascii(SCOPE)},{_escape_ascii(task_id)},{_escape_ascii(operation)}]"
    return "ag_" + hashlib.sha256(text.encode()).hexdigest()[:48], fingerprint


def measure(path: Path, synchronous: str, calls: int, reps: int) -> dict[str, list[float]]:
    """Each variant's µs per call, one value per rep."""
    url, rid = f"sqlite+aiosqlite:///{path}", os.urandom(4).hex()
    tasks = {name: f"least-{rid}-{n}" for n, name in enumerate((FLOOR, LEAST, SYNC, *ASYNC_TOOL))}
    orders = [[f"o-{rep}-{i}" for i in range(calls)] for rep in range(reps + 1)]  # rep 0 warms, unkept
    runs = 0

    def make(guard: Guard) -> tuple[Callable[..., Any], Callable[..., Any]]:
        @guard.once(key=["order_id"], operation="charge")
        def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
            nonlocal runs
            runs += 1
            return RESULT

        @guard.once(key=["order_id"], operation="charge_async")
        async def charge_async(order_id: str, amount_cents: int) -> dict[str, Any]:
            nonlocal runs
            runs += 1
            return RESULT

        return charge, charge_async

    async def fill() -> None:
        async with Guard(url, sqlite_synchronous="OFF", ledger=False) as filler:  # every record completed, unsynced
            charge, charge_async = make(filler)
            for name, task_id in tasks.items():
                with task(task_id):
                    for order in (order for rep_orders in orders for order in rep_orders):
                        if name in ASYNC_TOOL:
                            await charge_async(order, 1999)
                        else:
                            charge(order, 1999)

    asyncio.run(fill())
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    for pragma in _pragmas(synchronous):
        conn.execute(pragma)
    read = str(SQLStore(url).sql.read.text)
    stored = dict(conn.execute(f"SELECT key, fingerprint FROM {TABLE} WHERE task_id IN (?, ?)",
                               (tasks[FLOOR], tasks[LEAST])).fetchall())
    floor_keys = []
    for name in (FLOOR, LEAST):
        for rep_orders in orders:
            for order in rep_orders:
                key, fingerprint = identity(tasks[name], order, 1999)
                if stored.get(key) != fingerprint:
                    raise SystemExit(f"benchmarks.least: the least guard's identity of {order} is not agentguard's")
                if name == FLOOR:
                    floor_keys.append(key)

    def floor(rep: int, part: slice) -> None:
        for key in floor_keys[rep * calls:(rep + 1) * calls][part]:
            json.loads(conn.execute(read, {"scope": SCOPE, "key": key}).fetchall()[0]["result"])

    def least(rep: int, part: slice) -> None:
        with _scoped(tasks[LEAST]):
            for order in orders[rep][part]:
                key, fingerprint = identity(_task.get(), order, 1999)
                rows = conn.execute(read, {"scope": SCOPE, "key": key}).fetchall()
                if not rows or rows[0]["fingerprint"] != fingerprint:
                    raise SystemExit("benchmarks.least: a record the least guard read is not the call's")
                json.loads(rows[0]["result"])

    async def replays() -> dict[str, list[float]]:
        guard = Guard(url, sqlite_synchronous=synchronous, cache_size=0)
        sync_tool, async_tool = make(guard)
        unledgered = Guard(url, sqlite_synchronous=synchronous, cache_size=0, ledger=False)
        _, unledgered_tool = make(unledgered)

        async def sync_replay(rep: int, part: slice) -> None:
            with task(tasks[SYNC]):
                for order in orders[rep][part]:
                    sync_tool(order, 1999)
            await guard.flush_ledger()  # the slice's entries written within its time, not in another variant's

        async def async_replay(rep: int, part: slice) -> None:
            with task(tasks[ASYNC]):
                for order in orders[rep][part]:
                    await async_tool(order, 1999)
            await guard.flush_ledger()

        async def unledgered_replay(rep: int, part: slice) -> None:
            with task(tasks[UNLEDGERED]):
                for order in orders[rep][part]:
                    await unledgered_tool(order, 1999)

        def plain(step: Callable[[int, slice], None]) -> Callable[[int, slice], Awaitable[None]]:
            async def run(rep: int, part: slice) -> None:
                step(rep, part)

            return run

        spec = async_tool.__agentguard__  # type: ignore[attr-defined]
        machine, store = spec.machine, spec.machine.store
        made: dict[str, list[list[Any]]] = {}
        for name in (STORE, MACHINE):  # each call's identity derived beforehand, outside the timing
            with task(tasks[name]):
                made[name] = [[spec.call((order, 1999), {})[0] for order in rep_orders] for rep_orders in orders]
        params = [[machine.claim_params(call, new_owner()) for call in calls] for calls in made[STORE]]

        async def store_alone(rep: int, part: slice) -> None:
            for p in params[rep][part]:
                json.loads((await store.claim(p, True)).result)

        async def machine_alone(rep: int, part: slice) -> None:
            for call in made[MACHINE][rep][part]:
                (await drive_plan(machine, machine.begin(call))).result()

        variants = {FLOOR: plain(floor), LEAST: plain(least), SYNC: sync_replay, ASYNC: async_replay,
                    STORE: store_alone, MACHINE: machine_alone, UNLEDGERED: unledgered_replay}
        out: dict[str, list[float]] = {name: [] for name in variants}
        try:
            for rep in range(reps + 1):
                spent = dict.fromkeys(variants, 0.0)
                order = list(variants)[rep % len(variants):] + list(variants)[:rep % len(variants)]
                for s in range(SLICES):
                    part = slice(s * calls // SLICES, (s + 1) * calls // SLICES)
                    for name in order:
                        started = time.perf_counter()
                        await variants[name](rep, part)
                        spent[name] += time.perf_counter() - started
                for name, total in spent.items():
                    if rep:
                        out[name].append(1e6 * total / calls)
        finally:
            await guard.aclose()
            await unledgered.aclose()
        return out

    try:
        out = asyncio.run(replays())
    finally:
        conn.close()
    if runs != len(tasks) * calls * (reps + 1):  # every body ran once, at the filling; no replay ran one
        raise SystemExit(f"benchmarks.least: the bodies ran {runs} times, expected {len(tasks) * calls * (reps + 1)}")
    return out


class _scoped:
    """The least guard's task id, in a context variable as agentguard's is."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id

    def __enter__(self) -> None:
        self.token = _task.set(self.task_id)

    def __exit__(self, *exc: object) -> None:
        _task.reset(self.token)


def report(out: dict[str, list[float]], synchronous: str) -> str:
    def ratio(name: str) -> list[float]:
        return [a / f for a, f in zip(out[name], out[FLOOR], strict=True)]

    lines = [f"== The least guard (SQLite, synchronous={synchronous}; replays of records no cache has seen)",
             f"{'variant':52} {'µs/call':>8} {'÷ floor':>8}  middle half of the reps", "-" * 96]
    for name, values in out.items():
        r = ratio(name)
        q1, _, q3 = statistics.quantiles(r, n=4) if len(r) > 1 else (r[0], r[0], r[0])
        lines.append(f"{name:52} {statistics.median(values):8.1f} {statistics.median(r):7.2f}×  {q1:.2f}–{q3:.2f}")
    least = statistics.median(ratio(LEAST))
    lines.append(f"the issue's limit for a replay: {LIMIT}× the floor; the least guard "
                 f"{'is within it' if least <= LIMIT else 'is already past it'} ({least:.2f}×)")
    def beyond(name: str, than: str) -> float:
        return statistics.median(a - b for a, b in zip(out[name], out[than], strict=True))

    for name in (SYNC, ASYNC):
        lines.append(f"{name}: its own work beyond the least guard's {beyond(name, LEAST):.1f} µs a call")
    lines.append(f"an async tool's replay by layer, µs a call: the store beyond the floor {beyond(STORE, FLOOR):.1f},"
                 f" the machine beyond the store {beyond(MACHINE, STORE):.1f}, the rest of the call beyond the"
                 f" machine {beyond(ASYNC, MACHINE):.1f}, of which the ledger's entry {beyond(ASYNC, UNLEDGERED):.1f};"
                 f" the limit leaves"
                 f" {(LIMIT - 1) * statistics.median(out[FLOOR]):.1f} for all of them")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m benchmarks.least", description=__doc__.split("\n\n")[1])
    ap.add_argument("--calls", type=int, default=800, help="replays per variant per rep (default 800)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--synchronous", default="NORMAL", choices=("NORMAL", "FULL"))
    args = ap.parse_args()
    pin_one_cpu()
    with tempfile.TemporaryDirectory() as folder:
        print(report(measure(Path(folder) / "least.db", args.synchronous, args.calls, args.reps), args.synchronous))
