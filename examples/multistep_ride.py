"""A multi-step tool with recovery points (Rocket Rides): a local row, a card charge, a receipt.

The first attempt fails after the charge; the retry resumes after the last recorded step, so the ride row
is inserted once, the card is charged once and the receipt is sent once.

Needs no extra:  pip install agentguard-idempotency
Offline:  python examples/multistep_ride.py
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path

from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agentguard import Guard, Operation, task

charges: dict[str, str] = {}
receipts: list[str] = []
failures = {"send_receipt": 1}


class Receipt(BaseModel):
    ride_id: str
    charge_id: str


async def stripe_charge(amount_cents: int, idempotency_key: str) -> dict[str, str]:
    charges.setdefault(idempotency_key, "ch_" + uuid.uuid4().hex[:8])
    return {"id": charges[idempotency_key]}


async def send_email(ride_id: str, charge_id: str) -> None:
    if failures["send_receipt"]:
        failures["send_receipt"] -= 1
        raise ConnectionError("mail server timed out")
    receipts.append(f"{ride_id}: {charge_id}")


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with Guard(f"sqlite+aiosqlite:///{Path(tmp) / 'agentguard.db'}") as guard:
            await guard.ensure_schema()

            @guard.once(key=["ride_id"], on_unknown="retry")
            async def book_ride(ride_id: str, amount_cents: int, op: Operation) -> Receipt:
                async def create_ride(conn: AsyncConnection) -> str:
                    await conn.execute(text("CREATE TABLE IF NOT EXISTS rides (id TEXT PRIMARY KEY, cents INT)"))
                    await conn.execute(text("INSERT INTO rides VALUES (:id, :c)"), {"id": ride_id, "c": amount_cents})
                    return ride_id

                await op.transaction("create_ride", create_ride)
                charge = await op.step("charge", stripe_charge, amount_cents, idempotency_key=op.key("charge"))
                await op.step("send_receipt", send_email, ride_id, charge["id"])
                return Receipt(ride_id=ride_id, charge_id=charge["id"])

            with task("ride-request-77"):
                try:
                    await book_ride("r-1", 1800)
                except ConnectionError as exc:
                    print("first attempt failed after the charge:", exc)
                receipt = await book_ride("r-1", 1800)  # resumes at send_receipt
    print(receipt, f"charges={len(charges)} receipts={len(receipts)}")
    assert len(charges) == 1 and len(receipts) == 1


if __name__ == "__main__":
    asyncio.run(main())
