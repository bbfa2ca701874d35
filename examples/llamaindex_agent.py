"""LlamaIndex: a scripted LLM has a FunctionAgent charge the same order again, twice at once, and with another
amount; the task id is the one in the agent's state.

Needs the llamaindex extra:  pip install 'agentguard-idempotency[llamaindex]'
Offline (LlamaIndex's MockFunctionCallingLLM with a scripted response generator):  python examples/llamaindex_agent.py
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool
from workflows import Context

from agentguard import Guard
from agentguard.integrations.llamaindex import once

guard = Guard("sqlite+aiosqlite://")
ledger: list[tuple[str, int, str]] = []


@once(guard, key="order_id")   # then FunctionTool.from_defaults(charge), below
async def charge(ctx: Context, order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
    """Charge an order."""
    ledger.append((order_id, amount_cents, idempotency_key))  # forward idempotency_key to the provider
    return {"charge_id": f"ch_{len(ledger)}", "amount_cents": amount_cents}


TURNS = [[4900], [4900], [4900, 4900], [5000]]  # again (after a timeout), twice at once, another amount


def script(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
    """Stands in for the LLM: each turn is one assistant message with these charge calls."""
    n = sum(1 for m in messages if m.role == MessageRole.ASSISTANT)
    if n < len(TURNS):
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[
            ToolCallBlock(tool_call_id=f"c{n}_{i}", tool_name="charge",
                          tool_kwargs={"order_id": "o-1", "amount_cents": a})
            for i, a in enumerate(TURNS[n])
        ])
    return ChatMessage(role=MessageRole.ASSISTANT, content="done")


async def main() -> None:
    llm = MockFunctionCallingLLM(response_generator=script)
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(charge)], llm=llm, initial_state={"task_id": "ticket-8812"})
    async with guard:
        handler = agent.run("charge o-1")
        async for ev in handler.stream_events():
            if isinstance(ev, ToolCallResult):
                error = " (tool error)" if ev.tool_output.is_error else ""
                print(f"  model saw {ev.tool_id}{error}: {str(ev.tool_output.content)[:100]}")
        await handler
    print(f"side effects: {len(ledger)}")
    assert len(ledger) == 1


if __name__ == "__main__":
    asyncio.run(main())
