"""Google ADK: a scripted model charges the same order, again after a "timeout", twice at once, and with
another amount, in ADK's real Runner loop.

Needs the google-adk extra:  pip install 'agentguard-idempotency[google-adk]'
Offline (a scripted BaseLlm, ADK's extension point for models of your own; no API key):
python examples/google_adk_agent.py
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.tools import ToolContext
from google.genai import types

from agentguard import Guard
from agentguard.integrations.google_adk import once

guard = Guard("sqlite+aiosqlite://")
ledger: list[tuple[str, int, str]] = []


@once(guard, key="order_id")        # ADK wraps the guarded function in a FunctionTool
async def charge(
    order_id: str, amount_cents: int, tool_context: ToolContext, idempotency_key: str = ""
) -> dict[str, Any]:
    """Charge an order."""
    ledger.append((order_id, amount_cents, idempotency_key))
    return {"charge_id": f"ch_{len(ledger)}", "amount_cents": amount_cents}


TURNS = [[4900], [4900], [4900, 4900], [5000]]  # a call, its retry, two at once, another amount


class ScriptedModel(BaseLlm):
    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        n = sum(c.role == "model" for c in llm_request.contents)
        if n < len(TURNS):
            parts = [
                types.Part(function_call=types.FunctionCall(
                    name="charge", args={"order_id": "o-1", "amount_cents": a}, id=f"c{n}_{i}"))
                for i, a in enumerate(TURNS[n])
            ]
        else:
            parts = [types.Part(text="done")]
        usage = types.GenerateContentResponseUsageMetadata(prompt_token_count=1, candidates_token_count=1)
        yield LlmResponse(content=types.Content(role="model", parts=parts), usage_metadata=usage)


async def main() -> None:
    runner = InMemoryRunner(agent=LlmAgent(name="billing", model=ScriptedModel(model="scripted"), tools=[charge]))
    session = await runner.session_service.create_session(
        app_name=runner.app_name, user_id="u-1", state={"task_id": "ticket-8812"}  # else: the session id
    )
    message = types.Content(role="user", parts=[types.Part(text="charge o-1")])
    async with guard:
        async for event in runner.run_async(user_id="u-1", session_id=session.id, new_message=message):
            for part in (event.content.parts or ()) if event.content else ():
                if part.function_response is not None:
                    print(f"  model saw {part.function_response.id}: {part.function_response.response}")
        await runner.close()
    print(f"side effects: {len(ledger)}")
    assert len(ledger) == 1


if __name__ == "__main__":
    asyncio.run(main())
