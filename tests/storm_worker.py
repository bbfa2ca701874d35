"""The storms' processes (``tests/core/test_storm.py``).

    python tests/storm_worker.py URL INDEX TASK EFFECTS GO ROUNDS
    python tests/storm_worker.py --cold URL CALLERS POOL_SIZE

The first is one process of the process storm: a guarded charge on a shared store, once per round.

For each round ``r`` it opens the FIFO ``GO.r`` (the barrier: the parent releases every process at once with
one write of a byte for each), prints ``ready r``, reads its byte, then calls the charge of order ``o-r`` and
prints one JSON line: the result, or the error. Round by round it alternates between the sync tool (called in
a thread, as a sync framework calls it) and the async one: the same operation, so in every round sync and
async callers of different processes race for one record. The body appends its downstream key to EFFECTS
(one line per execution: ``O_APPEND`` keeps the processes' lines whole).

``--cold``: a new guard's first sync calls (a service started as requests arrive: its first call alone, then a
burst), in a process of their own (nothing of the store's drivers imported yet): CALLERS threads released by
one barrier call a sync tool on one key; it prints one JSON line: the burst's executions, the callers'
distinct results and errors, and the database connections dropped while open (``ResourceWarning``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import uuid
import warnings
from typing import Any

from agentguard import Guard, GuardError, task


def main() -> None:
    if sys.argv[1] == "--cold":
        cold(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("index", type=int)
    p.add_argument("task_id")
    p.add_argument("effects")
    p.add_argument("go")
    p.add_argument("rounds", type=int)
    asyncio.run(run(p.parse_args()))


def effect(path: str, key: str, order_id: str) -> dict[str, str]:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{key}\n".encode())
    finally:
        os.close(fd)
    return {"order": order_id, "key": key, "pid": str(os.getpid()), "nonce": uuid.uuid4().hex}


async def run(args: argparse.Namespace) -> None:
    async with Guard(args.url, wait_timeout=120, cache_size=0) as guard:

        @guard.once(key="order_id", operation="charge")
        def charge(order_id: str, idempotency_key: str = "") -> dict[str, str]:
            done = effect(args.effects, idempotency_key, order_id)
            time.sleep(0.05)  # the claim stays live while the others arrive
            return done

        @guard.once(key="order_id", operation="charge")
        async def acharge(order_id: str, idempotency_key: str = "") -> dict[str, str]:
            done = effect(args.effects, idempotency_key, order_id)
            await asyncio.sleep(0.05)
            return done

        def warm() -> None:
            with task(f"warm-{args.index}"):
                charge("w-sync")

        with task(f"warm-{args.index}"):  # both paths connected and the schema made before the storm
            await acharge("w-async")
        await asyncio.to_thread(warm)

        for r in range(args.rounds):
            fd = os.open(f"{args.go}.{r}", os.O_RDONLY)  # (the parent holds it open: this does not block)
            sync = (args.index + r) % 2 == 0
            print(f"ready {r}", flush=True)
            try:
                if sync:

                    def released(order_id: str, fd: int = fd) -> dict[str, str]:
                        os.read(fd, 1)
                        with task(args.task_id):
                            return charge(order_id)

                    result = await asyncio.to_thread(released, f"o-{r}")
                else:
                    await asyncio.to_thread(os.read, fd, 1)
                    with task(args.task_id):
                        result = await acharge(f"o-{r}")
                line: dict[str, object] = {"round": r, "sync": sync, "result": result}
            except GuardError as exc:
                line = {"round": r, "sync": sync, "error": f"{type(exc).__name__}: {exc}"}
            finally:
                os.close(fd)
            print(json.dumps(line), flush=True)


def cold(url: str, callers: int, pool_size: int) -> None:
    warnings.simplefilter("always", ResourceWarning)
    runs: list[str] = []
    results: list[Any] = [None] * callers
    barrier = threading.Barrier(callers)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", ResourceWarning)
        guard = Guard(url, pool_size=pool_size, wait_timeout=120, cache_size=0)

        @guard.once(key="order_id")
        def charge(order_id: str, idempotency_key: str = "") -> dict[str, str]:
            runs.append(order_id)
            time.sleep(0.05)
            return {"order": order_id, "key": idempotency_key, "nonce": uuid.uuid4().hex}

        with task("t-first"):
            charge("o-first")  # the service's first call, alone (its store's schema is made)
        runs.clear()

        def call(i: int) -> None:
            try:
                barrier.wait(120)
                with task("t-cold"):
                    results[i] = charge("o-cold")
            except BaseException as exc:
                results[i] = f"{type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=call, args=(i,)) for i in range(callers)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
        finally:
            guard.close()
    leaked = [str(w.message) for w in warned if issubclass(w.category, ResourceWarning)]
    print(json.dumps({"executions": len(runs), "results": len({json.dumps(r) for r in results}),
                      "errors": [r for r in results if isinstance(r, str)][:3], "leaked": len(leaked),
                      "leak": leaked[:1]}), flush=True)


if __name__ == "__main__":
    main()
