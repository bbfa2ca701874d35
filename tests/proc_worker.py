"""A worker process for the multi-process tests: one guarded charge against a shared store.

    python tests/proc_worker.py URL TASK EFFECTS MODE [--lease S] [--on-conflict wait|raise] [--sleep S]
        [--keyless] [--sync] [--run] [--on-unknown hold|retry|reconcile]

It prints ``ready`` once its store is warm and waits for a line on stdin (the barrier), then calls the
tool and prints one JSON line with what happened. The tool body appends its downstream key to EFFECTS
(one line per side effect) and, in MODE ``hang``, announces ``started`` and sleeps for ``--sleep``
seconds, so the parent can SIGKILL or SIGSTOP it mid-call. ``--keyless``: the tool takes no injected key
(it reads ``current_key()``), so its key cannot reach the provider; ``--sync``: a sync tool; ``--on-unknown
reconcile``: its reconcile answers that the provider has a charge under the key (``{"reconciled": key}``);
``--run``: the body guarded with ``Guard.run`` (``--on-unknown`` hold or retry), as adapters guard a tool object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from agentguard import Guard, GuardError, Operation, current_key, task


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("task_id")
    p.add_argument("effects")
    p.add_argument("mode", choices=["once", "hang"])
    p.add_argument("--lease", type=float, default=30.0)
    p.add_argument("--on-conflict", default="wait")
    p.add_argument("--sleep", type=float, default=0.3)
    p.add_argument("--keyless", action="store_true")
    p.add_argument("--sync", action="store_true")
    p.add_argument("--run", action="store_true")
    p.add_argument("--on-unknown", default="hold", choices=["hold", "retry", "reconcile"])
    args = p.parse_args()
    asyncio.run(run(args))


async def run(args: argparse.Namespace) -> None:
    async with Guard(args.url, lease=args.lease, on_conflict=args.on_conflict) as guard:

        def effect(key: str) -> dict[str, object]:
            with open(args.effects, "a") as f:
                f.write(key + "\n")
            if args.mode == "hang":
                print("started", flush=True)
            return {"order_id": "o-1", "amount_cents": 4900, "pid": os.getpid(), "key": key}

        async def reconcile(op: Operation, step: str, key: str) -> dict[str, object]:
            return {"reconciled": key, "step": step, "attempt": op.attempt}

        options: dict[str, Any] = {"key": ["order_id"], "operation": "charge", "on_unknown": args.on_unknown}
        if args.on_unknown == "reconcile":
            options["reconcile"] = reconcile
        if args.run:  # Guard.run, as the adapters that guard a framework's tool object call it

            async def charge_run(order_id: str, amount_cents: int) -> Any:
                async def body(key: str) -> dict[str, object]:
                    done = effect(key)
                    await asyncio.sleep(args.sleep)
                    return done

                on_unknown = "retry" if args.on_unknown == "retry" else "hold"
                return (await guard.run("charge", body, arguments={"order_id": order_id, "amount_cents": amount_cents},
                                        key={"order_id": order_id}, on_unknown=on_unknown)).value

            charge: Any = charge_run
        elif args.keyless and args.sync:

            def charge_sync(order_id: str, amount_cents: int) -> dict[str, object]:
                done = effect(current_key())
                time.sleep(args.sleep)
                return done

            charge = guard.once(**options)(charge_sync)
        elif args.keyless:

            async def charge_async(order_id: str, amount_cents: int) -> dict[str, object]:
                done = effect(current_key())
                await asyncio.sleep(args.sleep)
                return done

            charge = guard.once(**options)(charge_async)
        elif args.sync:

            def charge_sync_key(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, object]:
                done = effect(idempotency_key)
                time.sleep(args.sleep)
                return done

            charge = guard.once(**options)(charge_sync_key)
        else:

            async def charge_key(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, object]:
                done = effect(idempotency_key)
                await asyncio.sleep(args.sleep)
                return done

            charge = guard.once(**options)(charge_key)

        await guard.ensure_schema()
        print("ready", flush=True)
        sys.stdin.readline()
        with task(args.task_id):
            try:
                if args.sync:
                    result = await asyncio.to_thread(charge, "o-1", 4900)
                else:
                    result = await charge("o-1", 4900)
                print(json.dumps({"ok": result}), flush=True)
            except GuardError as exc:
                print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)


if __name__ == "__main__":
    main()
