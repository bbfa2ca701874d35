"""``agentguard demo``: a scripted agent re-invokes a charge tool against a fake provider, offline.

It retries sequentially, fires identical calls in parallel, crashes mid-call (a real SIGKILL of a worker
process after the provider charged) and resumes, and reuses a key with a different amount. The provider
honours idempotency keys like Stripe. At the end the ledger shows one charge per order, and the demo prints
the two commands that show what agentguard recorded: the task's timeline and the crashed charge's record.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ._context import task
from ._errors import GuardError, KeyReuseError
from ._events import GuardEvent
from ._guard import Guard

LEASE = 2.0


class Charge(BaseModel):
    id: str
    order_id: str
    amount_cents: int


class FakeProvider:
    """A payment provider that deduplicates on the idempotency key, persisted in SQLite."""

    def __init__(self, path: str) -> None:
        self.path = path
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS charges (id TEXT PRIMARY KEY, idem TEXT UNIQUE,"
                       " order_id TEXT, amount_cents INTEGER)")
            db.execute("CREATE TABLE IF NOT EXISTS requests (idem TEXT, deduplicated INTEGER)")

    def charge(self, order_id: str, amount_cents: int, idempotency_key: str) -> Charge:
        with sqlite3.connect(self.path, timeout=30, isolation_level=None) as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT id, order_id, amount_cents FROM charges WHERE idem = ?",
                             (idempotency_key,)).fetchone()
            db.execute("INSERT INTO requests VALUES (?, ?)", (idempotency_key, row is not None))
            if row is None:
                row = ("ch_" + uuid.uuid4().hex[:12], order_id, amount_cents)
                db.execute("INSERT INTO charges VALUES (?, ?, ?, ?)", (row[0], idempotency_key, *row[1:]))
            db.execute("COMMIT")
        return Charge(id=row[0], order_id=row[1], amount_cents=row[2])

    def ledger(self) -> tuple[list[tuple[str, str, int]], int, int]:
        with sqlite3.connect(self.path) as db:
            charges = db.execute("SELECT id, order_id, amount_cents FROM charges ORDER BY order_id").fetchall()
            total, dedup = db.execute("SELECT COUNT(*), COALESCE(SUM(deduplicated), 0) FROM requests").fetchone()
        return charges, int(total), int(dedup)


def build(guard: Guard, provider: FakeProvider, crash: bool = False) -> Any:
    @guard.once(key=["order_id"])
    async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> Charge:
        result = await asyncio.to_thread(provider.charge, order_id, amount_cents, idempotency_key)
        if crash:  # the worker dies after the provider charged, before agentguard records the result
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    return charge


async def _crash_child(url: str, provider_path: str, task_id: str) -> None:
    async with Guard(url, lease=LEASE) as guard:
        charge = build(guard, FakeProvider(provider_path), crash=True)
        with task(task_id):
            await charge("o-3", 1500)


async def _demo(url: str | None) -> int:
    events: list[GuardEvent] = []
    with tempfile.TemporaryDirectory(prefix="agentguard-demo-") as tmp:
        return await _scripted_agent(url, FakeProvider(str(Path(tmp) / "provider.db")), events)


async def _scripted_agent(url: str | None, provider: FakeProvider, events: list[GuardEvent]) -> int:
    run = uuid.uuid4().hex[:6]
    task_id = f"ticket-{run}"
    async with Guard(url, lease=LEASE, on_event=events.append) as guard:
        await _story(guard, url, provider, task_id, events)
        looks = await _look(guard, url, task_id, events)
    charges, requests, dedup = provider.ledger()
    print(f"\nProvider ledger ({requests} requests reached it, {dedup} deduplicated by key):")
    for cid, order, amount in charges:
        print(f"   {cid}  order {order}  {amount / 100:.2f}")
    orders = {order for _, order, _ in charges}
    ok = len(charges) == len(orders) == 3
    print(f"\n{'OK' if ok else 'FAILED'}: {len(charges)} charges for {len(orders)} orders"
          f" (11 tool calls by the agent).")
    if looks:
        print("\nWhat agentguard recorded:")
        width = max(len(cmd) for cmd, _ in looks)
        for cmd, what in looks:
            print(f"   {cmd.ljust(width)}   # {what}")
    return 0 if ok else 1


async def _story(guard: Guard, url: str | None, provider: FakeProvider, task_id: str,
                 events: list[GuardEvent]) -> None:
    """The scripted agent's four scenes, told as they happen."""
    charge = build(guard, provider)
    print(f"agentguard demo: store {guard.url}  task {task_id}\n")

    def said(kind: str) -> int:
        return sum(e.kind == kind for e in events)

    async with task(task_id):
        print("1. The agent retries charge(o-1, 4900) three times (a timeout, then it forgot):")
        for attempt in range(1, 4):
            before = said("replayed")
            c = await charge("o-1", 4900)
            print(f"   attempt {attempt}: {'replayed' if said('replayed') > before else 'ran     '}  -> {c.id}")

        print("\n2. The model emits five identical calls in one turn, run in parallel (o-2):")
        before = said("replayed")
        results = await asyncio.gather(*(charge("o-2", 2500) for _ in range(5)))
        replayed = said("replayed") - before
        print(f"   5 calls -> {len({r.id for r in results})} charge ({results[0].id}): "
              f"{5 - replayed} ran, {replayed} waited for it and replayed")

        print("\n3. A worker crashes mid-call (real SIGKILL after the provider charged o-3):")
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentguard._demo", "--crash-child", url or "", provider.path, task_id
        )
        code = await child.wait()
        print(f"   worker exited with signal {-code}; its claim is held until the lease "
              f"({LEASE:g}s) runs out")
        c = await charge("o-3", 1500)
        print(f"   the resumed agent took over with the same key -> {c.id} "
              f"(the provider deduplicated: {said('takeover')} takeover)")

        print("\n4. The model calls charge(o-1) again with another amount:")
        try:
            await charge("o-1", 9900)
        except KeyReuseError as exc:
            print(f"   refused, nothing executed: {exc}")


async def _look(guard: Guard, url: str | None, task_id: str, events: list[GuardEvent]) -> list[tuple[str, str]]:
    """The commands that show the task's timeline and the crashed charge's record (its key by the shortest
    start, of at least 10 characters, that no other key shares), with the store's --url if the demo was
    given one (else they read the same $AGENTGUARD_URL or default store)."""
    from ._storeconfig import StoreRef, store_args
    from .stores import SQLStore, _prefixes

    taken = [e.key for e in events if e.kind == "takeover"]
    if len(taken) != 1:
        return []
    key, n = taken[0], 10
    if isinstance(guard._store, SQLStore):
        while n < len(key) and len(await _prefixes.keys(guard._store, key[:n], scope=None, limit=2)) > 1:
            n += 4
    where = f" {store_args(StoreRef(url))}" if url else ""
    return [(f"agentguard timeline {task_id}{where}", "every attempt of the task, in order"),
            (f"agentguard show {key[:n]}{where}", "the charge of o-3: the crash, the takeover, its result")]


def run_demo(url: str | None) -> int:
    try:
        return asyncio.run(_demo(url))
    except GuardError as exc:
        print(f"agentguard demo failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--crash-child":
        asyncio.run(_crash_child(sys.argv[2] or None, sys.argv[3], sys.argv[4]))  # type: ignore[arg-type]
    else:
        sys.exit(run_demo(None))
