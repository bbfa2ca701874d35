"""A multi-step tool (Rocket Rides: create the ride row, charge, send the receipt) and a worker process
that runs it and can SIGKILL or SIGSTOP itself at a chosen point.

    python tests/op_worker.py URL TASK PROVIDER_DB RECEIPTS MODE POLICY [--lease S]

MODE: kill_in_tx (after the user's insert, before its commit), kill_after_tx, kill_in_charge (after the
provider charged, inside the foreign call), stop_in_charge (SIGSTOP there), none.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import uuid
from typing import Any

from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agentguard import Guard, GuardError, Operation, task


class Receipt(BaseModel):
    ride_id: str
    charge_id: str


class ChargeResult(BaseModel):
    id: str
    amount_cents: int


class Provider:
    """A fake card processor honouring idempotency keys, in its own SQLite file (shared by processes)."""

    def __init__(self, path: str) -> None:
        self.path = path
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS charges (id TEXT PRIMARY KEY, idem TEXT UNIQUE, amount INTEGER)")
            db.execute("CREATE TABLE IF NOT EXISTS requests (idem TEXT)")

    def charge(self, amount_cents: int, idempotency_key: str) -> ChargeResult:
        with sqlite3.connect(self.path, timeout=30, isolation_level=None) as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO requests VALUES (?)", (idempotency_key,))
            row = db.execute("SELECT id, amount FROM charges WHERE idem = ?", (idempotency_key,)).fetchone()
            if row is None:
                row = ("ch_" + uuid.uuid4().hex[:10], amount_cents)
                db.execute("INSERT INTO charges VALUES (?, ?, ?)", (row[0], idempotency_key, amount_cents))
            db.execute("COMMIT")
        return ChargeResult(id=row[0], amount_cents=row[1])

    def find(self, idempotency_key: str) -> ChargeResult | None:
        with sqlite3.connect(self.path) as db:
            row = db.execute("SELECT id, amount FROM charges WHERE idem = ?", (idempotency_key,)).fetchone()
        return None if row is None else ChargeResult(id=row[0], amount_cents=row[1])

    def counts(self) -> tuple[int, int]:
        with sqlite3.connect(self.path) as db:
            charges = db.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
            requests = db.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        return int(charges), int(requests)

    def keys(self) -> list[str]:
        with sqlite3.connect(self.path) as db:
            return [r[0] for r in db.execute("SELECT idem FROM requests")]


RIDES_DDL = "CREATE TABLE IF NOT EXISTS rides (id VARCHAR(64) PRIMARY KEY, amount_cents INTEGER NOT NULL)"


def die(mode: str, point: str) -> None:
    if mode == f"kill_{point}":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == f"stop_{point}":
        print("stopped", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


def build(guard: Guard, provider: Provider, receipts: str, mode: str = "none", policy: str = "retry",
          resumable: bool = False) -> Any:
    async def reconcile(op: Operation, step: str, sub_key: str) -> ChargeResult | None:
        return await asyncio.to_thread(provider.find, sub_key)

    async def charge_card(amount_cents: int, idempotency_key: str) -> ChargeResult:
        result = await asyncio.to_thread(provider.charge, amount_cents, idempotency_key)
        die(mode, "in_charge")  # the provider charged; the worker dies before the step is recorded
        return result

    async def send_receipt(ride_id: str, charge_id: str) -> str:
        with open(receipts, "a") as f:  # noqa: ASYNC230 - the side effect itself
            f.write(f"{ride_id} {charge_id}\n")
        return "sent"

    @guard.once(key=["ride_id"], on_unknown=policy,  # type: ignore[arg-type]
                reconcile=reconcile if policy == "reconcile" else None, resumable=resumable)
    async def book_ride(ride_id: str, amount_cents: int, op: Operation) -> Receipt:
        async def create_ride(conn: AsyncConnection) -> str:
            await conn.execute(text("INSERT INTO rides (id, amount_cents) VALUES (:id, :a)"),
                               {"id": ride_id, "a": amount_cents})
            die(mode, "in_tx")  # the insert is made but not committed
            return ride_id

        await op.transaction("create_ride", create_ride)
        die(mode, "after_tx")
        charge = await op.step("charge", charge_card, amount_cents, idempotency_key=op.key("charge"))
        await op.step("send_receipt", send_receipt, ride_id, charge.id)
        return Receipt(ride_id=ride_id, charge_id=charge.id)

    return book_ride


async def run(args: argparse.Namespace) -> None:
    async with Guard(args.url, lease=args.lease) as guard:
        book_ride = build(guard, Provider(args.provider), args.receipts, args.mode, args.policy,
                          resumable=args.resumable)
        await guard.ensure_schema()
        print("ready", flush=True)
        with task(args.task_id):
            try:
                receipt = await book_ride("r-1", 2500)
                print(json.dumps({"ok": receipt.model_dump()}), flush=True)
            except GuardError as exc:
                print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("url", "task_id", "provider", "receipts", "mode", "policy"):
        p.add_argument(name)
    p.add_argument("--lease", type=float, default=1.0)
    p.add_argument("--resumable", action="store_true")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
