"""The Anthropic SDK's tool runner: the model charges the same order, again after a "timeout", twice in one
reply, and with another amount; the runner's real loop talks to a local fake of the Messages API.

Needs the anthropic extra:  pip install 'agentguard-idempotency[anthropic]' — and a clone of the repository
(the fake API is the tests' tests/fake_anthropic.py)
Offline (no API key):  python examples/anthropic_tool_runner.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anthropic
from anthropic import beta_tool

from agentguard import Guard, task
from agentguard.integrations.anthropic import once

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
# the tests' fake Messages API on 127.0.0.1: no network, no API key
from fake_anthropic import FakeMessagesAPI, result_text, tool_results

guard = Guard("sqlite+aiosqlite://")
ledger: list[tuple[str, int, str]] = []


@beta_tool                       # the SDK's decorator on top, agentguard underneath
@once(guard, key="order_id")
def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str:
    """Charge an order.

    Args:
        order_id: the order to charge
        amount_cents: how much
    """
    ledger.append((order_id, amount_cents, idempotency_key))
    return f"charged {order_id}: {amount_cents} cents (ch_{len(ledger)})"


TURNS = [[4900], [4900], [4900, 4900], [5000]]  # a call, its retry, two in one reply, another amount


def model(body: dict[str, Any]) -> list[dict[str, Any]]:
    n = sum(m["role"] == "assistant" for m in body["messages"])
    if n < len(TURNS):
        return [{"type": "tool_use", "id": f"toolu_{n}_{i}", "name": "charge",
                 "input": {"order_id": "o-1", "amount_cents": a}} for i, a in enumerate(TURNS[n])]
    return [{"type": "text", "text": "done"}]


def main() -> None:
    with FakeMessagesAPI(model) as api, guard:
        # In production: anthropic.Anthropic() with ANTHROPIC_API_KEY set.
        client = anthropic.Anthropic(api_key="test", base_url=api.url, max_retries=0)
        with task("ticket-8812"):  # the runner gives a tool no context: the task comes from here
            client.beta.messages.tool_runner(
                model="claude-sonnet-4-5", max_tokens=200, tools=[charge],
                messages=[{"role": "user", "content": "charge o-1"}],
            ).until_done()
        client.close()
        for tool_use_id, block in tool_results(api.requests[-1]).items():
            flag = " (is_error)" if block.get("is_error") else ""
            print(f"  model saw {tool_use_id}{flag}: {result_text(block)}")
    print(f"side effects: {len(ledger)}")
    assert len(ledger) == 1


if __name__ == "__main__":
    main()
