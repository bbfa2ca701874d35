"""The Claude Agent SDK: Claude Code (the CLI the SDK bundles) calls an in-process MCP charge tool, calls it
again after a "timeout", twice in one reply, and with another amount, against a local fake of the Messages
API — the SDK's and the CLI's real loop, no account.

Needs the claude-agent-sdk extra:  pip install 'agentguard-idempotency[claude-agent-sdk]' — and a clone of the
repository (the fake API is the tests' tests/fake_anthropic.py)
Offline (no API key; the CLI's config goes to a temporary directory):  python examples/claude_agent_sdk_agent.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, create_sdk_mcp_server, query, tool

from agentguard import Guard, current_key, task
from agentguard.integrations.claude_agent_sdk import once

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
# the tests' fake Messages API on 127.0.0.1: no network, no API key
from fake_anthropic import FakeMessagesAPI, result_text, tool_results

guard = Guard("sqlite+aiosqlite://")
ledger: list[tuple[str, int, str]] = []
TOOL = "mcp__payments__charge"  # Claude Code's name for the tool "charge" of the server "payments"


@tool("charge", "Charge an order", {"order_id": str, "amount_cents": int})   # the SDK's decorator on top
@once(guard, key="order_id")                                                 # agentguard on the handler
async def charge(args: dict[str, Any]) -> dict[str, Any]:
    ledger.append((args["order_id"], args["amount_cents"], current_key()))
    return {"content": [{"type": "text", "text": f"charged {args['order_id']} (ch_{len(ledger)})"}]}


TURNS = [[4900], [4900], [4900, 4900], [5000]]  # a call, its retry, two in one reply, another amount


def model(body: dict[str, Any]) -> list[dict[str, Any]]:
    if TOOL not in [t.get("name") for t in body.get("tools", [])]:
        return [{"type": "text", "text": "ok"}]  # a request the CLI makes on the side
    n = sum(m["role"] == "assistant" for m in body["messages"])
    if n < len(TURNS):
        return [{"type": "tool_use", "id": f"toolu_{n}_{i}", "name": TOOL,
                 "input": {"order_id": "o-1", "amount_cents": a}} for i, a in enumerate(TURNS[n])]
    return [{"type": "text", "text": "done"}]


async def main() -> None:
    with FakeMessagesAPI(model) as api, tempfile.TemporaryDirectory() as home:
        options = ClaudeAgentOptions(
            mcp_servers={"payments": create_sdk_mcp_server("payments", tools=[charge])},
            tools=[], allowed_tools=[TOOL], max_turns=10, cwd=home, setting_sources=[],
            # In production: your ANTHROPIC_API_KEY (or login), and none of these.
            env={"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test", "HOME": home,
                 "CLAUDE_CONFIG_DIR": home, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
        )
        async with guard:
            with task("ticket-8812"):  # the handler gets only its arguments: the task comes from here
                async for message in query(prompt="charge o-1", options=options):
                    if isinstance(message, ResultMessage):
                        print(f"result: {message.result}")
        last = [r for r in api.requests if TOOL in [t.get("name") for t in r.get("tools", [])]][-1]
        for tool_use_id, block in tool_results(last).items():
            text = result_text(block).split("<system-reminder>")[0].strip()  # Claude Code appends reminders
            flag = " (is_error)" if block.get("is_error") else ""
            print(f"  model saw {tool_use_id}{flag}: {text}")
    print(f"side effects: {len(ledger)}")
    assert len(ledger) == 1


if __name__ == "__main__":
    asyncio.run(main())
