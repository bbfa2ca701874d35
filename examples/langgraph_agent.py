"""LangGraph: a ToolNode step that charges and asks a human (interrupt) runs again on resume; the charge is
replayed, not repeated. Then the model tries another amount for the same order and gets an error message.

Needs the langchain extra:  pip install 'agentguard-idempotency[langchain]'
Offline (GenericFakeChatModel, InMemorySaver, no API key):  python examples/langgraph_agent.py
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, interrupt

from agentguard import Guard
from agentguard.integrations.langchain import ToolGuard, once

guard = Guard("sqlite+aiosqlite://")
ledger: list[str] = []


@tool                                # LangChain on top, agentguard underneath
@once(guard, key="order_id")         # task id: the LangGraph thread id
def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
    """Charge an order."""
    ledger.append(idempotency_key)
    return {"charge_id": f"ch_{len(ledger)}", "amount_cents": amount_cents}


@tool
def confirm(question: str) -> str:
    """Ask a human to confirm."""
    return str(interrupt(question))


def tc(cid: str, name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": cid, "type": "tool_call"}


model = GenericFakeChatModel(messages=iter([
    AIMessage("", tool_calls=[tc("c1", "charge", order_id="o-1", amount_cents=4900),
                              tc("c2", "confirm", question="ship it?")]),
    AIMessage("", tool_calls=[tc("c3", "charge", order_id="o-1", amount_cents=5000)]),
    AIMessage("done"),
]))


def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
    return {"messages": [model.invoke(state["messages"])]}


refusals = ToolGuard(guard)  # turns refusals of once-guarded tools into ToolMessage(status="error")
g = StateGraph(MessagesState)
g.add_node("agent", agent)
g.add_node("tools", ToolNode([charge, confirm], wrap_tool_call=refusals.wrap_tool_call))
g.add_edge(START, "agent")
g.add_conditional_edges("agent", tools_condition)
g.add_edge("tools", "agent")
graph = g.compile(checkpointer=InMemorySaver())


def main() -> None:
    config: Any = {"configurable": {"thread_id": "ticket-8812"}}
    state = graph.invoke({"messages": [HumanMessage("charge o-1")]}, config)
    print(f"interrupted: {state['__interrupt__'][0].value!r}; charges so far: {len(ledger)}")
    state = graph.invoke(Command(resume="yes"), config)  # the whole tools step runs again
    for m in state["messages"]:
        if isinstance(m, ToolMessage):
            print(f"  model saw {m.tool_call_id} [{m.status}]: {m.content}")
    print(f"charges made: {len(ledger)}")
    assert len(ledger) == 1
    guard.close()


if __name__ == "__main__":
    main()
