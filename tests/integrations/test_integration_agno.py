"""agno: a scripted subclass of agno's own ``Model`` drives the real Agent loop (``arun`` runs a message's tool
calls concurrently); the task id comes from the run's session_state."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from agno.agent import Agent
from agno.models.base import Model
from agno.models.message import Message
from agno.models.response import ModelResponse
from agno.run import RunContext
from agno.tools import tool

from agentguard import Guard, GuardEvent, task
from agentguard.integrations.agno import GuardToolError, once

from charges import Ledger

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
@dataclass
class Scripted(Model):
    """Each turn lists the amounts of the charge calls for order o-1 in one assistant message; then it answers
    "done". Keeps the messages of its last call, so a test reads what the model was told."""

    id: str = "scripted"
    name: str = "Scripted"
    provider: str = "agentguard-tests"
    turns: Sequence[Sequence[int]] = ()
    seen: list[Message] = field(default_factory=list)

    def _turn(self, messages: list[Message]) -> ModelResponse:
        self.seen = list(messages)
        n = sum(1 for m in messages if m.role == "assistant")
        if n < len(self.turns):
            return ModelResponse(role="assistant", content="", tool_calls=[
                {"id": f"call_{n}_{i}", "type": "function",
                 "function": {"name": "charge", "arguments": json.dumps({"order_id": "o-1", "amount_cents": a})}}
                for i, a in enumerate(self.turns[n])
            ])
        return ModelResponse(role="assistant", content="done")

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

    def told(self) -> list[str]:
        return [str(m.content) for m in self.seen if m.role == "tool"]


def charge_tool(guard: Guard, ledger: Ledger, **options: Any) -> Any:
    @tool
    @once(guard, key="order_id", **options)
    async def charge(run_context: RunContext, order_id: str, amount_cents: int, idempotency_key: str = "") -> Any:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much, in cents
        """
        await asyncio.sleep(0)  # a provider call: the other concurrent calls get their turn
        return ledger.charge(order_id, amount_cents, idempotency_key)

    return charge


@pytest.fixture
def events() -> list[GuardEvent]:
    return []


@pytest.fixture
def guard(make_guard: Callable[..., Guard], events: list[GuardEvent]) -> Guard:
    return make_guard(on_event=events.append)


async def run(tool_: Any, model: Scripted, **run_options: Any) -> dict[str, Any]:
    result = await Agent(model=model, tools=[tool_]).arun("charge o-1", **run_options)
    assert result.content == "done"
    return {t.tool_call_id: t for t in result.tools or []}


async def test_repeat_after_a_timeout_and_parallel_calls_charge_once_and_a_change_is_refused(
    guard: Guard, events: list[GuardEvent]
) -> None:
    ledger = Ledger()
    # a charge; the same call again (the model's retry after a timeout); two at once; one with another amount
    model = Scripted(turns=[[500], [500], [500, 500], [700]])
    tools = await run(charge_tool(guard, ledger), model, session_state={"task_id": "task-42"})
    assert len(ledger.charges) == 1
    (record,) = await guard.records()
    assert record.task_id == "task-42" and ledger.charges[0][2] == record.key
    first = str({"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500})
    for cid in ("call_0_0", "call_1_0", "call_2_0", "call_2_1"):
        assert tools[cid].result == first and not tools[cid].tool_call_error
    assert [e.kind for e in events].count("replayed") == 3
    refused = tools["call_3_0"]
    assert refused.tool_call_error
    text = str(refused.result)
    assert "already called in task 'task-42' with different arguments" in text and "amount_cents" in text
    assert text.endswith("Nothing was executed.")
    assert model.told()[-1] == text  # what the model read


async def test_identical_calls_in_one_message_run_concurrently_and_charge_once(guard: Guard) -> None:
    ledger = Ledger()
    arrived: list[str] = []
    all_in = asyncio.Event()

    @once(guard, key="order_id")
    async def guarded(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        await asyncio.sleep(0)
        return ledger.charge(order_id, amount_cents, idempotency_key)

    async def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much, in cents
        """
        arrived.append(order_id)
        if len(arrived) == 3:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 60)  # all three calls are in flight at once before any goes on
        return await guarded(order_id=order_id, amount_cents=amount_cents)

    with task("task-7"):
        tools = await run(charge, Scripted(turns=[[500, 500, 500]]))
    assert len(ledger.charges) == 1
    assert len({t.result for t in tools.values()}) == 1 and len(tools) == 3


async def test_a_sync_tool_without_run_context_takes_the_task_from_the_caller(guard: Guard) -> None:
    ledger = Ledger()

    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much, in cents
        """
        return ledger.charge(order_id, amount_cents, idempotency_key)

    model = Scripted(turns=[[500, 500], [500]])
    with task("ticket-1"):
        tools = await run(charge, model)
    assert len(ledger.charges) == 1 and len({t.result for t in tools.values()}) == 1
    assert [r.task_id for r in await guard.records()] == ["ticket-1"]


async def test_the_schema_the_model_sees_has_only_the_model_arguments(guard: Guard) -> None:
    charge = charge_tool(guard, Ledger())
    charge.process_entrypoint()
    assert set(charge.parameters["properties"]) == {"order_id", "amount_cents"}


async def test_dependencies_give_the_task_id_and_a_second_run_replays(guard: Guard) -> None:
    ledger = Ledger()
    tool_ = charge_tool(guard, ledger)
    await run(tool_, Scripted(turns=[[500]]), dependencies={"task_id": "order-77"})
    await run(tool_, Scripted(turns=[[500]]), dependencies={"task_id": "order-77"})  # a new run id, same task
    assert len(ledger.charges) == 1
    assert [r.task_id for r in await guard.records()] == ["order-77"]


async def test_without_a_task_id_nothing_runs_and_the_model_is_told(guard: Guard) -> None:
    ledger = Ledger()
    model = Scripted(turns=[[500]])
    tools = await run(charge_tool(guard, ledger), model)
    assert ledger.charges == []
    assert tools["call_0_0"].tool_call_error
    assert "no task id" in model.told()[-1] and "Nothing was executed." in model.told()[-1]


async def test_an_explicit_task_id_callable_gets_the_run_context(guard: Guard) -> None:
    ledger = Ledger()
    tool_ = charge_tool(guard, ledger, task_id=lambda rc: f"session-{rc.session_id}")
    await run(tool_, Scripted(turns=[[500]]), session_id="s-1", session_state={"task_id": "ignored"})
    assert [r.task_id for r in await guard.records()] == ["session-s-1"]


async def test_guard_tool_error_is_agnos_run_exception() -> None:
    from agno.exceptions import AgentRunException

    assert issubclass(GuardToolError, AgentRunException)


@pytest.mark.storeless
async def test_a_misspelt_key_is_refused_at_decoration(guard: Guard) -> None:
    ledger = Ledger()
    with pytest.raises(TypeError) as info:

        @tool
        @once(guard, key="orderid")
        async def charge(run_context: RunContext, order_id: str, amount_cents: int) -> Any:
            return ledger.charge(order_id, amount_cents, "")

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, order_id, run_context")
    assert ledger.charges == []


NOTE = ("agentguard: REPLAY. charge[order_id=\"o-1\"] already happened in task {task!r}; this is its recorded "
        "result, returned again. Nothing was executed again.")


def text_tool(guard: Guard, ledger: Ledger, **options: Any) -> Any:
    @tool
    @once(guard, key="order_id", **options)
    def charge(run_context: RunContext, order_id: str, amount_cents: int) -> str:
        """Charge an order."""
        return json.dumps(ledger.charge(order_id, amount_cents, ""))

    return charge


async def test_a_replayed_string_is_told_to_the_model_a_dict_keeps_its_text(guard: Guard) -> None:
    """The second call in the task is replayed: the model's tool message is the note, then the first call's text;
    a dict result (which agno sends as its str) is replayed as it is; replay_note=False tells nothing."""
    ledger = Ledger()
    model = Scripted(turns=[[500], [500]])
    tools = await run(text_tool(guard, ledger), model, session_state={"task_id": "task-t"})
    first = json.dumps({"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500})
    assert model.told() == [first, f"{NOTE.format(task='task-t')}\n\n{first}"]
    assert tools["call_1_0"].result == f"{NOTE.format(task='task-t')}\n\n{first}"
    model = Scripted(turns=[[500], [500]])
    await run(charge_tool(guard, ledger), model, session_state={"task_id": "task-d"})
    assert model.told()[0] == model.told()[1] == str({"charge_id": "ch_2", "order_id": "o-1", "amount_cents": 500})
    model = Scripted(turns=[[500], [500]])
    await run(text_tool(guard, ledger, replay_note=False), model, session_state={"task_id": "task-q"})
    assert model.told()[0] == model.told()[1]
    assert len(ledger.charges) == 3  # three tasks, each charged once
