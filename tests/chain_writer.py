"""A worker process for the hash chain's concurrency test: many ledger writers of one scope at once.

    python tests/chain_writer.py URL TAG THREADS CALLS

Each of THREADS threads has a guard of its own (its own ledger writer, on its own portal loop) and makes CALLS
guarded calls, each of a task of its own, in the scope ``default``; the ledger's writer writes every few
milliseconds rather than every 0.2 s, so that many small batches of every writer interleave. Prints ``ready``
once every guard is warm, waits for a line on stdin (the barrier), and prints ``done`` once every guard closed
(flushed).
"""

from __future__ import annotations

import asyncio
import sys
import threading

import agentguard._ledger as ledger_mod
from agentguard import Guard, task

ledger_mod.INTERVAL = 0.002


def main() -> None:
    url, tag, threads, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    warm, go = threading.Barrier(threads + 1), threading.Event()
    errors: list[BaseException] = []

    async def writer(n: int) -> None:
        async with Guard(url) as guard:

            @guard.once(key=["i"])
            async def charge(i: int) -> int:
                return i

            await guard.ensure_schema()
            warm.wait()
            await asyncio.to_thread(go.wait)
            for i in range(calls):
                with task(f"{tag}-{n}-{i}"):
                    await charge(i)
                await asyncio.sleep(0)

    def run(n: int) -> None:
        try:
            asyncio.run(writer(n))
        except BaseException as exc:
            errors.append(exc)
            raise

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    warm.wait()
    print("ready", flush=True)
    sys.stdin.readline()
    go.set()
    for w in workers:
        w.join()
    print("failed" if errors else "done", flush=True)


if __name__ == "__main__":
    main()
