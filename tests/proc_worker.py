"""A worker process for the multi-process tests: one guarded charge against a shared store.

    python tests/proc_worker.py URL TASK EFFECTS MODE [--lease S] [--on-conflict wait|raise] [--sleep S]

It prints ``ready`` once its store is warm and waits for a line on stdin (the barrier), then calls the
tool and prints one JSON line with what happened. The tool body appends its downstream key to EFFECTS
(one line per side effect) and, in MODE ``hang``, announces ``started`` and sleeps for ``--sleep``
seconds, so the parent can SIGKILL or SIGSTOP it mid-call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from agentguard import Guard, GuardError, task


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("task_id")
    p.add_argument("effects")
    p.add_argument("mode", choices=["once", "hang"])
    p.add_argument("--lease", type=float, default=30.0)
    p.add_argument("--on-conflict", default="wait")
    p.add_argument("--sleep", type=float, default=0.3)
    args = p.parse_args()
    asyncio.run(run(args))


async def run(args: argparse.Namespace) -> None:
    async with Guard(args.url, lease=args.lease, on_conflict=args.on_conflict) as guard:

        @guard.once(key=["order_id"])
        async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, object]:
            with open(args.effects, "a") as f:  # noqa: ASYNC230 - one tiny append, the side effect itself
                f.write(idempotency_key + "\n")
            if args.mode == "hang":
                print("started", flush=True)
            await asyncio.sleep(args.sleep)
            return {"order_id": order_id, "amount_cents": amount_cents, "pid": os.getpid(),
                    "key": idempotency_key}

        await guard.ensure_schema()
        print("ready", flush=True)
        sys.stdin.readline()
        with task(args.task_id):
            try:
                result = await charge("o-1", 4900)
                print(json.dumps({"ok": result}), flush=True)
            except GuardError as exc:
                print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)


if __name__ == "__main__":
    main()
