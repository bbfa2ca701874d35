"""A small stdio MCP payments server that behaves like Stripe on ``idempotency_key`` (the ``mcp`` extra).

    PAYMENTS_DEMO_DB=payments.db python -m agentguard.servers.payments_demo     # installed from the wheel
    PAYMENTS_DEMO_DB=payments.db python servers/payments_demo.py                # the same, from a checkout

Tools: ``create_charge``, ``create_refund``, ``list_charges``. Charges and refunds persist to the SQLite file
at ``$PAYMENTS_DEMO_DB`` (default ``payments_demo.db`` in the working directory). Like Stripe, a request
that repeats an ``idempotency_key`` with the same parameters returns the object the first request created,
and one that repeats it with different parameters is refused. A charge's ``memo`` is a note kept with it,
not one of those parameters: a repeat with a reworded memo is the same charge (which is why the README's
proxy config lists ``memo`` under ``ignore``). Without a key every call creates a new
object: this is the upstream that the agentguard proxy protects in the demo, the tests and the README.

``PAYMENTS_DEMO_HOLD_FILE`` (for tests): after a *new* charge is committed, the response is held back until
that file exists, which simulates a slow provider (a client timeout, a crash mid-call) deterministically.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
import sys
import time
from typing import Any

from agentguard._extras import require

require("mcp", "mcp_types", extra="mcp", by=__name__)

import anyio  # noqa: E402
import anyio.to_thread  # noqa: E402
from mcp.server import MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from pydantic import BaseModel  # noqa: E402

SCHEMA = """
CREATE TABLE IF NOT EXISTS charges (
    id TEXT PRIMARY KEY,
    order_id TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    currency TEXT NOT NULL,
    status TEXT NOT NULL,
    created REAL NOT NULL,
    memo TEXT NOT NULL DEFAULT '',
    idempotency_key TEXT UNIQUE,
    params_hash TEXT
);
CREATE TABLE IF NOT EXISTS refunds (
    id TEXT PRIMARY KEY,
    charge_id TEXT NOT NULL REFERENCES charges(id),
    amount_cents INTEGER NOT NULL,
    created REAL NOT NULL,
    idempotency_key TEXT UNIQUE,
    params_hash TEXT
);
"""


class Charge(BaseModel):
    id: str
    order_id: str
    amount_cents: int
    currency: str
    status: str
    created: float
    memo: str = ""


class Refund(BaseModel):
    id: str
    charge_id: str
    amount_cents: int
    created: float


class IdempotencyError(Exception):
    """The idempotency key was already used with other parameters (Stripe answers 400)."""


def _params_hash(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()


class Ledger:
    """The provider's books: one short SQLite transaction per request, a fresh connection each time."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        with self._connect() as db:
            db.executescript(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def _idempotent_insert(
        self, table: str, row: dict[str, Any], params: dict[str, Any], key: str | None
    ) -> tuple[dict[str, Any], bool]:
        """Insert ``row`` unless ``key`` was seen; returns (the row for this key, whether it is new)."""
        digest = _params_hash(params)
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")  # one writer decides: the unique key is checked and taken atomically
            if key:
                prior = db.execute(f"SELECT * FROM {table} WHERE idempotency_key = ?", (key,)).fetchone()
                if prior is not None:
                    db.execute("ROLLBACK")
                    if prior["params_hash"] != digest:
                        raise IdempotencyError(
                            "Keys for idempotent requests can only be used with the same parameters they were "
                            "first used with. Nothing was charged."
                        )
                    return {k: prior[k] for k in row}, False
            cols = [*row, "idempotency_key", "params_hash"]
            db.execute(
                f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                (*row.values(), key or None, digest),
            )
            db.execute("COMMIT")
            return row, True
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def charge(
        self, order_id: str, amount_cents: int, currency: str, idempotency_key: str | None, memo: str = ""
    ) -> tuple[Charge, bool]:
        if amount_cents <= 0:
            raise ValueError("amount_cents must be positive")
        params = {"order_id": order_id, "amount_cents": amount_cents, "currency": currency.lower()}
        row = {"id": "ch_" + secrets.token_hex(8), **params, "status": "succeeded", "created": time.time(),
               "memo": memo}
        stored, new = self._idempotent_insert("charges", row, params, idempotency_key)
        return Charge(**stored), new

    def refund(self, charge_id: str, amount_cents: int | None, idempotency_key: str | None) -> Refund:
        with self._connect() as db:
            charge = db.execute("SELECT amount_cents FROM charges WHERE id = ?", (charge_id,)).fetchone()
        if charge is None:
            raise LookupError(f"no such charge: {charge_id}")
        amount = charge["amount_cents"] if amount_cents is None else amount_cents
        params = {"charge_id": charge_id, "amount_cents": amount}
        row = {"id": "re_" + secrets.token_hex(8), **params, "created": time.time()}
        stored, _ = self._idempotent_insert("refunds", row, params, idempotency_key)
        return Refund(**stored)

    def charges(self) -> list[Charge]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT id, order_id, amount_cents, currency, status, created, memo FROM charges ORDER BY created"
            ).fetchall()
        return [Charge(**dict(r)) for r in rows]


async def _hold(path: str | None) -> None:
    if path:
        # A file is the one signal a test can send to a server process several pipes away.
        while not await anyio.Path(path).exists():  # noqa: ASYNC110
            await anyio.sleep(0.02)


def build_server(db_path: str | os.PathLike[str], *, hold_file: str | None = None) -> MCPServer:
    """The demo server over the ledger at ``db_path`` (tests connect to it in-process too)."""
    ledger = Ledger(db_path)
    server = MCPServer("payments-demo", version="0.1.0", instructions="A fake payment provider for demos.")

    @server.tool()
    async def create_charge(
        order_id: str, amount_cents: int, currency: str = "usd", memo: str = "", idempotency_key: str | None = None
    ) -> Charge:
        """Charge the customer for an order, with an optional memo (a note kept with the charge). Pass an
        idempotency_key to make retries safe."""
        try:
            charge, new = await anyio.to_thread.run_sync(
                ledger.charge, order_id, amount_cents, currency, idempotency_key, memo
            )
        except (IdempotencyError, ValueError) as exc:
            raise ToolError(str(exc)) from None
        if new:
            await _hold(hold_file)
        return charge

    @server.tool()
    async def create_refund(
        charge_id: str, amount_cents: int | None = None, idempotency_key: str | None = None
    ) -> Refund:
        """Refund a charge, fully (no amount) or partly."""
        try:
            return await anyio.to_thread.run_sync(ledger.refund, charge_id, amount_cents, idempotency_key)
        except (IdempotencyError, LookupError) as exc:
            raise ToolError(str(exc)) from None

    @server.tool()
    async def list_charges() -> list[Charge]:
        """Every charge, oldest first."""
        return await anyio.to_thread.run_sync(ledger.charges)

    return server


def main() -> int:
    db = os.environ.get("PAYMENTS_DEMO_DB") or "payments_demo.db"
    build_server(db, hold_file=os.environ.get("PAYMENTS_DEMO_HOLD_FILE") or None).run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
