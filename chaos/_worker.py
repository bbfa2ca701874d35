"""One worker process of the chaos fleet: a scripted agent's calls through the guard.

    python -m chaos._worker STORE_URL PROVIDER_URL SCRIPT RESULTS [--lease S]

SCRIPT is a JSON list of calls ``[task_id, tool, order_id, amount]``; the worker makes each one, as an agent
does: it retries a call that was refused or failed (``InProgressError``, ``LeaseLostError``, ``StoreError``,
the provider's refusal) until it gets a result, and writes one JSON line per answer to RESULTS (a result,
replayed or not, or the error's type), and one per guard event. Two tools: ``charge`` (one provider call
with the downstream key) and ``book`` (a multi-step operation whose step calls the provider with its
sub-key). A worker killed mid-script is started again by the runner and makes its script again from the
top: every answer it already had is a replay now.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from typing import Any

from agentguard import Guard, GuardError, GuardEvent, InProgressError, LeaseLostError, Operation, StoreError, task

from ._provider import ProviderError, charge

CLEAR = (InProgressError, LeaseLostError, StoreError, ProviderError)  # what a caller may be told instead


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("provider")
    p.add_argument("script")
    p.add_argument("results")
    p.add_argument("--lease", type=float, default=2.0)
    args = p.parse_args()
    with open(args.script) as f:
        script = [tuple(c) for c in json.load(f)]
    asyncio.run(run(args, script))


async def run(args: argparse.Namespace, script: list[tuple[str, str, str, int]]) -> None:
    out = open(args.results, "a", buffering=1)  # noqa: SIM115, ASYNC230 - a line per answer, flushed as written
    rng = random.Random(os.getpid())

    def write(**line: Any) -> None:
        out.write(json.dumps(line) + "\n")

    def on_event(event: GuardEvent) -> None:
        if event.kind in ("takeover", "replayed", "lease_lost", "released", "claimed"):
            write(event=event.kind, task=event.task_id, attempt=event.attempt, pid=os.getpid(), t=time.time())

    async with Guard(args.url, lease=args.lease, on_event=on_event, connect_timeout=5, cache_size=0) as guard:

        async def body_time() -> None:
            await asyncio.sleep(rng.uniform(0.1, 0.5))  # the work after the provider call

        @guard.once(key="order_id")
        async def charge_order(order_id: str, amount: int, idempotency_key: str = "") -> dict[str, Any]:
            write(body=order_id, pid=os.getpid(), t=time.time())
            answer = await charge(args.provider, idempotency_key, order_id, amount)
            await body_time()
            return {"order": order_id, "charge": answer["id"], "amount": amount}

        @guard.once(operation="book", key="order_id")
        async def book(order_id: str, amount: int, op: Operation) -> dict[str, Any]:
            answer = await op.step("charge", charge, args.provider, op.key("charge"), order_id, amount)
            await body_time()
            return {"order": order_id, "charge": answer["id"], "amount": amount, "booked": True}

        tools = {"charge": charge_order, "book": book}
        print("ready", flush=True)
        for task_id, tool, order_id, amount in script:
            await asyncio.sleep(rng.uniform(0.05, 0.3))  # the model thinks before its next call
            for _ in range(2000):
                try:
                    with task(task_id):
                        result = await tools[tool](order_id, amount)
                    write(op=task_id, result=result)
                    break
                except CLEAR as exc:
                    write(op=task_id, error=type(exc).__name__, body_ran=bool(getattr(exc, "body_ran", False)))
                except GuardError as exc:  # any other refusal is a failure of the run: say so, and stop
                    write(op=task_id, error=type(exc).__name__, unexpected=str(exc))
                    raise
                await asyncio.sleep(rng.uniform(0.05, 0.2))
            else:
                write(op=task_id, error="gave up")
                sys.exit(3)
    write(done=True)
    out.close()


if __name__ == "__main__":
    main()
