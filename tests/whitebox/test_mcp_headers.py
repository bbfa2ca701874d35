"""The 2026-07-28 revision's routing headers in the HTTP mode, both ways: a host's request whose ``Mcp-Method`` or
``Mcp-Name`` does not match its body is refused before it reaches the proxy's MCP server, let alone the
upstream; and every request the proxy sends to a Streamable HTTP upstream carries them (the tool's name, a
task's id), which the upstream checks too. Hosts of both eras (the handshake era sends none) over real HTTP."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from http_proxies import TOKEN, host, serve_asgi
from mcp_types import HEADER_MISMATCH
from task_upstream import TaskUpstream
from upstream_log import events

from agentguard.mcp import META_REPLAYED, GuardingProxy, parse_config
from agentguard.mcp._http import serve_http

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]

TOOLS = '[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'


@contextlib.asynccontextmanager
async def served(store_url: str, upstream: Any, *, url: str | None = None) -> AsyncIterator[str]:
    """The guarding proxy over Streamable HTTP (``--http``, in process) in front of ``upstream`` (or ``url``)."""
    target = f'url = "{url}"\nheaders = {{ Authorization = "Bearer upstream-secret" }}' if url else 'command = ["x"]'
    config = parse_config(f'[store]\nurl = "{store_url}"\n\n[upstream]\n{target}\n\n{TOOLS}')
    proxy = GuardingProxy(config, upstream=None if url else upstream, environ={})
    async with proxy.started(), anyio.create_task_group() as tg:
        yield await tg.start(serve_http, proxy, "127.0.0.1", 0, TOKEN)
        tg.cancel_scope.cancel()


def envelope(name: str, **arguments: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": name, "arguments": arguments, "_meta": {types.PROTOCOL_VERSION_META_KEY: "2026-07-28",
                                                        types.CLIENT_CAPABILITIES_META_KEY: {}}}}


@pytest.mark.parametrize("headers, refused", [
    ({"Mcp-Method": "tools/call", "Mcp-Name": "pay_asking"}, True),
    ({"Mcp-Method": "tools/list", "Mcp-Name": "pay"}, True),
    ({"Mcp-Name": "pay"}, True),
    ({"Mcp-Method": "tools/call"}, True),
    ({"Mcp-Method": "tools/call", "Mcp-Name": "pay"}, False),
], ids=["other-name", "other-method", "no-method", "no-name", "matching"])
async def test_a_request_whose_routing_headers_disagree_with_it_is_refused(
    tmp_path: Path, store_url: str, headers: dict[str, str], refused: bool
) -> None:
    """A balancer routes on the headers, the proxy acts on the body: when they disagree, nothing runs."""
    log = tmp_path / "upstream.jsonl"
    body = envelope("pay", order_id="o-1", task_id="t-1")
    async with served(store_url, TaskUpstream(log).server) as url, httpx2.AsyncClient() as http:
        answer = await http.post(url, json=body, headers={
            "Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
            "Mcp-Protocol-Version": "2026-07-28", **headers})
    if refused:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == HEADER_MISMATCH
        assert events(log, "call") == []
    else:
        assert answer.status_code == 200, answer.text
        assert [e["args"]["order_id"] for e in events(log, "pay")] == ["o-1"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_proxy_sends_the_routing_headers_upstream(tmp_path: Path, store_url: str, mode: str) -> None:
    """Host, proxy and upstream over HTTP. The upstream (the SDK's server, which checks the headers against
    the body and would refuse a mismatch) sees ``Mcp-Method``/``Mcp-Name`` on the call (the tool) and on each
    ``tasks/get`` (the task's id), and the proxy's own credentials for it, never the host's token."""
    log = tmp_path / "upstream.jsonl"
    upstream = TaskUpstream(log)
    async with serve_asgi(upstream.server.streamable_http_app(host="127.0.0.1")) as up, \
            served(store_url, None, url=up) as url, host(url, mode) as client:
        first = await client.call_tool("pay", {"order_id": "o-1", "task_id": "t-1"})
        again = await client.call_tool("pay", {"order_id": "o-1", "task_id": "t-1"})
    [called] = events(log, "call")
    [paid] = events(log, "pay")
    assert (called["mcp-method"], called["mcp-name"]) == ("tools/call", "pay")
    gets = events(log, "get")
    assert gets and {(e["mcp-method"], e["mcp-name"]) for e in gets} == {("tasks/get", paid["task"])}
    assert {e["authorization"] for e in [called, *gets]} == {"Bearer upstream-secret"}
    assert not first.is_error and again.meta and again.meta[META_REPLAYED] is True
