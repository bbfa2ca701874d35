"""A worker process that starts on a store nobody has used yet (``tests/stores/test_pg_defaults.py``).

    python tests/first_calls_worker.py URL TASK EFFECTS CALLS

It builds its guard (nothing is sent to the store yet), prints ``ready`` and waits for a line on stdin (the
barrier: every worker is released at once), then makes CALLS first calls at once — half of them to an async
tool, half to a sync one (in threads) — each on an order of its own, so that its first statements meet the
other workers' making the schema. Each body appends its downstream key to EFFECTS (one line per execution).
It prints one JSON line: how many calls returned, and the errors of the others.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from agentguard import Guard, GuardError, task


async def run(url: str, task_id: str, effects: str, calls: int) -> None:
    async with Guard(url) as guard:

        def effect(key: str) -> str:
            with open(effects, "a") as f:
                f.write(key + "\n")
            return key

        @guard.once(key="order_id")
        async def charge(order_id: str, idempotency_key: str = "") -> str:
            return effect(idempotency_key)

        @guard.once(key="order_id")
        def charge_sync(order_id: str, idempotency_key: str = "") -> str:
            return effect(idempotency_key)

        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)

        async def one(i: int) -> str | None:
            order = f"o-{os.getpid()}-{i}"
            try:
                async with task(task_id):
                    if i % 2:
                        await asyncio.to_thread(charge_sync, order)
                    else:
                        await charge(order)
                return None
            except GuardError as exc:
                return f"{type(exc).__name__}: {exc}"

        outcomes = await asyncio.gather(*(one(i) for i in range(calls)))
        errors = [e for e in outcomes if e is not None]
        print(json.dumps({"ok": calls - len(errors), "errors": errors}), flush=True)


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
