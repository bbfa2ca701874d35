"""Strands Agents: a scripted model has an Agent charge the same order again, twice at once, and with another
amount; the task id is the one the caller put in the invocation state.

Needs the strands extra:  pip install 'agentguard-idempotency[strands]'  (Strands pins mcp<2.2: not beside the mcp
extra)
Offline (a scripted subclass of Strands' Model, no API key):  python examples/strands_agent.py
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from strands import Agent, tool
from strands.models.model import Model
from strands.types.tools import ToolContext

from agentguard import Guard
from agentguard.integrations.strands import once

guard = Guard("sqlite+aiosqlite://")
ledger: list[tuple[str, int, str]] = []


@tool(context=True)              # Strands' decorator on top, agentguard underneath
@once(guard, key="order_id")
async def charge(order_id: str, amount_cents: int, tool_context: ToolContext, idempotency_key: str = "") -> Any:
    """Charge an order.

    Args:
        order_id: the order to charge
        amount_cents: how much, in cents
    """
    ledger.append((order_id, amount_cents, idempotency_key))  # forward idempotency_key to the provider
    return {"charge_id": f"ch_{len(ledger)}", "amount_cents": amount_cents}


TURNS = [[4900], [4900], [4900, 4900], [5000]]  # again (after a timeout), twice at once, another amount


class Scripted(Model):
    """Stands in for the LLM: each turn is one assistant message with these charge calls."""

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    async def structured_output(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        raise NotImplementedError
        yield

    async def stream(self, messages: Any, tool_specs: Any = None, system_prompt: Any = None,  # type: ignore[override]
                     **kwargs: Any) -> AsyncIterator[Any]:
        n = sum(1 for m in messages if m["role"] == "assistant")
        yield {"messageStart": {"role": "assistant"}}
        if n >= len(TURNS):
            yield {"contentBlockDelta": {"delta": {"text": "done"}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
            return
        for i, amount in enumerate(TURNS[n]):
            yield {"contentBlockStart": {"start": {"toolUse": {"toolUseId": f"c{n}_{i}", "name": "charge"}}}}
            args = json.dumps({"order_id": "o-1", "amount_cents": amount})
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": args}}}}
            yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "tool_use"}}


def main() -> None:
    agent = Agent(model=Scripted(), tools=[charge], callback_handler=None)
    with guard:
        agent("charge o-1", invocation_state={"task_id": "ticket-8812"})
    for message in agent.messages:
        for block in message["content"]:
            if "toolResult" in block:
                result = block["toolResult"]
                said = "".join(part.get("text", "") for part in result["content"])
                print(f"  model saw {result['toolUseId']} ({result['status']}): {said[:100]}")
    print(f"side effects: {len(ledger)}")
    assert len(ledger) == 1


if __name__ == "__main__":
    main()
