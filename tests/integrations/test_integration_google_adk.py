"""Google ADK: the real Runner loop (LlmAgent, its function-calling flow, FunctionTool) driven by a scripted
model — a ``BaseLlm`` subclass, the extension point ADK documents for models of your own — offline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.tools import FunctionTool, ToolContext
from google.genai import types
from pydantic import Field

from agentguard import Guard, current_key, task
from agentguard.integrations.google_adk import once

from charges import Ledger
from guard_spans import guard_spans

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
Turn = Sequence[tuple[str, dict[str, Any]]]


class ScriptedModel(BaseLlm):
    """Answers each model call with the next turn's function calls, then with the text "done"; keeps every
    request ADK sent (the tools it declared, the function responses it passed back)."""

    turns: list[Turn] = Field(default_factory=list)
    requests: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        n = len(self.requests) - 1
        if n < len(self.turns):
            parts = [
                types.Part(function_call=types.FunctionCall(name=name, args=args, id=f"call_{n}_{i}"))
                for i, (name, args) in enumerate(self.turns[n])
            ]
        else:
            parts = [types.Part(text="done")]
        yield LlmResponse(content=types.Content(role="model", parts=parts))

    def responses(self) -> dict[str, Any]:
        """Every function response the model was sent, by call id."""
        out: dict[str, Any] = {}
        for request in self.requests:
            for content in request.contents:
                for part in content.parts or ():
                    if part.function_response is not None:
                        out[str(part.function_response.id)] = part.function_response.response
        return out


def script(*turns: Sequence[int]) -> ScriptedModel:
    """One model turn per argument; each lists the amounts of the charge calls it makes for order o-1."""
    return ScriptedModel(
        model="scripted",
        turns=[[("charge", {"order_id": "o-1", "amount_cents": a}) for a in turn] for turn in turns],
    )


def guarded_charge(guard: Guard, ledger: Ledger, **options: Any) -> Callable[..., Any]:
    @once(guard, key="order_id", **options)
    async def charge(
        order_id: str, amount_cents: int, tool_context: ToolContext, idempotency_key: str = ""
    ) -> dict[str, Any]:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much
        """
        await asyncio.sleep(0)  # a parallel duplicate gets in while the first holds the claim
        return ledger.charge(order_id, amount_cents, idempotency_key)

    return charge


async def run(
    tool: Any, model: ScriptedModel, state: dict[str, Any] | None = None, session_id: str | None = None
) -> str:
    runner = InMemoryRunner(agent=LlmAgent(name="billing", model=model, tools=[tool]), app_name="shop")
    session = await runner.session_service.create_session(
        app_name="shop", user_id="u-1", state=state or {}, session_id=session_id
    )
    text = ""
    message = types.Content(role="user", parts=[types.Part(text="charge o-1")])
    async for event in runner.run_async(user_id="u-1", session_id=session.id, new_message=message):
        for part in (event.content.parts or ()) if event.content else ():
            text += part.text or ""
    await runner.close()
    return text


@pytest.fixture
def guard(make_guard: Callable[..., Guard]) -> Guard:
    return make_guard()


async def test_retry_after_a_timeout_and_parallel_duplicates_charge_once(guard: Guard) -> None:
    ledger = Ledger()
    model = script([500], [500], [500, 500])  # a call, the same call again (its answer "timed out"), two at once
    assert await run(guarded_charge(guard, ledger), model, state={"task_id": "ticket-1"}) == "done"
    assert len(ledger.charges) == 1
    out = model.responses()
    first = {"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500}
    replayed = {**first, "agentguard": NOTE.format(task="ticket-1")}  # the replays tell the model
    assert out["call_0_0"] == first and out["call_1_0"] == out["call_2_0"] == out["call_2_1"] == replayed
    (record,) = await guard.records()
    assert record.task_id == "ticket-1" and ledger.charges[0][2] == record.key


NOTE = ("agentguard: REPLAY. charge[order_id=\"o-1\"] already happened in task {task!r}; this is its recorded "
        "result, returned again. Nothing was executed again.")


async def test_a_replay_is_told_in_the_response_dict_and_a_string_after_the_note(guard: Guard) -> None:
    """The second call in the session is replayed: the model reads the response dict's entries as the first
    call's, unchanged, plus the note in one more (the guarded function is ADK's tool: called directly, it
    answers as ADK would be answered); a string result (ADK's {"result": ...}) starts with the note;
    replay_note=False tells nothing."""
    ledger = Ledger()
    model = script([500], [500])
    tool = guarded_charge(guard, ledger)
    await run(tool, model, state={"task_id": "ticket-7"})
    out = model.responses()
    first = {"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500}
    assert out["call_0_0"] == first and out["call_1_0"] == {**first, "agentguard": NOTE.format(task="ticket-7")}
    with task("ticket-7"):
        assert await tool("o-1", 500, None) == {**first, "agentguard": NOTE.format(task="ticket-7")}

    @once(guard, key="order_id")
    async def charge(order_id: str, amount_cents: int) -> str:
        """Charge an order."""
        return "charged " + ledger.charge(order_id, amount_cents, current_key())["charge_id"]

    model = script([500], [500])
    with task("ticket-8"):
        await run(charge, model)
    out = model.responses()
    assert out["call_0_0"] == {"result": "charged ch_2"}
    assert out["call_1_0"] == {"result": f"{NOTE.format(task='ticket-8')}\n\ncharged ch_2"}
    quiet, model = guarded_charge(guard, ledger, replay_note=False), script([500], [500])
    await run(quiet, model, state={"task_id": "ticket-9"})
    assert model.responses()["call_1_0"] == model.responses()["call_0_0"]
    assert len(ledger.charges) == 3  # three tasks, each charged once


async def test_other_arguments_reach_the_model_as_an_error_saying_nothing_ran(guard: Guard) -> None:
    ledger = Ledger()
    model = script([500], [700])
    assert await run(guarded_charge(guard, ledger), model, state={"task_id": "ticket-2"}) == "done"
    assert len(ledger.charges) == 1
    refused = model.responses()["call_1_0"]
    assert set(refused) == {"error"}  # ADK's own convention for a function it did not run
    assert "already called in task 'ticket-2' with different arguments" in refused["error"]
    assert "amount_cents" in refused["error"] and refused["error"].endswith("Nothing was executed.")


async def test_the_session_id_is_the_task_id_without_one_in_the_state(guard: Guard) -> None:
    ledger = Ledger()
    tool = guarded_charge(guard, ledger)
    await run(tool, script([500]), session_id="session-9")
    await run(tool, script([500]), session_id="session-9")  # a second invocation of the same conversation
    assert len(ledger.charges) == 1
    assert [r.task_id for r in await guard.records()] == ["session-9"]


async def test_task_context_wins_and_a_sync_tool_without_context_uses_it(guard: Guard) -> None:
    ledger = Ledger()

    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order."""
        return ledger.charge(order_id, amount_cents, current_key())

    with task("outer"):
        await run(charge, script([500], [500, 500]), state={"task_id": "inner"})
    assert len(ledger.charges) == 1
    assert [r.task_id for r in await guard.records()] == ["outer"]


async def test_without_a_task_id_the_model_is_told_nothing_ran(guard: Guard) -> None:
    ledger = Ledger()

    @once(guard, key="order_id")
    async def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order."""
        return ledger.charge(order_id, amount_cents, current_key())

    model = script([500])
    await run(charge, model)
    assert ledger.charges == []
    refused = model.responses()["call_0_0"]["error"]
    assert "no task id" in refused and "Nothing was executed." in refused


async def test_the_model_sees_neither_the_context_nor_the_injected_key(guard: Guard) -> None:
    model = script([500])
    await run(FunctionTool(guarded_charge(guard, Ledger())), model, state={"task_id": "t"})
    (declaration,) = [d for t in model.requests[0].config.tools or () for d in t.function_declarations or ()]
    schema = declaration.parameters_json_schema or declaration.parameters.model_dump(exclude_none=True)
    assert set(schema["properties"]) == {"order_id", "amount_cents"} == set(schema["required"])
    assert declaration.name == "charge"


async def test_once_on_a_function_tool_says_which_way_round(guard: Guard) -> None:
    async def charge(order_id: str) -> str:
        return order_id

    with pytest.raises(TypeError, match=r"placed on top of a FunctionTool made by Google ADK's FunctionTool"):
        once(guard, key="order_id")(FunctionTool(charge))


@pytest.mark.storeless
async def test_a_misspelt_key_is_refused_at_decoration(guard: Guard) -> None:
    ledger = Ledger()
    with pytest.raises(TypeError) as info:

        @once(guard, key="orderid")
        async def charge(order_id: str, amount_cents: int, tool_context: ToolContext) -> dict[str, Any]:
            return ledger.charge(order_id, amount_cents, current_key())

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, order_id, tool_context")
    assert ledger.charges == []


async def test_each_guarded_calls_span_carries_the_function_call_id(guard: Guard) -> None:
    """gen_ai.tool.call.id: the id of the model's function call (the ToolContext's function_call_id), for the
    call that ran and each one replayed; the ledger keeps the same ids."""
    ledger = Ledger()
    with guard_spans() as spans:
        await run(guarded_charge(guard, ledger), script([500], [500, 500]), state={"task_id": "ticket-ids"})
    assert len(ledger.charges) == 1
    calls = spans.calls("charge")
    assert sorted(i for _, i in calls) == ["call_0_0", "call_1_0", "call_1_1"]
    assert sorted(k for k, _ in calls) == ["ran", "replayed", "replayed"]
    await guard.flush_ledger()
    assert {e.call_id for e in await guard.timeline("ticket-ids")} == {"call_0_0", "call_1_0", "call_1_1"}
