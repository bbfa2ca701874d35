"""agno: a scripted model has an Agent charge the same order again, twice at once, and with another amount; the
task id is the one in the run's session_state.

Needs the agno extra:  pip install 'agentguard-idempotency[agno]'
Offline (a scripted subclass of agno's Model, no API key):  python examples/agno_agent.py
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from agno.agent import Agent
from agno.models.base import Model
from agno.models.message import Message
from agno.models.response import ModelResponse
from agno.run import RunContext

from agentguard import Guard
from agentguard.integrations.agno import once

guard = Guard("sqlite+aiosqlite://")
ledger: list[tuple[str, int, str]] = []


@once(guard, key="order_id")     # a plain function in Agent(tools=[...]); under @tool if you use agno's decorator
async def charge(run_context: RunContext, order_id: str, amount_cents: int, idempotency_key: str = "") -> Any:
    """Charge an order.

    Args:
        order_id: the order to charge
        amount_cents: how much, in cents
    """
    ledger.append((order_id, amount_cents, idempotency_key))  # forward idempotency_key to the provider
    return {"charge_id": f"ch_{len(ledger)}", "amount_cents": amount_cents}


TURNS = [[4900], [4900], [4900, 4900], [5000]]  # again (after a timeout), twice at once, another amount


@dataclass
class Scripted(Model):
    """Stands in for the LLM: each turn is one assistant message with these charge calls."""

    id: str = "scripted"

    def _turn(self, messages: list[Message]) -> ModelResponse:
        n = sum(1 for m in messages if m.role == "assistant")
        if n >= len(TURNS):
            return ModelResponse(role="assistant", content="done")
        return ModelResponse(role="assistant", content="", tool_calls=[
            {"id": f"c{n}_{i}", "type": "function",
             "function": {"name": "charge", "arguments": json.dumps({"order_id": "o-1", "amount_cents": a})}}
            for i, a in enumerate(TURNS[n])
        ])

    def invoke(self, messages: list[Message], assistant_message: Message, **kwargs: Any) -> ModelResponse:
        return self._turn(messages)

    async def ainvoke(self, messages: list[Message], assistant_message: Message, **kwargs: Any) -> ModelResponse:
        return self._turn(messages)

    def invoke_stream(self, messages: list[Message], assistant_message: Message, **kwargs: Any) -> Any:
        yield self._turn(messages)

    async def ainvoke_stream(self, messages: list[Message], assistant_message: Message, **kwargs: Any) -> Any:
        yield self._turn(messages)

    def _parse_provider_response(self, response: Any, **kwargs: Any) -> ModelResponse:
        return response  # type: ignore[no-any-return]

    def _parse_provider_response_delta(self, response: Any) -> ModelResponse:
        return response  # type: ignore[no-any-return]


async def main() -> None:
    async with guard:
        result = await Agent(model=Scripted(), tools=[charge]).arun(
            "charge o-1", session_state={"task_id": "ticket-8812"}
        )
    for t in result.tools or []:
        error = " (tool error)" if t.tool_call_error else ""
        print(f"  model saw {t.tool_call_id}{error}: {str(t.result)[:100]}")
    print(f"side effects: {len(ledger)}")
    assert len(ledger) == 1


if __name__ == "__main__":
    asyncio.run(main())
