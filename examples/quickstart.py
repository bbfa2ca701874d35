"""The README example, runnable offline: a plain async tool guarded by agentguard.

Needs no extra:  pip install agentguard-idempotency
Offline:  python examples/quickstart.py
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path

from pydantic import BaseModel

from agentguard import Guard, KeyReuseError, task


class Charge(BaseModel):
    id: str
    order_id: str
    amount_cents: int


class FakeProvider:
    """Deduplicates on the idempotency key, as Stripe does."""

    def __init__(self) -> None:
        self.charges: dict[str, Charge] = {}

    async def charge(self, order_id: str, amount_cents: int, idempotency_key: str) -> Charge:
        if idempotency_key not in self.charges:
            self.charges[idempotency_key] = Charge(id="ch_" + uuid.uuid4().hex[:8], order_id=order_id,
                                                   amount_cents=amount_cents)
        return self.charges[idempotency_key]


async def main() -> None:
    provider = FakeProvider()
    with tempfile.TemporaryDirectory() as tmp:
        async with Guard(f"sqlite+aiosqlite:///{Path(tmp) / 'agentguard.db'}") as guard:

            @guard.once(key=["order_id"])
            async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> Charge:
                return await provider.charge(order_id, amount_cents, idempotency_key=idempotency_key)

            async with task("ticket-8812", scope="acct_42"):
                first = await charge("o-1", 4900)                      # runs
                again = await charge("o-1", 4900)                      # replays
                both = await asyncio.gather(charge("o-2", 100), charge("o-2", 100))  # one runs, one waits
                try:
                    await charge("o-1", 5000)                          # same operation, other amount
                except KeyReuseError as exc:
                    print("refused:", exc)
    assert first == again and both[0] == both[1]
    print(f"{len(provider.charges)} charges for 2 orders: {[c.id for c in provider.charges.values()]}")


if __name__ == "__main__":
    asyncio.run(main())
