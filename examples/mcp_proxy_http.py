"""Two agents share one guarding MCP proxy over HTTP, offline: the provider charges once.

Needs the mcp extra:  pip install 'agentguard-idempotency[mcp]'
Offline:  python examples/mcp_proxy_http.py

Starts ``agentguard mcp-proxy --http 127.0.0.1:0`` (Streamable HTTP at ``/mcp``, every request checked for a
bearer token) in front of ``python -m agentguard.servers.payments_demo``, a Stripe-like fake. Two agents, one
speaking the handshake era (as Codex does) and one the 2026-07-28 era, call ``create_charge`` for the same
order in the same task at the same moment: one call charges, the other receives the recorded charge. A
request without the token is turned away before it reaches anything.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
CHARGE = {"order_id": "o-1", "amount_cents": 4900, "currency": "usd", "task_id": "ticket-8812"}


async def agent(name: str, url: str, token: str, mode: str, lines: list[str]) -> None:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http, \
            Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        res = await client.call_tool("create_charge", CHARGE)
        replayed = (res.meta or {}).get("dev.agentguard/replayed")
        lines.append(f"{name} ({client.protocol_version}): charge {(res.structured_content or {}).get('id')} "
                     f"replayed={replayed}")


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "agentguard.toml"
        config.write_text(
            '[store]\nurl = "sqlite+aiosqlite:///claims.db"\n\n'
            '[upstream]\ncommand = ["python", "-m", "agentguard.servers.payments_demo"]\n'
            'env = { PAYMENTS_DEMO_DB = "payments.db" }\npass_env = ["PYTHONPATH"]\n\n'
            '[tools.create_charge]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'
        )
        token = secrets.token_urlsafe(32)  # the agents' shared secret; the proxy refuses to serve HTTP without one
        env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTGUARD_PROXY_TOKEN": token, "AGENTGUARD_LOG": "INFO"}
        cmd = [sys.executable, "-m", "agentguard.cli", "mcp-proxy", "--config", str(config), "--http", "127.0.0.1:0"]
        async with await anyio.open_process(cmd, env=env, stdin=subprocess.DEVNULL) as proxy, \
                anyio.create_task_group() as tg:
            url_found, url = anyio.Event(), ""

            async def read_log() -> None:  # the proxy logs where it listens (and must never block on stderr)
                nonlocal url
                assert proxy.stderr is not None
                log = ""
                async for chunk in proxy.stderr:
                    log += chunk.decode()
                    if not url and (match := re.search(r"serving Streamable HTTP on (\S+)\s", log)) is not None:
                        url = match.group(1)
                        url_found.set()

            tg.start_soon(read_log)
            await url_found.wait()
            print(f"proxy serving at {url} (bearer token required)")
            lines: list[str] = []
            async with anyio.create_task_group() as agents:
                agents.start_soon(agent, "agent A", url, token, "legacy", lines)
                agents.start_soon(agent, "agent B", url, token, "auto", lines)
            print("\n".join(sorted(lines)))
            async with httpx2.AsyncClient() as http:
                turned_away = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            print(f"a request without the token: HTTP {turned_away.status_code}")
            proxy.send_signal(signal.SIGTERM)
            await proxy.wait()
            tg.cancel_scope.cancel()
        with sqlite3.connect(Path(tmp) / "payments.db") as ledger:
            (count,) = ledger.execute("SELECT count(*) FROM charges").fetchone()
        print(f"charges in the provider's ledger: {count}")


if __name__ == "__main__":
    anyio.run(main)
