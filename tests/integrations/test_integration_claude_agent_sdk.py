"""The Claude Agent SDK: its real loop — ``query()`` driving the Claude Code CLI it bundles, which calls the
in-process MCP tool back through the SDK — against a fake of the Messages API on loopback
(``tests/fake_anthropic.py``), offline: no account, no API key, a fresh config directory per test."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, SdkMcpTool, create_sdk_mcp_server, query, tool

from agentguard import Guard, current_key, task
from agentguard.integrations.claude_agent_sdk import once

from fake_anthropic import FakeMessagesAPI, result_text, tool_results

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
TOOL = "mcp__payments__charge"  # how Claude Code names the SDK server's tool


class Ledger:
    def __init__(self) -> None:
        self.charges: list[tuple[str, int, str]] = []
        self.lock = threading.Lock()

    def charge(self, order_id: str, amount_cents: int, key: str) -> str:
        with self.lock:
            self.charges.append((order_id, amount_cents, key))
            return f"charged {order_id}: {amount_cents} cents, ch_{len(self.charges)}"


def script(*turns: Sequence[Mapping[str, Any]]) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    """The model: one reply per turn of the agent loop, each the charge calls it makes (their inputs), then
    text. Requests the CLI makes on the side (without the tool) get a short text."""

    def reply(body: dict[str, Any]) -> list[dict[str, Any]]:
        if TOOL not in [t.get("name") for t in body.get("tools", [])]:
            return [{"type": "text", "text": "ok"}]
        n = sum(m["role"] == "assistant" for m in body["messages"])
        if n < len(turns):
            return [
                {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": TOOL, "input": dict(args)}
                for i, args in enumerate(turns[n])
            ]
        return [{"type": "text", "text": "done"}]

    return reply


def charge_args(amount: int = 500) -> dict[str, Any]:
    return {"order_id": "o-1", "amount_cents": amount}


SCHEMA: dict[str, Any] = {"order_id": str, "amount_cents": int}


def charge_tool(guard: Guard, ledger: Ledger, schema: dict[str, Any] = SCHEMA, **options: Any) -> SdkMcpTool[Any]:
    @tool("charge", "Charge an order", schema)
    @once(guard, key="order_id", **options)
    async def charge(args: dict[str, Any]) -> dict[str, Any]:
        text = ledger.charge(args["order_id"], args["amount_cents"], current_key())
        return {"content": [{"type": "text", "text": text}]}

    return charge


async def run(api: FakeMessagesAPI, charge: SdkMcpTool[Any], home: Path, **env: str) -> ResultMessage:
    options = ClaudeAgentOptions(
        mcp_servers={"payments": create_sdk_mcp_server("payments", tools=[charge])},
        tools=[], allowed_tools=[TOOL], model="claude-sonnet-4-5", max_turns=8, cwd=str(home), setting_sources=[],
        env={
            "ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test", "HOME": str(home),
            "CLAUDE_CONFIG_DIR": str(home / ".claude"), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1", **env,
        },
    )
    results = [m async for m in query(prompt="charge o-1", options=options) if isinstance(m, ResultMessage)]
    (result,) = results
    return result


def text_of(block: dict[str, Any]) -> str:
    """A tool result's text without the reminders Claude Code appends to the last one of a turn."""
    return result_text(block).split("<system-reminder>")[0].strip()


def final_results(api: FakeMessagesAPI) -> dict[str, dict[str, Any]]:
    """The tool results the model was sent, by tool-use id (the last request of the loop holds them all)."""
    return tool_results([r for r in api.requests if r["messages"]][-1])


@pytest.fixture
def guard(make_guard: Callable[..., Guard]) -> Guard:
    return make_guard()


async def test_retry_after_a_timeout_and_parallel_duplicates_charge_once(guard: Guard, tmp_path: Path) -> None:
    ledger = Ledger()
    turns = ([charge_args()], [charge_args()], [charge_args(), charge_args()])
    with FakeMessagesAPI(script(*turns)) as api, task("ticket-1"):
        result = await run(api, charge_tool(guard, ledger), tmp_path)
    assert result.result == "done" and not result.is_error
    assert len(ledger.charges) == 1
    out = final_results(api)
    assert text_of(out["toolu_0_0"]) == "charged o-1: 500 cents, ch_1"
    for replay in ("toolu_1_0", "toolu_2_0", "toolu_2_1"):
        text = text_of(out[replay])
        assert text.startswith("agentguard: REPLAY. charge") and "Nothing was executed again." in text
        assert text.endswith("charged o-1: 500 cents, ch_1") and not out[replay].get("is_error")
    (record,) = await guard.records()
    assert record.task_id == "ticket-1" and ledger.charges[0][2] == record.key


async def test_replay_note_false_replays_the_stored_result_alone(guard: Guard, tmp_path: Path) -> None:
    ledger = Ledger()
    with FakeMessagesAPI(script([charge_args()], [charge_args()])) as api, task("ticket-q"):
        await run(api, charge_tool(guard, ledger, replay_note=False), tmp_path)
    assert len(ledger.charges) == 1
    out = final_results(api)
    assert text_of(out["toolu_1_0"]) == text_of(out["toolu_0_0"]) == "charged o-1: 500 cents, ch_1"


async def test_other_arguments_reach_the_model_as_a_tool_error(guard: Guard, tmp_path: Path) -> None:
    ledger = Ledger()
    with FakeMessagesAPI(script([charge_args(500)], [charge_args(700)])) as api, task("ticket-2"):
        await run(api, charge_tool(guard, ledger), tmp_path)
    assert len(ledger.charges) == 1
    refused = final_results(api)["toolu_1_0"]
    assert refused.get("is_error") is True
    text = text_of(refused)
    assert "already called in task 'ticket-2' with different arguments" in text and "amount_cents" in text
    assert text.endswith("Nothing was executed.")


async def test_task_id_from_the_arguments_and_none_refused(guard: Guard, tmp_path: Path) -> None:
    ledger = Ledger()
    schema = {"type": "object", "required": ["order_id", "amount_cents"], "properties": {
        "order_id": {"type": "string"}, "amount_cents": {"type": "integer"}, "ticket": {"type": "string"}}}
    tool_ = charge_tool(guard, ledger, schema, task_id=lambda args: args.get("ticket"), ignore="ticket")
    turns = ([{**charge_args(), "ticket": "T-9"}], [{**charge_args(), "ticket": "T-9"}], [charge_args()])
    with FakeMessagesAPI(script(*turns)) as api:
        await run(api, tool_, tmp_path)
    assert len(ledger.charges) == 1
    out = final_results(api)
    assert text_of(out["toolu_1_0"]).startswith("agentguard: REPLAY.")
    refused = text_of(out["toolu_2_0"])
    assert out["toolu_2_0"].get("is_error") is True and "no usable task id" in refused
    assert refused.endswith("Nothing was executed.")
    assert [r.task_id for r in await guard.records()] == ["T-9"]


class KeyedProvider:
    """A provider that honours idempotency keys, as Stripe does: a key seen before gets its first charge back."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.charges: dict[str, str] = {}

    def charge(self, order_id: str, amount_cents: int, key: str) -> str:
        self.requests.append(key)
        if key not in self.charges:
            self.charges[key] = f"charged {order_id}: {amount_cents} cents, ch_{len(self.charges) + 1}"
        return self.charges[key]


async def test_a_call_claude_code_timed_out_is_retried_under_the_same_key(guard: Guard, tmp_path: Path) -> None:
    """A real timeout: the provider charged, the answer is late, Claude Code gives up on the tool after its MCP
    tool timeout and cancels the handler (the guard releases the claim), and the model calls again: the retry
    runs under the same downstream key, so the provider hands back its first charge."""
    provider, attempts = KeyedProvider(), []
    told = threading.Event()  # the model has been told the first call timed out

    @tool("charge", "Charge an order", {"order_id": str, "amount_cents": int})
    @once(guard, key="order_id")
    async def charge(args: dict[str, Any]) -> dict[str, Any]:
        attempts.append(1)
        text = provider.charge(args["order_id"], args["amount_cents"], current_key())
        for _ in range(6000):  # the first answer is late: past the timeout, until the model has heard of it
            if len(attempts) > 1 or told.is_set():
                break
            await asyncio.sleep(0.01)
        return {"content": [{"type": "text", "text": text}]}

    model = script([charge_args()], [charge_args()])

    def watching(body: dict[str, Any]) -> list[dict[str, Any]]:
        if "toolu_0_0" in tool_results(body):
            told.set()
        return model(body)

    with FakeMessagesAPI(watching) as api, task("ticket-4"):
        await run(api, charge, tmp_path, MCP_TOOL_TIMEOUT="3000")  # roomy: the retry must not time out too
    out = final_results(api)
    assert out["toolu_0_0"].get("is_error") is True and "timed out" in text_of(out["toolu_0_0"])
    assert len(provider.charges) == 1 and len(set(provider.requests)) == 1  # one key, one charge
    assert "ch_1" in text_of(out["toolu_1_0"]) and not out["toolu_1_0"].get("is_error")
    (record,) = await guard.records()
    assert provider.requests[0] == record.key


async def test_once_on_top_of_tool_says_which_way_round(guard: Guard) -> None:
    @tool("charge", "Charge an order", {"order_id": str})
    async def charge(args: dict[str, Any]) -> dict[str, Any]:
        return {"content": []}

    with pytest.raises(TypeError, match=r"placed on top of a SdkMcpTool made by the Claude Agent SDK's @tool"):
        once(guard, key="order_id")(charge)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs an async handler"):
        once(guard)(lambda args: {})  # type: ignore[arg-type,return-value]


@pytest.mark.storeless
async def test_a_misspelt_key_is_refused_before_the_handler_ever_runs(guard: Guard, tmp_path: Path) -> None:
    """The handler sits under ``@tool(...)``, so its schema is found on its first call, before it runs: a key
    field the schema lacks reaches the model as a tool error, every time, and nothing is charged."""
    ledger = Ledger()

    @tool("charge", "Charge an order", {"order_id": str, "amount_cents": int})
    @once(guard, key="orderid")
    async def charge(args: dict[str, Any]) -> dict[str, Any]:
        text = ledger.charge(args["order_id"], args["amount_cents"], current_key())
        return {"content": [{"type": "text", "text": text}]}

    with FakeMessagesAPI(script([charge_args()], [charge_args(700)])) as api, task("ticket-typo"):
        await run(api, charge, tmp_path)
    out = final_results(api)
    for call_id in ("toolu_0_0", "toolu_1_0"):
        assert out[call_id].get("is_error") is True
        assert text_of(out[call_id]) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); "
                                         "its arguments are: amount_cents, order_id")
    assert ledger.charges == []
