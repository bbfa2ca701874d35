"""The side effect the framework tests count: a provider that records every real charge with the downstream
key it was made under (it does not deduplicate: a second charge here is the double charge a test must never
see)."""

from __future__ import annotations

import threading
from typing import Any


class Ledger:
    """Every real charge, with the downstream key it was made under; safe to call from several threads."""

    def __init__(self) -> None:
        self.charges: list[tuple[str, int, str]] = []
        self.lock = threading.Lock()

    def charge(self, order_id: str, amount_cents: int, key: str) -> dict[str, Any]:
        with self.lock:
            self.charges.append((order_id, amount_cents, key))
            return {"charge_id": f"ch_{len(self.charges)}", "order_id": order_id, "amount_cents": amount_cents}
