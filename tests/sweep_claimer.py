"""A process that makes distinct first calls on a store until told to stop: the claims a sweep runs beside.

    python tests/sweep_claimer.py URL TASK

It prints ``ready`` once its first call is made, calls on until a line arrives on stdin, then prints how many
calls it made after the first and how many times its tool's body ran in all.
"""

from __future__ import annotations

import asyncio
import sys
import threading

from agentguard import Guard, task


async def run(url: str, task_id: str) -> None:
    loop, stop = asyncio.get_running_loop(), asyncio.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_for_stop, daemon=True).start()
    runs = 0
    async with Guard(url) as guard:

        @guard.once(key=["n"])
        async def charge(n: int) -> int:
            nonlocal runs
            runs += 1
            return n

        with task(task_id):
            await charge(-1)
            print("ready", flush=True)
            made = 0
            while not stop.is_set():
                assert await charge(made) == made
                made += 1
    print(made, runs, flush=True)


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], sys.argv[2]))
