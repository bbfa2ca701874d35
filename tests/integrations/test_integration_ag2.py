"""AG2 (ag2 1.x): the real agent loop (Agent.ask, its tool executor running a turn's calls in parallel)
driven by AG2's own scripted model, ``ag2.testing.TestConfig``, offline."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from ag2 import Agent, Context, tool
from ag2.events import TextInput, ToolCallEvent, ToolErrorEvent, ToolResultEvent, ToolResultsEvent
from ag2.testing import TestConfig, TrackingConfig
from ag2.tools.final import FunctionTool

from agentguard import Guard, current_key, task
from agentguard.integrations.ag2 import GuardToolError, once, refusals

from charges import Ledger
from guard_spans import guard_spans

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
def script(*turns: Sequence[int]) -> TrackingConfig:
    """One model turn per argument (the charge calls it makes for order o-1, by amount), then "done".

    ``raise_tool_errors=False``: a tool error is handed to the model as a result, as a real provider does.
    """
    steps: list[Any] = [
        [
            ToolCallEvent(name="charge", arguments=json.dumps({"order_id": "o-1", "amount_cents": a}), id=f"c{t}_{i}")
            for i, a in enumerate(turn)
        ]
        for t, turn in enumerate(turns)
    ]
    return TrackingConfig(TestConfig(*steps, "done", raise_tool_errors=False))


def results(config: TrackingConfig) -> dict[str, ToolResultEvent]:
    """Every tool result the model was handed, by call id."""
    out: dict[str, ToolResultEvent] = {}
    for call in config.mock.call_args_list:
        event = call.args[0]
        if isinstance(event, ToolResultsEvent):
            out.update({r.parent_id: r for r in event.results})
    return out


def data(result: ToolResultEvent, task_id: str | None = None) -> Any:
    """The value of a tool result; of a replay (``task_id``: its task), after the note it must start with."""
    assert not isinstance(result, ToolErrorEvent), result
    if task_id is None:
        (part,) = result.result.parts
        assert "dev.agentguard/replayed" not in result.result.metadata
    else:
        note, part = result.result.parts
        assert isinstance(note, TextInput) and note.content == NOTE.format(task=task_id)
        assert result.result.metadata == {"dev.agentguard/replayed": True}
    return part.data  # type: ignore[union-attr]


NOTE = ("agentguard: REPLAY. charge[order_id=\"o-1\"] already happened in task {task!r}; this is its recorded "
        "result, returned again. Nothing was executed again.")


def charge_tool(guard: Guard, ledger: Ledger) -> FunctionTool:
    @tool
    @once(guard, key="order_id")
    async def charge(order_id: str, amount_cents: int, context: Context, idempotency_key: str = "") -> dict[str, Any]:
        """Charge an order."""
        await asyncio.sleep(0)  # a parallel duplicate gets in while the first holds the claim
        return ledger.charge(order_id, amount_cents, idempotency_key)

    return charge


@pytest.fixture
def guard(make_guard: Callable[..., Guard]) -> Guard:
    return make_guard()


async def test_retry_after_a_timeout_and_parallel_duplicates_charge_once(guard: Guard) -> None:
    ledger = Ledger()
    config = script([500], [500], [500, 500])  # a call, the same call again (its answer "timed out"), two at once
    agent = Agent("billing", config=config, tools=[charge_tool(guard, ledger)], middleware=[refusals()])
    reply = await agent.ask("charge o-1", variables={"task_id": "ticket-1"})
    assert reply.body == "done"
    assert len(ledger.charges) == 1
    out = results(config)
    first = {"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500}
    assert data(out["c0_0"]) == first  # the replays tell the model so, before the same value
    assert [data(out[c], "ticket-1") for c in ("c1_0", "c2_0", "c2_1")] == [first] * 3
    (record,) = await guard.records()
    assert record.task_id == "ticket-1" and ledger.charges[0][2] == record.key


async def test_a_string_result_is_replayed_after_the_note_and_replay_note_false_tells_nothing(guard: Guard) -> None:
    ledger = Ledger()

    def text_tool(quiet: bool) -> FunctionTool:
        @tool
        @once(guard, key="order_id", replay_note=not quiet)
        def charge(order_id: str, amount_cents: int) -> str:
            """Charge an order."""
            return "charged " + ledger.charge(order_id, amount_cents, current_key())["charge_id"]

        return charge

    config = script([500], [500])
    with task("t-text"):
        await Agent("billing", config=config, tools=[text_tool(False)]).ask("go")
    first, again = results(config)["c0_0"].result.parts, results(config)["c1_0"].result.parts
    assert [p.content for p in first] == ["charged ch_1"]  # type: ignore[attr-defined]
    assert [p.content for p in again] == [NOTE.format(task="t-text"), "charged ch_1"]  # type: ignore[attr-defined]
    config = script([500], [500])
    with task("t-quiet"):
        await Agent("billing", config=config, tools=[text_tool(True)]).ask("go")
    assert results(config)["c1_0"].result.parts == results(config)["c0_0"].result.parts
    assert len(ledger.charges) == 2  # two tasks, each charged once


async def test_other_arguments_reach_the_model_as_a_tool_error_saying_nothing_ran(guard: Guard) -> None:
    ledger = Ledger()
    config = script([500], [700])
    agent = Agent("billing", config=config, tools=[charge_tool(guard, ledger)], middleware=[refusals()])
    assert (await agent.ask("charge o-1", variables={"task_id": "ticket-2"})).body == "done"
    assert len(ledger.charges) == 1
    refused = results(config)["c1_0"]
    assert isinstance(refused, ToolErrorEvent) and isinstance(refused.error, GuardToolError)
    (part,) = refused.result.parts
    text = part.content  # type: ignore[union-attr]
    assert text.startswith("Refused by agentguard: ") and "Traceback" not in text  # the refusal alone
    assert "already called in task 'ticket-2' with different arguments" in text and "amount_cents" in text
    assert text.endswith("Nothing was executed.")


async def test_without_the_middleware_the_refusal_is_still_a_tool_error(guard: Guard) -> None:
    ledger = Ledger()
    config = script([500], [700])
    await Agent("billing", config=config, tools=[charge_tool(guard, ledger)]).ask("go", variables={"task_id": "t-3"})
    refused = results(config)["c1_0"]
    assert isinstance(refused, ToolErrorEvent)
    assert "GuardToolError: Refused by agentguard" in refused.result.parts[0].content  # type: ignore[union-attr]
    assert len(ledger.charges) == 1


async def test_task_context_wins_and_a_sync_tool_without_context_uses_it(guard: Guard) -> None:
    ledger = Ledger()

    @tool
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order."""
        return ledger.charge(order_id, amount_cents, current_key())

    config = script([500, 500], [500])
    with task("outer"):
        await Agent("billing", config=config, tools=[charge]).ask("go", variables={"task_id": "inner"})
    assert len(ledger.charges) == 1
    assert [r.task_id for r in await guard.records()] == ["outer"]


async def test_without_a_task_id_the_model_is_told_nothing_ran(guard: Guard) -> None:
    ledger = Ledger()
    config = script([500])
    await Agent("billing", config=config, tools=[charge_tool(guard, ledger)], middleware=[refusals()]).ask("go")
    assert ledger.charges == []
    refused = results(config)["c0_0"]
    assert isinstance(refused, ToolErrorEvent)
    assert "no task id" in str(refused.error) and str(refused.error).endswith("Nothing was executed.")


async def test_the_model_sees_neither_the_context_nor_the_injected_key(guard: Guard) -> None:
    config = script([500])
    await Agent("billing", config=config, tools=[charge_tool(guard, Ledger())]).ask("go", variables={"task_id": "t"})
    (schema,) = config.calls[0].tools
    parameters = schema.function.parameters  # type: ignore[attr-defined]
    assert set(parameters["properties"]) == {"order_id", "amount_cents"} == set(parameters["required"])


async def test_once_on_top_of_tool_says_which_way_round(guard: Guard) -> None:
    @tool
    async def charge(order_id: str) -> str:
        return order_id

    with pytest.raises(TypeError, match=r"placed on top of a FunctionTool made by AG2's @tool; put it underneath"):
        once(guard, key="order_id")(charge)


@pytest.mark.storeless
async def test_a_misspelt_key_is_refused_at_decoration(guard: Guard) -> None:
    ledger = Ledger()
    with pytest.raises(TypeError) as info:

        @tool
        @once(guard, key="orderid")
        async def charge(order_id: str, amount_cents: int, context: Context) -> dict[str, Any]:
            return ledger.charge(order_id, amount_cents, current_key())

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, context, order_id")
    assert ledger.charges == []


async def test_each_guarded_calls_span_carries_the_tool_call_id(guard: Guard) -> None:
    """gen_ai.tool.call.id: the id of the model's tool call (the Context's tool_call_id), for the call that ran
    and each one replayed; the ledger keeps the same ids."""
    ledger = Ledger()
    config = script([500], [500, 500])
    with guard_spans() as spans:
        await Agent("billing", config=config, tools=[charge_tool(guard, ledger)]).ask(
            "charge o-1", variables={"task_id": "ticket-ids"})
    assert len(ledger.charges) == 1
    calls = spans.calls("charge")
    assert sorted(i for _, i in calls) == ["c0_0", "c1_0", "c1_1"]
    assert sorted(k for k, _ in calls) == ["ran", "replayed", "replayed"]
    await guard.flush_ledger()
    assert {e.call_id for e in await guard.timeline("ticket-ids")} == {"c0_0", "c1_0", "c1_1"}
