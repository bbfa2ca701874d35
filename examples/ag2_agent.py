"""AG2: a scripted model charges the same order, again after a "timeout", twice at once, and with another
amount, in AG2's real agent loop.

Needs the ag2 extra:  pip install 'agentguard-idempotency[ag2]'
Offline (ag2.testing.TestConfig, AG2's own scripted model; no API key):  python examples/ag2_agent.py
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ag2 import Agent, Context, tool
from ag2.events import ToolCallEvent, ToolResultsEvent
from ag2.testing import TestConfig, TrackingConfig

from agentguard import Guard
from agentguard.integrations.ag2 import once, refusals

guard = Guard("sqlite+aiosqlite://")
ledger: list[tuple[str, int, str]] = []


@tool                            # AG2's decorator on top, agentguard underneath
@once(guard, key="order_id")
async def charge(order_id: str, amount_cents: int, context: Context, idempotency_key: str = "") -> dict[str, Any]:
    """Charge an order."""
    ledger.append((order_id, amount_cents, idempotency_key))
    return {"charge_id": f"ch_{len(ledger)}", "amount_cents": amount_cents}


def call(cid: str, amount: int) -> ToolCallEvent:
    return ToolCallEvent(name="charge", arguments=json.dumps({"order_id": "o-1", "amount_cents": amount}), id=cid)


async def main() -> None:
    config = TrackingConfig(TestConfig(
        call("c1", 4900),                         # a call
        call("c2", 4900),                         # its retry after a timeout
        [call("c3", 4900), call("c4", 4900)],     # two at once: AG2 runs them in parallel
        call("c5", 5000),                         # another amount: refused, a tool error
        "done",
        raise_tool_errors=False,
    ))
    agent = Agent("billing", config=config, tools=[charge], middleware=[refusals()])
    async with guard:
        reply = await agent.ask("charge o-1", variables={"task_id": "ticket-8812"})
    for sent in config.mock.call_args_list:
        if isinstance(sent.args[0], ToolResultsEvent):
            for result in sent.args[0].results:
                part = result.result.parts[0]
                shown = getattr(part, "data", None) or getattr(part, "content", None)
                print(f"  model saw {result.parent_id} ({type(result).__name__}): {shown}")
    print(f"reply: {reply.body}; side effects: {len(ledger)}")
    assert len(ledger) == 1


if __name__ == "__main__":
    asyncio.run(main())
