"""The payments demo's tools written natively with agentguard: a template for a guarded MCP server.

    AGENTGUARD_URL=sqlite+aiosqlite:///claims.db PAYMENTS_DEMO_DB=payments.db python servers/guarded_payments.py

Each money-moving tool is registered with ``guarded_tool``, which applies ``Guard.once``: the tool gains a
required ``task_id`` argument, runs at most once per (task, order), replays its result to every repeat
(marked in ``_meta`` and in a text line) and receives the downstream key as ``idempotency_key``, which it
hands to the provider. ``list_charges`` reads only, so it is a plain tool.
"""

from __future__ import annotations

import os
import sys

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from payments_demo import Charge, IdempotencyError, Ledger, Refund  # the fake provider, next to this file

from agentguard import Guard
from agentguard.mcp import guarded_tool


def build_server(guard: Guard, ledger: Ledger) -> MCPServer:
    server = MCPServer("guarded-payments", version="0.1.0")

    @guarded_tool(server, guard, key=["order_id"])
    async def create_charge(
        order_id: str, amount_cents: int, currency: str = "usd", idempotency_key: str = ""
    ) -> Charge:
        """Charge the customer for an order."""
        try:
            charge, _ = await anyio.to_thread.run_sync(ledger.charge, order_id, amount_cents, currency, idempotency_key)
        except (IdempotencyError, ValueError) as exc:
            raise ToolError(str(exc)) from None
        return charge

    @guarded_tool(server, guard, key=["charge_id"])
    async def create_refund(charge_id: str, amount_cents: int | None = None, idempotency_key: str = "") -> Refund:
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
    guard = Guard(os.environ.get("AGENTGUARD_URL"))
    ledger = Ledger(os.environ.get("PAYMENTS_DEMO_DB") or "payments_demo.db")
    build_server(guard, ledger).run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
