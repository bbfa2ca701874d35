"""The key that reaches an MCP tool as an argument is always the guard's: a value the model sends for it is
replaced, through the guarding proxy (``forward_key_to``) and on native tools (``guarded_tool``'s injected
parameter), in both protocol eras; and it is written in the provider's shape when the config or the tool asks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.server import MCPServer, Server, ServerRequestContext

from agentguard import Guard
from agentguard.downstream import shape_key
from agentguard.mcp import META_KEY, META_REPLAYED, ConfigError, GuardingProxy, guarded_tool, parse_config
from tests.conftest import tid

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
@pytest.fixture(params=["legacy", "auto"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Upstream:
    """An upstream whose ``pay`` takes an ``idempotency_key`` and records every call's arguments."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def server(self) -> Server[Any]:
        async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
            schema = {"type": "object", "properties": {"order_id": {"type": "string"},
                                                        "idempotency_key": {"type": "string"}}}
            return types.ListToolsResult(tools=[types.Tool(name="pay", input_schema=schema)])

        async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
            self.calls.append({"args": dict(params.arguments or {}), "meta": dict(ctx.meta or {})})
            return types.CallToolResult(content=[types.TextContent(type="text", text=f"paid #{len(self.calls)}")])

        return Server("upstream", on_list_tools=list_tools, on_call_tool=call_tool)


def config(store_url: str, tool: str) -> str:
    upstream = '[upstream]\ncommand = ["unused"]\n\n'
    return f'[store]\nurl = "{store_url}"\n\n{upstream}[tools.pay]\nkey = ["order_id"]\n{tool}'


@pytest.fixture
def proxied(store_url: str, mode: str) -> Callable[..., Any]:
    @asynccontextmanager
    async def make(tool: str, upstream: Upstream) -> AsyncIterator[Client]:
        proxy = GuardingProxy(parse_config(config(store_url, tool)), upstream=upstream.server(), environ={})
        async with Client(proxy.server, mode=mode) as client:
            yield client

    return make


@pytest.mark.parametrize("shape", [None, "square", 40], ids=["as-it-is", "square", "40"])
async def test_the_proxy_forwards_its_own_key_whatever_the_model_sends(
    proxied: Callable[..., Any], shape: str | int | None
) -> None:
    up = Upstream()
    tool = 'forward_key_to = "idempotency_key"\n'
    if shape is not None:
        tool += f"forward_key_shape = {shape!r}\n".replace("'", '"')
    t = tid()
    async with proxied(tool, up) as client:
        first = await client.call_tool("pay", {"order_id": "o-1", "task_id": t, "idempotency_key": "forged"})
        again = await client.call_tool("pay", {"order_id": "o-1", "task_id": t, "idempotency_key": "forged-2"})
        plain = await client.call_tool("pay", {"order_id": "o-1", "task_id": t})
    assert not first.is_error and first.meta and again.meta and plain.meta
    # the forged value was dropped before the fingerprint: the same call, replayed, never a key reuse
    assert first.meta[META_REPLAYED] is False and again.meta[META_REPLAYED] is plain.meta[META_REPLAYED] is True
    (call,) = up.calls
    key = first.meta[META_KEY]  # the record's key (in _meta as it is, whatever the shape)
    assert call["meta"][META_KEY] == key == again.meta[META_KEY]
    assert call["args"] == {"order_id": "o-1", "idempotency_key": shape_key(key, shape)}
    assert len(call["args"]["idempotency_key"]) == {None: 51, "square": 42, 40: 40}[shape]


@pytest.mark.storeless
def test_forward_key_shape_is_checked_with_the_config() -> None:
    def problems(tool: str) -> list[str]:
        with pytest.raises(ConfigError) as info:
            parse_config(config("sqlite+aiosqlite:///x.db", tool))
        return info.value.problems

    (unknown,) = problems('forward_key_to = "idempotency_key"\nforward_key_shape = "sqare"\n')
    assert "tools.pay.forward_key_shape (line 10)" in unknown and "did you mean 'square'" in unknown
    assert "'stripe', 'adyen', 'square'; or give the provider's maximum key length (at least 35)" in unknown
    (short,) = problems('forward_key_to = "idempotency_key"\nforward_key_shape = 20\n')
    assert "tools.pay.forward_key_shape (line 10)" in short and "20 characters cannot hold 160 bits" in short
    assert "give at least 35" in short
    (alone,) = problems('forward_key_shape = "square"\n')
    assert "`forward_key_shape` applies only with `forward_key_to`" in alone
    assert problems('forward_key_to = "idempotency_key"\nforward_key_shape = true\n')
    ok = parse_config(config("sqlite+aiosqlite:///x.db", 'forward_key_to = "k"\nforward_key_shape = 45\n'))
    assert ok.tools["pay"].forward_key_shape == 45


@pytest.mark.parametrize("shape", [None, "square"], ids=["as-it-is", "square"])
async def test_a_native_tool_gets_the_guards_key_whatever_the_model_sends(
    make_guard: Callable[..., Guard], mode: str, shape: str | None
) -> None:
    guard = make_guard()
    server = MCPServer("payments")
    received: list[str] = []

    @guarded_tool(server, guard, key=["order_id"], key_shape=shape)
    async def pay(order_id: str, idempotency_key: str = "") -> str:
        received.append(idempotency_key)
        return f"paid with {idempotency_key}"

    t = tid()
    async with Client(server, mode=mode) as client:
        schema = {x.name: x for x in (await client.list_tools()).tools}["pay"].input_schema
        first = await client.call_tool("pay", {"order_id": "o-1", "task_id": t, "idempotency_key": "forged"})
        again = await client.call_tool("pay", {"order_id": "o-1", "task_id": t, "idempotency_key": "forged-2"})
    assert "idempotency_key" not in schema["properties"]
    assert first.meta and again.meta and first.meta[META_REPLAYED] is False and again.meta[META_REPLAYED] is True
    (record,) = await guard.records()
    assert first.meta[META_KEY] == record.key
    assert received == [shape_key(record.key, shape)]
