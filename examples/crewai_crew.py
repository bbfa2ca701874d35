"""CrewAI: a crew charges an order, is run again after a timeout, and two crews charge it at once.

Needs the crewai extra:  pip install 'agentguard-idempotency[crewai]'   (crewai pulls mcp 1.x: not beside the mcp extra)
Offline (a scripted subclass of CrewAI's BaseLLM answering in ReAct text, no API key):  python examples/crewai_crew.py
"""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from typing import Any

os.environ.update(  # nothing leaves the machine, and no prompt waits for an answer
    CREWAI_DISABLE_TELEMETRY="true", OTEL_SDK_DISABLED="true", CREWAI_TRACING_ENABLED="false", CREWAI_TESTING="true"
)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from crewai import Agent, Crew, Task
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import tool

from agentguard import Guard, task
from agentguard.integrations.crewai import once

guard = Guard("sqlite+aiosqlite://")
ledger: list[tuple[str, int, str]] = []


@tool("charge")                  # CrewAI's decorator on top, agentguard underneath
@once(guard, key="order_id")
def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str:
    """Charge an order."""
    ledger.append((order_id, amount_cents, idempotency_key))  # forward idempotency_key to the provider
    return json.dumps({"charge_id": f"ch_{len(ledger)}", "amount_cents": amount_cents})


class Scripted(BaseLLM):
    """Stands in for the LLM: charges o-1 once per amount, then answers."""

    def __init__(self, *amounts: int) -> None:
        super().__init__(model="scripted")
        self.amounts = list(amounts)
        self.observations: list[str] = []

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        said = [m["content"] for m in messages if m["role"] == "assistant"] if isinstance(messages, list) else []
        self.observations = [s.split("Observation:", 1)[1].strip() for s in said if "Observation:" in s]
        if self.amounts:
            args_json = json.dumps({"order_id": "o-1", "amount_cents": self.amounts.pop(0)})
            return f"Thought: I charge the order.\nAction: charge\nAction Input: {args_json}"
        return "Thought: I now know the final answer\nFinal Answer: done"

    def supports_function_calling(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 8192

    def get_input_tokens_count(self, messages: Any, *args: Any, **kwargs: Any) -> int:
        return len(str(messages)) // 4  # CrewAI's own estimate, without its warning that it is one


def crew(llm: Scripted) -> Crew:
    agent = Agent(role="billing", goal="charge orders", backstory="a careful clerk", llm=llm, tools=[charge])
    return Crew(agents=[agent], tasks=[Task(description="charge o-1", expected_output="done", agent=agent)])


async def both(one: Crew, two: Crew) -> None:
    await asyncio.gather(one.kickoff_async(), two.kickoff_async())


def main() -> None:
    llms = [Scripted(4900), Scripted(4900, 5000), Scripted(4900), Scripted(4900)]
    with guard, task("ticket-8812"):  # CrewAI gives a tool no stable id: the task comes from here
        crew(llms[0]).kickoff()
        crew(llms[1]).kickoff()  # run again after a timeout; then with another amount
        asyncio.run(both(crew(llms[2]), crew(llms[3])))  # two at once
    for i, llm in enumerate(llms):
        for said in llm.observations:
            print(f"  crew {i + 1} saw: {said[:100]}")
    print(f"side effects: {len(ledger)}")
    assert len(ledger) == 1


if __name__ == "__main__":
    main()
