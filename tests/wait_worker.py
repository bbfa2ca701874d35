"""A process of waiters for the cross-process wake tests: WAITERS callers of one key that another process holds.

    python tests/wait_worker.py URL TASK WAITERS

Its fallbacks are made slow (a minute), so every look it takes after the waiters are waiting is one the
announcement caused, not a timer. It prints ``listening G`` once all its waiters wait and its poller has marked
the record under listener generation G (after a reconnect, again), then one JSON line: the results, what it
asked of the store (claims, reads, marks) and the announcements its listener heard.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from agentguard import Guard, _machine, _watch, task
from agentguard.stores import SQLStore

_machine.POLL_LISTENING = 60.0
_watch.FALLBACK = 60.0


class Counting:
    """The real store, counting what it is asked."""

    def __init__(self, url: str, waiters: int) -> None:
        self.inner = SQLStore(url)
        self.asked: list[str] = []
        self.waiters, self.waiting, self.generation, self.told = waiters, 0, 0, 0

    def on_event(self, event: Any) -> None:
        if event.kind == "waiting":
            self.waiting += 1
            self.tell()

    def tell(self) -> None:
        """``listening G`` once every waiter waits and the record is marked under generation G."""
        if self.waiting >= self.waiters and self.generation > self.told:
            self.told = self.generation
            print(f"listening {self.generation}", flush=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, params: dict[str, Any], likely_taken: bool = False) -> Any:
        self.asked.append("claim")
        return await self.inner.claim(params, likely_taken)

    async def read(self, scope: str, key: str) -> Any:
        self.asked.append("read")
        return await self.inner.read(scope, key)

    async def watch(self, scope: str, key: str, news: Any) -> int:
        generation: int = await self.inner.watch(scope, key, news)
        self.asked.append("watch")
        if generation > 0:
            self.generation = generation
            self.tell()
        return generation


async def main(url: str, task_id: str, waiters: int) -> None:
    store = Counting(url, waiters)
    async with Guard(store=store, on_event=store.on_event) as guard:  # type: ignore[arg-type]

        @guard.once(key=["order_id"])
        async def charge(order_id: str) -> dict[str, Any]:
            raise AssertionError("a waiter ran the body")

        with task(task_id):
            results = await asyncio.gather(*(charge("o-1") for _ in range(waiters)))
        listener = store.inner._engines.listener()
        for _ in range(200):  # the announcement may arrive just after a look found the outcome
            if listener.heard:
                break
            await asyncio.sleep(0.05)
        print(json.dumps({"results": results, "asked": store.asked, "heard": listener.heard}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
