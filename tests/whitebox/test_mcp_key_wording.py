"""The model cannot rotate the key, and is not told to: where the proxy fills in the idempotency key, what the
model reads of a guarded tool has no sentence asking for one, and the proxy warns at startup about an upstream
that asks for a key unique for every request. The real ``mcp`` Client lists the tools in both protocol eras."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.server import Server, ServerRequestContext

from agentguard.mcp import GuardingProxy, parse_config
from agentguard.mcp._tools import GUARDED_NOTE, without_key_sentences

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "servers"))
from payments_demo import build_server  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]

ASKS = (
    "Send money to a payee.\n\n"
    "Pass an `idempotency_key` that is unique for every request. Amounts are in cents.\n"
    "- payee: who is paid\n"
    "- Idempotency-Key: a UUID you generate for each call\n\n"
    "Retries are safe only with an idempotency key."
)


def _schema(**props: str) -> dict[str, Any]:
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}


def upstream() -> Server[Any]:
    tools = [
        types.Tool(name="send", description=ASKS, input_schema=_schema(payee="string", idempotency_key="string")),
        types.Tool(name="send_unforwarded", description=ASKS,
                   input_schema=_schema(payee="string", idempotency_key="string")),
        types.Tool(name="refund", description="Refund a payment. It is idempotent.", input_schema={
            **_schema(payment="string"), "properties": {"payment": {"type": "string"}, "request_key": {
                "type": "string", "description": "A new request_key for each request, unique per call."}}}),
        types.Tool(name="passed", description=ASKS, input_schema=_schema(idempotency_key="string")),
    ]

    async def list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text="done")])

    return Server("asks", on_list_tools=list_tools, on_call_tool=call_tool)


TOOLS = """
[tools.send]
key = ["payee"]
forward_key_to = "idempotency_key"

[tools.send_unforwarded]
key = ["payee"]

[tools.refund]
key = ["payment"]
forward_key_to = "request_key"
"""


def config(store_url: str, tools: str) -> str:
    return f'[store]\nurl = "{store_url}"\n\n[upstream]\ncommand = ["unused"]\n\n{tools}'


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_forwarded_key_is_not_asked_of_the_model(store_url: str, mode: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="agentguard.mcp")
    proxy = GuardingProxy(parse_config(config(store_url, TOOLS)), upstream=upstream(), environ={})
    async with Client(proxy.server, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    send = tools["send"].description or ""
    # Every sentence and line about the key is gone; the rest of the description, its lines and paragraphs, stay.
    assert send == f"Send money to a payee.\n\nAmounts are in cents.\n- payee: who is paid\n\n{GUARDED_NOTE}"
    assert "idempotency_key" not in tools["send"].input_schema["properties"]
    # Named by its own parameter (`request_key`): the hidden argument's description goes with it.
    assert tools["refund"].description == f"Refund a payment. It is idempotent.\n\n{GUARDED_NOTE}"
    # Where the model fills the key in, or the tool is not guarded, the upstream's words are the model's to read.
    assert (tools["send_unforwarded"].description or "").startswith(ASKS)
    assert tools["passed"].description == ASKS
    warned = [r.getMessage() for r in caplog.records if "unique for every request" in r.getMessage()]
    assert [w.split(":")[0] for w in warned] == ["send", "send_unforwarded", "refund"]
    assert "agentguard sends `idempotency_key` once per operation, the same on every retry" in warned[0]
    assert "Set `forward_key_to` under [tools.send_unforwarded]" in warned[1]


async def test_the_demo_servers_charge_is_described_without_its_key(store_url: str, tmp_path: Path) -> None:
    tools = '[tools.create_charge]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'
    proxy = GuardingProxy(parse_config(config(store_url, tools)), upstream=build_server(tmp_path / "payments.db"),
                          environ={})
    async with Client(proxy.server, mode="auto") as client:
        [charge] = [t for t in (await client.list_tools()).tools if t.name == "create_charge"]
    assert charge.description == ("Charge the customer for an order, with an optional memo (a note kept with the "
                                  f"charge).\n\n{GUARDED_NOTE}")


@pytest.mark.parametrize("text, left", [
    ("Pay. Use idempotency-key X.", "Pay."),
    ("Pay!  Set the IDEMPOTENCY KEY. Then wait?", "Pay! Then wait?"),
    ("Only a key: idempotency_key.", ""),
    ("Pay.\n\n\nidempotency_key: unique\n\n\nDone.", "Pay.\n\nDone."),
    ("An idempotent payment; keys are ours.", "An idempotent payment; keys are ours."),
    ("Pay with my_idempotency_keys on.", "Pay with my_idempotency_keys on."),
])
def test_only_the_sentences_about_the_key_are_left_out(text: str, left: str) -> None:
    assert without_key_sentences(text, "idempotency_key") == left
