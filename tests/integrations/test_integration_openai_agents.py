"""OpenAI Agents SDK: agents.testing.ScriptedModel drives the real Runner loop."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunContextWrapper, Runner, function_tool, set_tracing_disabled
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool import default_tool_error_function

from agentguard import Guard, current_key, task
from agentguard.integrations.openai_agents import guard_tool, once

from charges import Ledger
from guard_spans import guard_spans

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
@pytest.fixture(autouse=True)
def _no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # nothing is exported anywhere; no API key needed
    yield
    set_tracing_disabled(False)


@dataclass
class Ctx:
    task_id: str | None


def script(*turns: Sequence[int]) -> ScriptedModel:
    """One model step per turn; each turn lists the amounts of the charge calls it makes for order o-1."""
    steps: list[Any] = [
        [
            function_call("charge", {"order_id": "o-1", "amount_cents": a}, call_id=f"call_{t}_{i}")
            for i, a in enumerate(turn)
        ]
        for t, turn in enumerate(turns)
    ]
    steps.append([assistant_message("done")])
    return ScriptedModel(steps)


def outputs(result: Any) -> dict[str, Any]:
    items: list[Any] = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    return {i.raw_item["call_id"]: i.output for i in items}


def decorated(guard: Guard, ledger: Ledger) -> FunctionTool:
    @function_tool
    @once(guard, key="order_id")
    async def charge(
        ctx: RunContextWrapper[Ctx], order_id: str, amount_cents: int, idempotency_key: str = ""
    ) -> dict[str, Any]:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much
        """
        return ledger.charge(order_id, amount_cents, idempotency_key)

    return charge


@pytest.fixture
def guard(make_guard: Callable[..., Guard]) -> Guard:
    return make_guard()


async def run(tool: FunctionTool, model: ScriptedModel, ctx: Ctx | None = None) -> Any:
    result = await Runner.run(Agent(name="billing", model=model, tools=[tool]), "charge o-1", context=ctx)
    model.assert_complete()
    return result


async def test_two_calls_in_one_task_charge_once_and_replay(guard: Guard) -> None:
    ledger = Ledger()
    result = await run(decorated(guard, ledger), script([500], [500]), Ctx("task-42"))
    assert len(ledger.charges) == 1
    out = outputs(result)
    assert out["call_0_0"] == out["call_1_0"] == {"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500}
    assert result.final_output == "done"


async def test_identical_calls_in_one_turn_charge_once(guard: Guard) -> None:
    ledger = Ledger()
    result = await run(decorated(guard, ledger), script([500, 500]), Ctx("task-42"))
    assert len(ledger.charges) == 1
    out = outputs(result)
    assert out["call_0_0"] == out["call_0_1"]


async def test_different_amount_reaches_the_model_as_a_refusal(guard: Guard) -> None:
    ledger = Ledger()
    model = script([500], [700])
    result = await run(decorated(guard, ledger), model, Ctx("task-42"))
    assert len(ledger.charges) == 1
    refusal = outputs(result)["call_1_0"]
    assert "already called in task 'task-42' with different arguments" in refusal and "amount_cents" in refusal
    assert not refusal.startswith(default_tool_error_function(RunContextWrapper(context=None), RuntimeError()))
    # and it is what the model was sent
    sent = [
        i for i in model.calls[2].input
        if isinstance(i, dict) and i.get("type") == "function_call_output" and i.get("call_id") == "call_1_0"
    ]
    assert sent and "different arguments" in str(sent[0]["output"])


async def test_missing_task_id_is_refused_without_running(guard: Guard) -> None:
    ledger = Ledger()
    result = await run(decorated(guard, ledger), script([500]), Ctx(None))
    assert ledger.charges == []
    assert "no task id" in outputs(result)["call_0_0"]


async def test_injected_key_and_context_are_not_in_the_model_schema(guard: Guard) -> None:
    ledger = Ledger()
    model = script([500])
    await run(decorated(guard, ledger), model, Ctx("task-42"))
    assert model.first_call is not None
    (tool,) = model.first_call.tools
    assert isinstance(tool, FunctionTool)
    schema = tool.params_json_schema
    assert set(schema["properties"]) == {"order_id", "amount_cents"} == set(schema["required"])
    assert "idempotency_key" not in json.dumps(schema) and "ctx" not in json.dumps(schema)
    (record,) = await guard.records()
    assert ledger.charges[0][2] == record.key


async def test_sync_tool_without_context_uses_the_task_context(guard: Guard) -> None:
    ledger = Ledger()

    @function_tool
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        return ledger.charge(order_id, amount_cents, current_key())

    with task("ticket-1"):
        result = await run(charge, script([500, 500], [500]))
    assert len(ledger.charges) == 1
    assert len(set(map(json.dumps, outputs(result).values()))) == 1
    assert [r.task_id for r in await guard.records()] == ["ticket-1"]


def plain_tool(ledger: Ledger, fail: list[Exception] | None = None) -> FunctionTool:
    @function_tool
    async def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order."""
        if fail:
            raise fail.pop()
        return ledger.charge(order_id, amount_cents, current_key())

    return charge


async def test_guard_tool_wraps_an_existing_function_tool(guard: Guard) -> None:
    ledger = Ledger()
    original = plain_tool(ledger)
    guarded = guard_tool(original, guard, key="order_id")
    assert guarded is not original and guarded.params_json_schema == original.params_json_schema
    model = script([500, 500], [500], [700])
    result = await run(guarded, model, Ctx("task-5"))
    assert len(ledger.charges) == 1
    out = outputs(result)
    assert out["call_0_0"] == out["call_0_1"] == out["call_1_0"]
    assert "different arguments" in out["call_2_0"]
    (record,) = await guard.records()
    assert record.task_id == "task-5" and ledger.charges[0][2] == record.key


async def test_guard_tool_normalises_the_raw_json_arguments(guard: Guard) -> None:
    ledger = Ledger()
    steps: list[Any] = [
        [function_call("charge", '{"order_id": "o-1", "amount_cents": 500}', call_id="c1")],
        [function_call("charge", '{"amount_cents":500.0,"order_id":"o-1"}', call_id="c2")],
        [assistant_message("done")],
    ]
    result = await run(guard_tool(plain_tool(ledger), guard, key="order_id"), ScriptedModel(steps), Ctx("t"))
    assert len(ledger.charges) == 1
    assert outputs(result)["c1"] == outputs(result)["c2"]


async def test_guard_tool_releases_on_a_tool_error_and_does_not_store_it(guard: Guard) -> None:
    ledger = Ledger()
    tool = guard_tool(plain_tool(ledger, fail=[RuntimeError("card network down")]), guard, key="order_id")
    result = await run(tool, script([500], [500]), Ctx("task-3"))
    out = outputs(result)
    # The body's error reaches the model as the SDK's own failure text (its wording changed in 0.25: the SDK's
    # function, not a copy of its text, says what it is).
    error = RuntimeError("card network down")
    assert out["call_0_0"] == default_tool_error_function(RunContextWrapper(context=None), error)
    assert "card network down" not in out["call_0_0"]
    assert out["call_1_0"]["charge_id"] == "ch_1"  # the retry ran: the error was not stored as a result
    assert len(ledger.charges) == 1


async def test_guard_tool_rejects_non_tools_and_double_guarding(guard: Guard) -> None:
    with pytest.raises(TypeError, match="FunctionTool"):
        guard_tool(lambda: None, guard)  # type: ignore[arg-type]
    tool = guard_tool(plain_tool(Ledger()), guard)
    with pytest.raises(TypeError, match="already guarded"):
        guard_tool(tool, guard)


async def test_guard_on_top_of_function_tool_is_a_type_error(guard: Guard) -> None:
    with pytest.raises(TypeError, match="put it underneath"):
        guard.once(plain_tool(Ledger()))  # type: ignore[call-overload]


@pytest.mark.storeless
async def test_guard_tool_refuses_a_key_field_the_tool_does_not_take(guard: Guard) -> None:
    """Keyed on a field the tool lacks, every call would be keyed on null: a second refund of another charge
    would be refused as a reuse of the first. Refused when the tool is guarded, before any call."""
    refunds: list[str] = []

    @function_tool
    def refund(charge_id: str, amount_cents: int) -> str:
        """Refund a charge."""
        refunds.append(charge_id)
        return "refunded"

    with pytest.raises(TypeError) as info:
        guard_tool(refund, guard, key="order_id")
    assert str(info.value) == "key='order_id' is not an argument of refund; its arguments are: amount_cents, charge_id"
    with pytest.raises(TypeError) as info:
        guard_tool(plain_tool(Ledger()), guard, key="order_id", ignore=["amount"])
    assert str(info.value) == ("ignore='amount' is not an argument of charge (did you mean 'amount_cents'?); its "
                               "arguments are: amount_cents, order_id")
    assert refunds == []


@pytest.mark.storeless
async def test_decorator_refuses_a_misspelt_key_at_decoration(guard: Guard) -> None:
    ledger = Ledger()
    with pytest.raises(TypeError) as info:

        @function_tool
        @once(guard, key="orderid")
        def charge(ctx: RunContextWrapper[Ctx], order_id: str, amount_cents: int) -> dict[str, Any]:
            return ledger.charge(order_id, amount_cents, current_key())

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, ctx, order_id")
    assert ledger.charges == []


NOTE = ("agentguard: REPLAY. charge[order_id=\"o-1\"] already happened in task {task!r}; this is its recorded "
        "result, returned again. Nothing was executed again.")


def sent(model: ScriptedModel, call_id: str) -> Any:
    """The output of ``call_id`` as the model was sent it (in the input of a later model call)."""
    for call in model.calls:
        for i in call.input if isinstance(call.input, list) else ():
            if isinstance(i, dict) and i.get("type") == "function_call_output" and i.get("call_id") == call_id:
                return i["output"]
    raise AssertionError(f"the model was never sent {call_id}")


def text_tool(ledger: Ledger) -> FunctionTool:
    @function_tool
    async def charge(order_id: str, amount_cents: int) -> str:
        """Charge an order."""
        receipt = ledger.charge(order_id, amount_cents, current_key())
        return json.dumps(receipt)

    return charge


@pytest.mark.parametrize("how", ["once", "guard_tool"])
async def test_a_replayed_string_output_is_told_to_the_model(guard: Guard, how: str) -> None:
    """The second call in the task is replayed: the model reads the note, then the first call's text unchanged;
    a replay's text is the note and the stored text, nothing else."""
    ledger = Ledger()
    if how == "once":

        @function_tool
        @once(guard, key="order_id")
        async def charge(order_id: str, amount_cents: int) -> str:
            """Charge an order."""
            return json.dumps(ledger.charge(order_id, amount_cents, current_key()))

        tool = charge
    else:
        tool = guard_tool(text_tool(ledger), guard, key="order_id")
    model = script([500], [500])
    with task("task-42"):
        result = await run(tool, model)
    assert len(ledger.charges) == 1
    first = json.dumps({"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500})
    assert sent(model, "call_0_0") == outputs(result)["call_0_0"] == first
    assert sent(model, "call_1_0") == outputs(result)["call_1_0"] == f"{NOTE.format(task='task-42')}\n\n{first}"
    with task("task-42"):  # the stored value is the tool's own text: what a replay tells rests on it
        stored = await guard.run("charge", lambda _k: _never(), key={"order_id": "o-1"},
                                 arguments={"order_id": "o-1", "amount_cents": 500})
    assert stored.replayed and stored.value == first


async def _never() -> str:
    raise AssertionError("replayed, never run")


async def test_a_replayed_dict_output_keeps_its_type_and_replay_note_false_tells_nothing(guard: Guard) -> None:
    ledger = Ledger()
    result = await run(decorated(guard, ledger), script([500], [500]), Ctx("task-d"))
    out = outputs(result)  # a dict has no room for a note: replayed as it is (test_two_calls_... above)
    assert out["call_1_0"] == out["call_0_0"] == {"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500}
    quiet = guard_tool(text_tool(Ledger()), guard, key="order_id", replay_note=False)
    model = script([500], [500])
    result = await run(quiet, model, Ctx("task-q"))
    assert outputs(result)["call_1_0"] == outputs(result)["call_0_0"] == sent(model, "call_1_0")


@pytest.mark.parametrize("how", ["once", "guard_tool"])
async def test_each_guarded_calls_span_carries_the_models_call_id(guard: Guard, how: str) -> None:
    """gen_ai.tool.call.id: the SDK's call_id of each call, the one that ran and the ones replayed (the
    decorator finds it in the ToolContext the SDK hands the tool), and the ledger keeps the same ids."""
    ledger = Ledger()
    tool = decorated(guard, ledger) if how == "once" else guard_tool(plain_tool(ledger), guard, key="order_id")
    with guard_spans() as spans:
        await run(tool, script([500, 500], [500]), Ctx("task-ids"))
    assert len(ledger.charges) == 1
    calls = spans.calls("charge")
    assert sorted(i for _, i in calls) == ["call_0_0", "call_0_1", "call_1_0"]
    assert sorted(k for k, _ in calls) == ["ran", "replayed", "replayed"]
    await guard.flush_ledger()
    assert {e.call_id for e in await guard.timeline("task-ids")} == {"call_0_0", "call_0_1", "call_1_0"}


@pytest.mark.parametrize("how", ["once", "guard_tool"])
async def test_a_call_refused_for_want_of_a_task_id_has_its_span(guard: Guard, how: str) -> None:
    """Refused before any key exists (no task id): still a span, refused, error.type MissingTaskError, with the
    SDK's call id."""
    ledger = Ledger()
    tool = decorated(guard, ledger) if how == "once" else guard_tool(plain_tool(ledger), guard, key="order_id")
    with guard_spans() as spans:
        result = await run(tool, script([500]), Ctx(None))
    assert ledger.charges == [] and "no task id" in outputs(result)["call_0_0"]
    (span,) = spans.guarded("charge")
    assert span.attributes is not None and span.attributes["agentguard.outcome"] == "refused"
    assert span.attributes["error.type"] == "MissingTaskError" and span.attributes["gen_ai.tool.call.id"] == "call_0_0"
