"""smolagents: a scripted model charges the same order again, twice at once, and with another amount.

Needs the smolagents extra:  pip install 'agentguard-idempotency[smolagents]'
Offline (a scripted Model subclass, no API key):  python examples/smolagents_agent.py
"""

from __future__ import annotations

from typing import Any, ClassVar

from smolagents import Model, ToolCallingAgent, tool
from smolagents.models import ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole

from agentguard import Guard, current_key, task
from agentguard.integrations.smolagents import guard_tool

guard = Guard("sqlite+aiosqlite://")
ledger: list[tuple[str, int, str]] = []


@tool
def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Charge an order.

    Args:
        order_id: the order to charge
        amount_cents: how much, in cents
    """
    ledger.append((order_id, amount_cents, current_key()))  # forward current_key() to the provider
    return {"charge_id": f"ch_{len(ledger)}", "amount_cents": amount_cents}


class Scripted(Model):
    """Stands in for the LLM: each turn is one assistant message with these charge calls."""

    turns: ClassVar = [[4900], [4900], [4900, 4900], [5000]]  # again (after a timeout), twice at once, another

    def generate(self, messages: list[Any], stop_sequences: Any = None, response_format: Any = None,
                 tools_to_call_from: Any = None, **kwargs: Any) -> ChatMessage:
        n = sum(1 for m in messages if m.role == MessageRole.ASSISTANT)
        if n < len(self.turns):
            calls = [("charge", {"order_id": "o-1", "amount_cents": a}) for a in self.turns[n]]
        else:
            calls = [("final_answer", {"answer": "done"})]
        return ChatMessage(role=MessageRole.ASSISTANT, content="", tool_calls=[
            ChatMessageToolCall(id=f"c{n}_{i}", type="function",
                                function=ChatMessageToolCallFunction(name=name, arguments=args))
            for i, (name, args) in enumerate(calls)
        ])


def main() -> None:
    agent = ToolCallingAgent(tools=[guard_tool(charge, guard, key="order_id")], model=Scripted(model_id="script"),
                             verbosity_level=0)
    with guard, task("ticket-8812"):  # smolagents has no stable id of its own: the task comes from here
        agent.run("charge o-1")
    for step in agent.memory.steps:
        if getattr(step, "tool_calls", None):
            print(f"  model saw: {str(step.observations).replace(chr(10), ' | ')[:110]}")
    print(f"side effects: {len(ledger)}")
    assert len(ledger) == 1


if __name__ == "__main__":
    main()
