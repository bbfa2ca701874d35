"""OpenAI Agents SDK: a scripted model charges the same order twice, in parallel, and with another amount.

Needs the openai-agents extra:  pip install 'agentguard-idempotency[openai-agents]'
Offline (agents.testing.ScriptedModel, tracing disabled, no API key):  python examples/openai_agents_agent.py
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from agents import Agent, RunContextWrapper, Runner, function_tool, set_tracing_disabled
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call

from agentguard import Guard, current_key
from agentguard.integrations.openai_agents import guard_tool, once

guard = Guard("sqlite+aiosqlite://")
ledger: list[tuple[str, int, str]] = []


@dataclass
class Ctx:
    task_id: str


@function_tool                   # the SDK decorator on top, agentguard underneath
@once(guard, key="order_id")
async def charge(
    ctx: RunContextWrapper[Ctx], order_id: str, amount_cents: int, idempotency_key: str = ""
) -> dict[str, Any]:
    """Charge an order."""
    ledger.append((order_id, amount_cents, idempotency_key))
    return {"charge_id": f"ch_{len(ledger)}", "amount_cents": amount_cents}


@function_tool
def refund(order_id: str) -> str:
    """Refund an order (a tool someone else wrote; guarded below without touching it)."""
    ledger.append((order_id, -1, current_key()))
    return f"refunded {order_id}"


guarded_refund = guard_tool(refund, guard, key="order_id")


def call(name: str, cid: str, **args: Any) -> Any:
    return function_call(name, args, call_id=cid)


async def main() -> None:
    set_tracing_disabled(True)
    model = ScriptedModel([
        [  # two identical calls in one response: the SDK runs them concurrently
            call("charge", "c1", order_id="o-1", amount_cents=4900),
            call("charge", "c2", order_id="o-1", amount_cents=4900),
        ],
        [call("charge", "c3", order_id="o-1", amount_cents=5000)],
        [call("refund", "r1", order_id="o-2"), call("refund", "r2", order_id="o-2")],
        [assistant_message("done")],
    ])
    agent = Agent(name="billing", model=model, tools=[charge, guarded_refund])
    async with guard:
        result = await Runner.run(agent, "charge o-1, refund o-2", context=Ctx(task_id="ticket-8812"))
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem):
            print(f"  model saw {item.raw_item['call_id']}: {item.output}")  # type: ignore[index]
    print(f"side effects: {len(ledger)}")
    assert len(ledger) == 2


if __name__ == "__main__":
    asyncio.run(main())
