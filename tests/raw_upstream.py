"""A hand-written stdio MCP server (handshake era only) that sends garbage while it answers a call.

    RAW_LOG=log.jsonl python tests/raw_upstream.py

It offers ``pay(order_id, idempotency_key)``. Before answering a call it writes a line that is not JSON,
notifications with malformed params (progress for no token and no number, a log line at no level, a resource
update without a URI, a tool change with params that are not an object, a method nobody knows) and an
elicitation request without a message, then pays (a line in the log) and answers. Whatever the proxy answers
to its request is logged too. Written without the SDK, so nothing cleans up what it sends.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from upstream_log import events, record

GARBAGE = [
    "this is not JSON at all",
    {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": {"no": 1}, "progress": "lots"}},
    {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "loud"}},
    {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {}},
    {"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": "not an object"},
    {"jsonrpc": "2.0", "method": "notifications/nobody/knows", "params": {"x": 1}},
    {"jsonrpc": "2.0", "id": "ask-1", "method": "elicitation/create", "params": {"mode": "form"}},
]

PAY = {"name": "pay", "inputSchema": {"type": "object", "properties": {
    "order_id": {"type": "string"}, "idempotency_key": {"type": "string"}}, "required": ["order_id"]}}


def send(message: dict[str, Any] | str) -> None:
    sys.stdout.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
    sys.stdout.flush()


def answer(msg: dict[str, Any], log: Path) -> dict[str, Any] | None:
    method, params = msg.get("method"), msg.get("params") or {}
    if method == "initialize":
        return {"protocolVersion": "2025-11-25", "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "raw", "version": "1"}}
    if method == "tools/list":
        return {"tools": [PAY]}
    if method == "tools/call":
        for item in GARBAGE:
            send(item)
        record(log, {"event": "pay", "args": params.get("arguments")})
        n = len(events(log, "pay"))
        return {"content": [{"type": "text", "text": f"paid #{n}"}], "structuredContent": {"n": n}}
    if method == "ping":
        return {}
    return None


def main() -> int:
    log = Path(os.environ["RAW_LOG"])
    for line in sys.stdin:
        msg = json.loads(line)
        if "method" not in msg:  # a response to our elicitation request
            record(log, {"event": "answered", "message": msg})
            continue
        if "id" not in msg:
            continue  # notifications
        result = answer(msg, log)
        if result is None:
            send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "Method not found"}})
        else:
            send({"jsonrpc": "2.0", "id": msg["id"], "result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
