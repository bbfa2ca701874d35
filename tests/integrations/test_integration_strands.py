"""Strands Agents: a scripted subclass of Strands' own ``Model`` (its ``stream`` yields the events a provider's
would) drives the real Agent event loop, whose concurrent executor runs a message's tool calls at once.

Strands pins mcp<2.2, so scripts/test.sh runs this file in a virtualenv of its own (SQLite)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from strands import Agent, tool
from strands.models.model import Model
from strands.types.tools import ToolContext

from agentguard import Guard, GuardEvent, task
from agentguard.integrations.strands import once

from charges import Ledger
from guard_spans import guard_spans

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
class Scripted(Model):
    """Each turn lists the amounts of the charge calls for order o-1 in one assistant message; then it answers
    "done". Keeps the messages of its last call, so a test reads what the model was told."""

    def __init__(self, *turns: Sequence[int]) -> None:
        self.turns = list(turns)
        self.seen: list[Any] = []

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    async def structured_output(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        raise NotImplementedError("not used by these tests")
        yield

    async def stream(self, messages: Any, tool_specs: Any = None, system_prompt: Any = None,  # type: ignore[override]
                     **kwargs: Any) -> AsyncIterator[Any]:
        self.seen = list(messages)
        n = sum(1 for m in messages if m["role"] == "assistant")
        yield {"messageStart": {"role": "assistant"}}
        if n < len(self.turns):
            for i, amount in enumerate(self.turns[n]):
                yield {"contentBlockStart": {"start": {"toolUse": {"toolUseId": f"call_{n}_{i}", "name": "charge"}}}}
                args = json.dumps({"order_id": "o-1", "amount_cents": amount})
                yield {"contentBlockDelta": {"delta": {"toolUse": {"input": args}}}}
                yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
        else:
            yield {"contentBlockDelta": {"delta": {"text": "done"}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}

    def results(self) -> dict[str, Any]:
        """The tool results the model was sent, by tool use id."""
        return {c["toolResult"]["toolUseId"]: c["toolResult"]
                for m in self.seen for c in m["content"] if "toolResult" in c}


def charge_tool(guard: Guard, ledger: Ledger, **options: Any) -> Any:
    @tool(context=True)
    @once(guard, key="order_id", **options)
    async def charge(order_id: str, amount_cents: int, tool_context: ToolContext, idempotency_key: str = "") -> Any:
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


async def run(tool_: Any, model: Scripted, agent: Agent | None = None, **invocation_state: Any) -> dict[str, Any]:
    agent = agent or Agent(model=model, tools=[tool_], callback_handler=None)
    result = await agent.invoke_async("charge o-1", invocation_state=invocation_state)
    assert str(result).strip() == "done"
    return model.results()


def text(result: dict[str, Any]) -> str:
    return "".join(part["text"] for part in result["content"])


async def test_repeat_after_a_timeout_and_parallel_calls_charge_once_and_a_change_is_refused(
    guard: Guard, events: list[GuardEvent]
) -> None:
    ledger = Ledger()
    # a charge; the same call again (the model's retry after a timeout); two at once; one with another amount
    model = Scripted([500], [500], [500, 500], [700])
    results = await run(charge_tool(guard, ledger), model, task_id="task-42")
    assert len(ledger.charges) == 1
    (record,) = await guard.records()
    assert record.task_id == "task-42" and ledger.charges[0][2] == record.key
    first = json.loads(text(results["call_0_0"]))
    assert first == {"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500}
    for cid in ("call_1_0", "call_2_0", "call_2_1"):
        assert results[cid]["status"] == "success" and json.loads(text(results[cid])) == first
    assert [e.kind for e in events].count("replayed") == 3
    refused = results["call_3_0"]
    assert refused["status"] == "error"
    said = text(refused)
    assert said.startswith("Refused by agentguard:") and "amount_cents" in said
    assert "already called in task 'task-42' with different arguments" in said
    assert said.endswith("Nothing was executed.")


async def test_identical_calls_in_one_message_run_concurrently_and_charge_once(guard: Guard) -> None:
    ledger = Ledger()
    arrived: list[str] = []
    all_in = asyncio.Event()

    @once(guard, key="order_id")
    async def guarded(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        await asyncio.sleep(0)
        return ledger.charge(order_id, amount_cents, idempotency_key)

    @tool
    async def charge(order_id: str, amount_cents: int) -> Any:
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

    model = Scripted([500, 500, 500])
    with task("task-7"):
        results = await run(charge, model)
    assert len(ledger.charges) == 1
    assert len({text(r) for r in results.values()}) == 1 and len(results) == 3


async def test_the_agent_state_and_then_the_session_give_the_task_id(guard: Guard, tmp_path: Any) -> None:
    from strands.session.file_session_manager import FileSessionManager

    ledger = Ledger()
    tool_ = charge_tool(guard, ledger)
    model = Scripted([500])
    agent = Agent(model=model, tools=[tool_], callback_handler=None, state={"task_id": "order-77"})
    await run(tool_, model, agent)
    model = Scripted([500])
    sessions = FileSessionManager(session_id="ticket-5", storage_dir=str(tmp_path))
    await run(tool_, model, Agent(model=model, tools=[tool_], callback_handler=None, session_manager=sessions))
    model = Scripted([500])
    again = FileSessionManager(session_id="ticket-5", storage_dir=str(tmp_path))  # as after a restart
    await run(tool_, model, Agent(model=model, tools=[tool_], callback_handler=None, session_manager=again))
    assert len(ledger.charges) == 2
    assert sorted(r.task_id for r in await guard.records()) == ["order-77", "ticket-5"]


async def test_a_sync_tool_without_context_takes_the_task_from_the_caller(guard: Guard) -> None:
    ledger = Ledger()

    @tool
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> Any:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much, in cents
        """
        return ledger.charge(order_id, amount_cents, idempotency_key)

    assert set(charge.tool_spec["inputSchema"]["json"]["properties"]) == {"order_id", "amount_cents"}
    model = Scripted([500, 500], [500])
    with task("ticket-1"):
        agent = Agent(model=model, tools=[charge], callback_handler=None)
        assert str(agent("charge o-1")).strip() == "done"  # the synchronous call runs the loop on another thread
    assert len(ledger.charges) == 1 and len({text(r) for r in model.results().values()}) == 1
    assert [r.task_id for r in await guard.records()] == ["ticket-1"]


async def test_without_a_task_id_nothing_runs_and_the_model_is_told(guard: Guard) -> None:
    ledger = Ledger()
    results = await run(charge_tool(guard, ledger), Scripted([500]))
    assert ledger.charges == []
    assert results["call_0_0"]["status"] == "error"
    assert "no task id" in text(results["call_0_0"]) and text(results["call_0_0"]).endswith("Nothing was executed.")


async def test_an_explicit_task_id_callable_gets_the_tool_context(guard: Guard) -> None:
    ledger = Ledger()
    tool_ = charge_tool(guard, ledger, task_id=lambda ctx: f"explicit-{ctx.invocation_state['ticket']}")
    await run(tool_, Scripted([500]), ticket="9", task_id="ignored")
    assert [r.task_id for r in await guard.records()] == ["explicit-9"]


async def test_once_on_top_of_tool_says_which_way_round(guard: Guard) -> None:
    @tool
    def charge(order_id: str) -> str:
        """Charge an order.

        Args:
            order_id: the order
        """
        return order_id

    with pytest.raises(TypeError, match=r"strands\.once\(\.\.\.\) was placed on top of a DecoratedFunctionTool made "
                                        r"by the Strands Agents SDK's @tool; put it underneath"):
        once(guard, key="order_id")(charge)


@pytest.mark.storeless
async def test_a_misspelt_key_is_refused_at_decoration(guard: Guard) -> None:
    ledger = Ledger()
    with pytest.raises(TypeError) as info:

        @tool(context=True)
        @once(guard, key="orderid")
        async def charge(order_id: str, amount_cents: int, tool_context: ToolContext) -> Any:
            """Charge an order."""
            return ledger.charge(order_id, amount_cents, "")

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, order_id, tool_context")
    assert ledger.charges == []


NOTE = ("agentguard: REPLAY. charge[order_id=\"o-1\"] already happened in task {task!r}; this is its recorded "
        "result, returned again. Nothing was executed again.")


async def test_a_replayed_string_or_tool_result_is_told_to_the_model(guard: Guard) -> None:
    """The second call in the task is replayed: the tool result the model reads holds the note, then the first
    call's text (a string result) or the first call's blocks (a tool result the tool made); a dict result
    keeps its JSON (the first test); replay_note=False tells nothing."""
    ledger = Ledger()

    def text_tool(**options: Any) -> Any:
        @tool(context=True)
        @once(guard, key="order_id", **options)
        def charge(order_id: str, amount_cents: int, tool_context: ToolContext) -> str:
            """Charge an order.

            Args:
                order_id: the order to charge
                amount_cents: how much, in cents
            """
            return "charged " + ledger.charge(order_id, amount_cents, "")["charge_id"]

        return charge

    results = await run(text_tool(), Scripted([500], [500]), task_id="task-t")
    assert results["call_0_0"]["content"] == [{"text": "charged ch_1"}]
    assert results["call_1_0"]["content"] == [{"text": f"{NOTE.format(task='task-t')}\n\ncharged ch_1"}]

    @tool(context=True)
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int, tool_context: ToolContext) -> dict[str, Any]:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much, in cents
        """
        receipt = ledger.charge(order_id, amount_cents, "")
        return {"status": "success", "content": [{"text": "charged " + receipt["charge_id"]}]}

    results = await run(charge, Scripted([500], [500]), task_id="task-r")
    assert results["call_0_0"]["content"] == [{"text": "charged ch_2"}]
    assert results["call_1_0"]["content"] == [{"text": NOTE.format(task="task-r")}, {"text": "charged ch_2"}]
    assert results["call_1_0"]["status"] == "success"
    results = await run(text_tool(replay_note=False), Scripted([500], [500]), task_id="task-q")
    assert results["call_1_0"]["content"] == results["call_0_0"]["content"] == [{"text": "charged ch_3"}]
    assert len(ledger.charges) == 3  # three tasks, each charged once


async def test_each_guarded_calls_span_carries_the_tool_use_id(guard: Guard) -> None:
    """gen_ai.tool.call.id: the model's toolUseId of each call (the ToolContext's tool_use), the one that ran
    and each one replayed; the ledger keeps the same ids."""
    ledger = Ledger()
    with guard_spans() as spans:
        await run(charge_tool(guard, ledger), Scripted([500], [500, 500]), task_id="task-ids")
    assert len(ledger.charges) == 1
    calls = spans.calls("charge")
    assert sorted(i for _, i in calls) == ["call_0_0", "call_1_0", "call_1_1"]
    assert sorted(k for k, _ in calls) == ["ran", "replayed", "replayed"]
    await guard.flush_ledger()
    assert {e.call_id for e in await guard.timeline("task-ids")} == {"call_0_0", "call_1_0", "call_1_1"}
