"""One worker process of the chaos fleet: a scripted agent's calls through the guard.

    python -m chaos._worker STORE_URL PROVIDER_URL SCRIPT RESULTS [--lease S] [--tools KIND] [--threads N]

SCRIPT is a JSON list of calls ``[task_id, tool, order_id, amount]``; the worker makes each one, as an agent
does: it retries a call that was refused or failed (``InProgressError``, ``LeaseLostError``, ``StoreError``,
the provider's refusal) until it gets a result, and writes one JSON line per answer to RESULTS (a result,
replayed or not, or the error's type), and one per guard event. Two tools: ``charge`` (one provider call
with the downstream key) and ``book`` (a multi-step operation whose step calls the provider with its
sub-key). A worker killed mid-script is started again by the runner and makes its script again from the
top: every answer it already had is a replay now.

``--tools`` says how the worker calls them, so that every way a tool runs meets the faults:

- ``async`` (the default): both tools async, one call at a time on the process's event loop;
- ``threads``: ``charge`` a sync tool, called by ``--threads`` threads at once (each goes over every charge of
  the script, from another place in it), while ``book`` runs on the event loop of the main thread, in the
  same guard;
- ``sync``: ``charge`` a sync tool called by the main thread, no event loop in the process (the script's
  bookings are left out: a multi-step tool is async);
- ``gathered``: both tools async, ``GATHERED_CALLERS`` callers at once on the event loop (the script's calls in
  rounds, one each), on a pool of one (three connections): the callers start each round's calls together and
  their bodies end together, so that the claims and the completions of those who find every connection in use
  go as one statement each (Postgres gathers them; the runner gives such a worker operations of its own first,
  which no other worker runs before it). A line is written for each such
  statement, seen from outside the library (the driver's ``fetch``), so the run shows that its faults met it.

The sync ``charge`` is the same operation as the async one (name, key field, arguments, result), so sync
and async callers in other processes race for the same records. A sync caller's thread that opens a
database connection of its own (its claim and completion made in that thread) writes a line saying so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import functools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from agentguard import Guard, GuardError, GuardEvent, InProgressError, LeaseLostError, Operation, StoreError, task

from ._provider import ProviderError, charge, charge_sync

CLEAR = (InProgressError, LeaseLostError, StoreError, ProviderError)  # what a caller may be told instead
KINDS = ("async", "threads", "sync", "gathered")
GATHERED_CALLERS = 6  # a gathered worker's callers: twice its lane's three connections


class Round:
    """A gathered worker's round: its bodies end together, once every caller of the round has reached its body
    or ended its call without one (a replay, a refusal); a body waits at most ``Round.WAIT`` seconds for the
    others (a caller whose call waits out another worker's claim). Counted, not timed: on a loaded
    machine the round's claims may take longer than any fixed moment, and bodies that trickled out would meet a
    free connection each (no gathered completion)."""

    WAIT = 3.0

    def __init__(self, callers: int) -> None:
        self.callers = callers
        self.there: set[int] = set()
        self.ended = asyncio.Event()

    def reached(self, n: int) -> None:
        self.there.add(n)
        if len(self.there) >= self.callers:
            self.ended.set()

    async def body_ends(self, n: int) -> None:
        self.reached(n)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ended.wait(), self.WAIT)


# A gathered worker's caller: the round of its call, and its number in it.
ROUND: contextvars.ContextVar[tuple[Round, int] | None] = contextvars.ContextVar("round", default=None)
TRIES = 2000
STOP = threading.Event()  # a caller of this process failed the run: the others stop too

T = TypeVar("T")


class GaveUp(Exception):
    """A call that got no result in ``TRIES`` tries."""


class Lines:
    """RESULTS: one JSON line per answer or event, flushed as written (a SIGKILL loses at most one line, cut
    short), from any thread."""

    def __init__(self, path: str) -> None:
        self._out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the life of the process
        self._lock = threading.Lock()

    def write(self, **line: Any) -> None:
        text = json.dumps(line) + "\n"
        with self._lock:
            self._out.write(text)

    def close(self) -> None:
        self._out.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("provider")
    p.add_argument("script")
    p.add_argument("results")
    p.add_argument("--lease", type=float, default=2.0)
    p.add_argument("--tools", choices=KINDS, default="async")
    p.add_argument("--threads", type=int, default=4)
    args = p.parse_args()
    with open(args.script) as f:
        script = [tuple(c) for c in json.load(f)]
    out = Lines(args.results)
    if args.tools == "sync":
        _witness_connections(out, {threading.current_thread()})
        run_sync(args, script, out)
    else:
        asyncio.run(run(args, script, out))
    out.write(done=True)
    out.close()


def _witness_connections(out: Lines, callers: set[threading.Thread]) -> None:
    """Write a line whenever a sync caller's thread opens a database connection (stdlib sqlite3 or psycopg):
    its claims and completions run in that thread, not only on the guard's loop. Seen from outside the
    library, so the run shows which executor its faults met."""
    import importlib

    for name in ("sqlite3", "psycopg"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        real = getattr(module, "connect")  # noqa: B009 - (psycopg's is not typed as an attribute)

        def connect(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            if threading.current_thread() in callers:
                out.write(own_connection=_name, thread=threading.current_thread().name, pid=os.getpid())
            return _real(*args, **kwargs)

        setattr(module, "connect", connect)  # noqa: B010


def _witness_gathered(out: Lines) -> None:
    """Write a line whenever a statement for many callers goes to Postgres (the claims' ``INSERT ... SELECT FROM
    unnest``, one statement; the completions' ``UPDATE``, once per caller in one pipeline): seen from outside the
    library, as the driver's ``fetch`` and ``fetchmany`` are called, so the run shows that its faults met the
    gathered statements."""
    try:
        import asyncpg  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return
    real, real_many = asyncpg.Connection.fetch, asyncpg.Connection.fetchmany

    async def fetch(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        rows = await real(self, query, *args, **kwargs)
        if "unnest(" in query and query.startswith("INSERT INTO agentguard_calls "):
            out.write(gathered="claim", callers=len(args[0]) if args else 0, pid=os.getpid())
        return rows

    async def fetchmany(self: Any, query: str, args: Any, **kwargs: Any) -> Any:
        rows = await real_many(self, query, args, **kwargs)
        if "UPDATE agentguard_calls SET state" in query:
            out.write(gathered="complete", callers=len(args), pid=os.getpid())
        return rows

    asyncpg.Connection.fetch, asyncpg.Connection.fetchmany = fetch, fetchmany


def _on_event(out: Lines) -> Callable[[GuardEvent], None]:
    def on_event(event: GuardEvent) -> None:
        if event.kind in ("takeover", "replayed", "lease_lost", "released", "claimed"):
            out.write(event=event.kind, task=event.task_id, attempt=event.attempt, pid=os.getpid(), t=time.time())

    return on_event


def _tried(out: Lines, task_id: str, exc: Exception) -> None:
    """Note a failed try: a clear error (the caller tries again), or any other refusal (the run fails)."""
    if isinstance(exc, CLEAR):
        out.write(op=task_id, error=type(exc).__name__, body_ran=bool(getattr(exc, "body_ran", False)))
        return
    out.write(op=task_id, error=type(exc).__name__, unexpected=str(exc))
    raise exc


async def call_async(out: Lines, rng: random.Random, task_id: str, call: Callable[[], Awaitable[T]]) -> T:
    """An agent's async call: tried again after a clear error until it gets a result."""
    for _ in range(TRIES):
        try:
            with task(task_id):
                result = await call()
            out.write(op=task_id, result=result)
            return result
        except (*CLEAR, GuardError) as exc:
            _tried(out, task_id, exc)
        await asyncio.sleep(rng.uniform(0.05, 0.2))
    out.write(op=task_id, error="gave up")
    raise GaveUp(task_id)


def call_sync(out: Lines, rng: random.Random, task_id: str, call: Callable[[], T]) -> T:
    """``call_async`` for a sync tool, in the calling thread."""
    for _ in range(TRIES):
        if STOP.is_set():
            raise GaveUp(f"{task_id}: another caller failed")
        try:
            with task(task_id):
                result = call()
            out.write(op=task_id, result=result)
            return result
        except (*CLEAR, GuardError) as exc:
            _tried(out, task_id, exc)
        time.sleep(rng.uniform(0.05, 0.2))
    out.write(op=task_id, error="gave up")
    raise GaveUp(task_id)


def _sync_charge(guard: Guard, args: argparse.Namespace, out: Lines,
                 rngs: threading.local) -> Callable[..., dict[str, Any]]:
    """The sync ``charge`` tool: the same operation as the async one in ``run`` (``rngs.rng``: the calling
    thread's random choices)."""

    @guard.once(key="order_id")
    def charge_order(order_id: str, amount: int, idempotency_key: str = "") -> dict[str, Any]:
        out.write(body=order_id, tools="sync", pid=os.getpid(), t=time.time())
        answer = charge_sync(args.provider, idempotency_key, order_id, amount)
        time.sleep(rngs.rng.uniform(0.1, 0.5))  # the work after the provider call
        return {"order": order_id, "charge": answer["id"], "amount": amount}

    return charge_order


async def run(args: argparse.Namespace, script: list[tuple[str, str, str, int]], out: Lines) -> None:
    rng = random.Random(os.getpid())
    threads: list[threading.Thread] = []
    failed: list[BaseException] = []

    gathered = args.tools == "gathered"
    if gathered:
        _witness_gathered(out)
    async with Guard(args.url, lease=args.lease, on_event=_on_event(out), connect_timeout=5, cache_size=0,
                     **({"pool_size": 1} if gathered else {})) as guard:

        async def body_time() -> None:
            mine = ROUND.get()
            if mine is None:
                await asyncio.sleep(rng.uniform(0.1, 0.5))  # the work after the provider call
            else:  # (a gathered worker's: every body of the round ends at once)
                await mine[0].body_ends(mine[1])

        @guard.once(key="order_id")
        async def charge_order(order_id: str, amount: int, idempotency_key: str = "") -> dict[str, Any]:
            out.write(body=order_id, tools="async", pid=os.getpid(), t=time.time())
            answer = await charge(args.provider, idempotency_key, order_id, amount)
            await body_time()
            return {"order": order_id, "charge": answer["id"], "amount": amount}

        # A step cut short by a death runs again: its sub-key reaches the provider, which honours it (the default,
        # "hold", would leave it for a person: an OutcomeUnknownError, a failure of the run).
        @guard.once(operation="book", key="order_id", on_unknown="retry")
        async def book(order_id: str, amount: int, op: Operation) -> dict[str, Any]:
            out.write(body=order_id, tools="async", pid=os.getpid(), t=time.time())
            answer = await op.step("charge", charge, args.provider, op.key("charge"), order_id, amount)
            await body_time()
            return {"order": order_id, "charge": answer["id"], "amount": amount, "booked": True}

        tools: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {"charge": charge_order, "book": book}
        if gathered:
            print("ready", flush=True)
            await _gathered_callers(out, script, tools)
            return
        on_loop = script
        if args.tools == "threads":
            on_loop = [c for c in script if c[1] == "book"]
            threads = _start_threads(guard, args, script, out, failed)
        print("ready", flush=True)
        try:
            for task_id, tool, order_id, amount in on_loop:
                if STOP.is_set():
                    break
                await asyncio.sleep(rng.uniform(0.05, 0.3))  # the model thinks before its next call
                await call_async(out, rng, task_id, functools.partial(tools[tool], order_id, amount))
        except BaseException:
            STOP.set()
            raise
        finally:
            for t in threads:
                await asyncio.to_thread(t.join)
    if failed:
        raise SystemExit(f"a caller's thread failed: {failed[0]!r}")


async def _gathered_callers(out: Lines, script: list[tuple[str, str, str, int]],
                            tools: dict[str, Callable[..., Awaitable[dict[str, Any]]]]) -> None:
    """``GATHERED_CALLERS`` callers at once, the script's calls in rounds of one each: every caller starts its call
    of the round together with the others (a barrier), and the bodies of the round end together (``Round``),
    so their claims and completions meet a lane whose every connection is in use. A caller that fails stops the
    others."""
    barrier = asyncio.Barrier(GATHERED_CALLERS)
    rounds = -(-len(script) // GATHERED_CALLERS)
    each = [Round(min(GATHERED_CALLERS, len(script) - r * GATHERED_CALLERS)) for r in range(rounds)]

    async def caller(n: int) -> None:
        rng = random.Random(os.getpid() * 1000 + n)
        try:
            for r in range(rounds):
                await barrier.wait()
                if r * GATHERED_CALLERS + n >= len(script):
                    continue  # (the last round's calls are fewer than its callers)
                task_id, tool, order_id, amount = script[r * GATHERED_CALLERS + n]
                ROUND.set((each[r], n))
                try:
                    await call_async(out, rng, task_id, functools.partial(tools[tool], order_id, amount))
                finally:
                    each[r].reached(n)  # (ended without a body, or after it: the others need not wait for it)
        except BaseException:
            STOP.set()
            await barrier.abort()
            raise

    await asyncio.gather(*(caller(n) for n in range(GATHERED_CALLERS)))


def _start_threads(guard: Guard, args: argparse.Namespace, script: list[tuple[str, str, str, int]], out: Lines,
                   failed: list[BaseException]) -> list[threading.Thread]:
    """``--threads`` threads calling the sync ``charge`` at once, each over every charge of the script from
    another place in it (so they run bodies side by side, and race on the repeated calls)."""
    rngs = threading.local()
    charge_order = _sync_charge(guard, args, out, rngs)
    charges = [c for c in script if c[1] == "charge"]

    def caller(n: int) -> None:
        rngs.rng = random.Random(os.getpid() * 1000 + n)
        start = n * len(charges) // args.threads
        try:
            for task_id, _, order_id, amount in [*charges[start:], *charges[:start]]:
                if STOP.is_set():
                    return
                time.sleep(rngs.rng.uniform(0.05, 0.3))  # the model thinks before its next call
                call_sync(out, rngs.rng, task_id, functools.partial(charge_order, order_id, amount))
        except BaseException as exc:
            failed.append(exc)
            STOP.set()

    threads = [threading.Thread(target=caller, args=(n,), name=f"caller-{n}") for n in range(args.threads)]
    _witness_connections(out, set(threads))
    for t in threads:
        t.start()
    return threads


def run_sync(args: argparse.Namespace, script: list[tuple[str, str, str, int]], out: Lines) -> None:
    rngs = threading.local()
    rngs.rng = random.Random(os.getpid())
    with Guard(args.url, lease=args.lease, on_event=_on_event(out), connect_timeout=5, cache_size=0) as guard:
        charge_order = _sync_charge(guard, args, out, rngs)
        print("ready", flush=True)
        for task_id, tool, order_id, amount in script:
            if tool != "charge":
                continue  # (a multi-step tool is async: the fleet's other workers book)
            time.sleep(rngs.rng.uniform(0.05, 0.3))  # the model thinks before its next call
            call_sync(out, rngs.rng, task_id, functools.partial(charge_order, order_id, amount))


if __name__ == "__main__":
    try:
        main()
    except GaveUp as exc:
        print(f"gave up on {exc}", file=sys.stderr)
        sys.exit(3)
