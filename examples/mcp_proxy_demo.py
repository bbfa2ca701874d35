"""The guarding MCP proxy, offline: a host retries a charge, the provider charges once.

Needs the mcp extra:  pip install 'agentguard-idempotency[mcp]'
Offline:  python examples/mcp_proxy_demo.py

Starts ``agentguard mcp-proxy`` over stdio in front of ``python -m agentguard.servers.payments_demo`` (a
Stripe-like fake that ships with the package), as Claude Code or Codex would, then calls ``create_charge``
three times with the same task id: the first call charges, the repeats are replays. A different amount for
the same order is refused.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from pathlib import Path

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent


def first_text(result: types.CallToolResult) -> str:
    return next((c.text for c in result.content if isinstance(c, types.TextContent)), "")


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "agentguard.toml"
        config.write_text(
            '[store]\nurl = "sqlite+aiosqlite:///claims.db"\n\n'
            '[upstream]\ncommand = ["python", "-m", "agentguard.servers.payments_demo"]\n'
            'env = { PAYMENTS_DEMO_DB = "payments.db" }\npass_env = ["PYTHONPATH"]\n\n'
            '[tools.create_charge]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'
        )
        proxy = StdioServerParameters(
            command=sys.executable, args=["-m", "agentguard.cli", "mcp-proxy", "--config", str(config)],
            # The proxy logs each refusal as a WARNING on stderr, for a host's MCP log; this demo prints its own
            # story, so it shows the proxy's errors only.
            env={"PYTHONPATH": str(ROOT), "AGENTGUARD_LOG": "ERROR"},
        )
        charge = {"order_id": "o-1", "amount_cents": 4900, "currency": "usd", "task_id": "ticket-8812"}
        async with Client(proxy) as client:
            for attempt in (1, 2, 3):
                res = await client.call_tool("create_charge", charge)
                replayed = (res.meta or {}).get("dev.agentguard/replayed")
                print(f"attempt {attempt}: charge {(res.structured_content or {}).get('id')} replayed={replayed}")
            other = await client.call_tool("create_charge", {**charge, "amount_cents": 5900})
            print(f"other amount: refused={other.is_error}: {first_text(other)[:100]}...")
        with sqlite3.connect(Path(tmp) / "payments.db") as db:
            (n,) = db.execute("SELECT count(*) FROM charges").fetchone()
        print(f"charges at the provider: {n}")


if __name__ == "__main__":
    anyio.run(main)
