"""pydantic-ai: a scripted model charges the same order twice, in parallel, and with another amount.

Needs the pydantic-ai extra:  pip install 'agentguard-idempotency[pydantic-ai]'
Offline (FunctionModel, no API key):  python examples/pydantic_ai_agent.py
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentguard import Guard
from agentguard.integrations.pydantic_ai import once

guard = Guard("sqlite+aiosqlite://")  # in memory; use a file or Postgres in production
ledger: list[tuple[str, int, str]] = []


@dataclass
class Deps:
    task_id: str  # the guard's task id: stable across re-invocations of the same piece of work


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    plan = [
        [("o-1", 4900), ("o-1", 4900)],  # two identical calls in one response: pydantic-ai runs them in parallel
        [("o-1", 4900)],                 # the model forgot it already charged
        [("o-1", 5000)],                 # same order, another amount: refused
    ]
    if turn < len(plan):
        return ModelResponse(parts=[
            ToolCallPart("charge", {"order_id": o, "amount_cents": a}, tool_call_id=f"call_{turn}_{i}")
            for i, (o, a) in enumerate(plan[turn])
        ])
    for m in messages:
        for p in m.parts if isinstance(m, ModelRequest) else ():
            if isinstance(p, ToolReturnPart):
                print(f"  model saw {p.tool_call_id}: {p.content}")
    return ModelResponse(parts=[TextPart("done")])


agent = Agent(FunctionModel(model), deps_type=Deps)


@agent.tool                      # the framework decorator on top ...
@once(guard, key="order_id")     # ... agentguard underneath (the other way round is silently unguarded)
async def charge(
    ctx: RunContext[Deps], order_id: str, amount_cents: int, idempotency_key: str = ""
) -> dict[str, Any]:
    """Charge an order.

    Args:
        order_id: the order to charge
        amount_cents: the amount, in cents
    """
    ledger.append((order_id, amount_cents, idempotency_key))  # a real tool sends idempotency_key to the provider
    return {"charge_id": f"ch_{len(ledger)}", "order_id": order_id, "amount_cents": amount_cents}


async def main() -> None:
    async with guard:
        await agent.run("charge order o-1", deps=Deps(task_id="ticket-8812"))
    print(f"charges made: {len(ledger)}")
    assert len(ledger) == 1


if __name__ == "__main__":
    asyncio.run(main())
