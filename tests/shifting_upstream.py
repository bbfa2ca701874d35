"""A test upstream whose tools change under the proxy, in process or as a stdio server.

    SHIFTING_SHAPE=shape.txt SHIFTING_LOG=log.jsonl python tests/shifting_upstream.py

``pay(order_id, amount_cents, idempotency_key)`` is offered as the proxy's test config guards it in shape
``ok``; with ``order_id`` renamed to ``orderId`` in shape ``renamed``; not at all in shape ``gone``. The shape
is read from the file ``SHIFTING_SHAPE`` names at each ``tools/list``, so a restarted server can offer other
tools; a process started in shape ``broken`` exits at once, as an upstream that cannot run does. The
unguarded ``reshape(shape)`` changes it and announces the change, as a real server would:
``notifications/tools/list_changed`` on the handshake era, an event on ``subscriptions/listen`` streams on
2026-07-28. Every ``pay`` that runs, and every start of the process, appends a line to ``SHIFTING_LOG``:
the side effects a test counts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged

SHAPES = ("ok", "renamed", "gone", "broken")


def _pay_schema(order_field: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            order_field: {"type": "string"},
            "amount_cents": {"type": "integer"},
            "idempotency_key": {"type": "string"},
        },
        "required": [order_field, "amount_cents"],
    }


def set_shape(shape_file: Path, shape: str) -> None:
    assert shape in SHAPES, shape
    shape_file.write_text(shape, encoding="utf-8")


def record(log: Path, event: dict[str, Any]) -> None:
    with log.open("a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")


def events(log: Path, kind: str) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]
    return [e for e in lines if e["event"] == kind]


def build_server(shape_file: Path, log: Path) -> Server[Any]:
    bus = InMemorySubscriptionBus()

    def shape() -> str:
        return shape_file.read_text(encoding="utf-8").strip()

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        reshape = types.Tool(name="reshape", input_schema={
            "type": "object", "properties": {"shape": {"type": "string", "enum": list(SHAPES)}},
            "required": ["shape"],
        })
        tools = [reshape]
        if shape() != "gone":
            order_field = "orderId" if shape() == "renamed" else "order_id"
            tools.append(types.Tool(name="pay", input_schema=_pay_schema(order_field)))
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        args = dict(params.arguments or {})
        if params.name == "reshape":
            set_shape(shape_file, str(args["shape"]))
            await ctx.session.send_tool_list_changed()  # handshake era (dropped on 2026-07-28)
            await bus.publish(ToolsListChanged())  # 2026-07-28: listen streams
            return types.CallToolResult(content=[types.TextContent(type="text", text=f"shape {args['shape']}")])
        if params.name == "pay" and shape() != "gone":
            record(log, {"event": "pay", "args": args})
            return types.CallToolResult(content=[types.TextContent(type="text", text="paid")],
                                        structured_content={"paid": len(events(log, "pay"))})
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"no tool {params.name}")],
                                    is_error=True)

    return Server("shifting", on_list_tools=list_tools, on_call_tool=call_tool,
                  on_subscriptions_listen=ListenHandler(bus))


def main() -> int:
    shape_file, log = Path(os.environ["SHIFTING_SHAPE"]), Path(os.environ["SHIFTING_LOG"])
    record(log, {"event": "start", "pid": os.getpid()})
    if shape_file.read_text(encoding="utf-8").strip() == "broken":
        return 3
    server = build_server(shape_file, log)

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
