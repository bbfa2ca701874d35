"""The MCP proxy continues the host's trace: the request's ``_meta`` ``traceparent`` is the parent of the guarded
call's span, and the upstream call carries the proxy's own context (same trace, the guarded call's span as
parent). The real ``mcp`` Client, in process, and the SDK's in-memory exporter; the ledger keeps the host's call
id."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.server import Server, ServerRequestContext
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentguard import Guard
from agentguard.mcp import GuardingProxy, parse_config
from agentguard.otel import instrument, reset

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
TRACE, HOST_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def upstream(seen: list[dict[str, Any]]) -> Server[Any]:
    async def list_tools(ctx: ServerRequestContext[Any], params: Any) -> Any:
        return types.ListToolsResult(tools=[types.Tool(name="pay", input_schema={
            "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]})])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        seen.append(dict(ctx.meta or {}))
        return types.CallToolResult(content=[types.TextContent(type="text", text="paid")])

    return Server("up", on_list_tools=list_tools, on_call_tool=call_tool)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrument(tracer_provider=provider)
    yield exporter
    reset()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_hosts_trace_is_continued_upstream(store_url: str, spans: InMemorySpanExporter, mode: str) -> None:
    seen: list[dict[str, Any]] = []
    config = f'[store]\nurl = "{store_url}"\n\n[upstream]\ncommand = ["unused"]\n\n[tools.pay]\nkey = ["order_id"]\n'
    proxy = GuardingProxy(parse_config(config), upstream=upstream(seen), environ={})
    meta = {"traceparent": f"00-{TRACE}-{HOST_SPAN}-01", "claudecode/toolUseId": "toolu_01"}
    async with Client(proxy.server, mode=mode) as client:
        first = await client.call_tool("pay", {"order_id": "o-1", "task_id": "t-trace"}, meta=meta)
        again = await client.call_tool("pay", {"order_id": "o-1", "task_id": "t-trace"}, meta=meta)
        # a host that sends no call id of its own: the JSON-RPC request id is kept in the ledger, but it names
        # the request, not the model's tool call, so the span has no gen_ai.tool.call.id
        bare = await client.call_tool("pay", {"order_id": "o-1", "task_id": "t-trace"},
                                      meta={"traceparent": meta["traceparent"]})
    assert not first.is_error and not again.is_error and not bare.is_error and len(seen) == 1
    *guarded, unnamed = [s for s in spans.get_finished_spans() if s.name == "execute_tool pay"]
    assert [s.attributes["agentguard.outcome"] for s in guarded] == ["ran", "replayed"]
    for s in guarded:  # the GenAI conventions' tool execution span, inside the MCP SDK's tools/call span
        assert s.kind.name == "INTERNAL" and s.attributes["gen_ai.operation.name"] == "execute_tool"
        assert s.attributes["gen_ai.tool.name"] == "pay" and s.attributes["gen_ai.tool.call.id"] == "toolu_01"
    assert "gen_ai.tool.call.id" not in unnamed.attributes
    for s in guarded:  # children of the host's span, in the host's trace
        assert f"{s.context.trace_id:032x}" == TRACE
        assert s.parent is not None and f"{s.parent.span_id:016x}" == HOST_SPAN
    sent = seen[0]["traceparent"]
    _version, trace, parent, _flags = sent.split("-")
    assert trace == TRACE and parent == f"{guarded[0].context.span_id:016x}"
    async with Guard(store_url) as reader:  # the proxy's guard flushed its ledger when the host went away
        entries = await reader.timeline("t-trace")
    assert [(e.kind, e.call_id) for e in entries][:2] == [("ran", "toolu_01"), ("replayed", "toolu_01")]
    assert entries[2].kind == "replayed" and entries[2].call_id is not None  # the request id
