"""LlamaIndex: MockFunctionCallingLLM with a scripted response generator drives the real FunctionAgent workflow
(its tool calls run as concurrent workflow steps); the task id comes from the workflow context's store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import TextBlock, ToolCallBlock
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool
from workflows import Context

from agentguard import Guard, GuardEvent, task
from agentguard.integrations.llamaindex import GuardToolError, once

from charges import Ledger

pytestmark = [
    pytest.mark.storeless,  # the adapter layer, not the store's SQL: runs once
    pytest.mark.anyio,
    # the workflow engine lists the agent's members with inspect.getmembers, touching pydantic's deprecated
    # attributes (LlamaIndex's warnings, not ours)
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning"),
]


class Script:
    """The LLM's turns: each lists the amounts of the charge calls for order o-1 in one message; then it
    answers "done". Keeps what it was sent, so a test reads what the model was told."""

    def __init__(self, *turns: Sequence[int]) -> None:
        self.turns = list(turns)
        self.seen: list[list[ChatMessage]] = []

    def __call__(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        self.seen.append(list(messages))
        n = sum(1 for m in messages if m.role == MessageRole.ASSISTANT) % (len(self.turns) + 1)
        if n < len(self.turns):
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=[
                ToolCallBlock(tool_call_id=f"call_{n}_{i}", tool_name="charge",
                              tool_kwargs={"order_id": "o-1", "amount_cents": a})
                for i, a in enumerate(self.turns[n])
            ])
        return ChatMessage(role=MessageRole.ASSISTANT, content="done")

    def tool_messages(self) -> list[str]:
        return [str(m.content) for m in self.seen[-1] if m.role == MessageRole.TOOL]


def charge_tool(guard: Guard, ledger: Ledger, **options: Any) -> FunctionTool:
    @once(guard, key="order_id", **options)
    async def charge(ctx: Context, order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        """Charge an order."""
        await asyncio.sleep(0)  # a provider call: the other concurrent calls get their turn
        return ledger.charge(order_id, amount_cents, idempotency_key)

    return FunctionTool.from_defaults(charge)


async def run(agent: FunctionAgent, ctx: Context | None = None) -> tuple[str, dict[str, Any]]:
    handler = agent.run("charge o-1", ctx=ctx)
    results: dict[str, Any] = {}
    async for ev in handler.stream_events():
        if isinstance(ev, ToolCallResult):
            results[ev.tool_id] = ev.tool_output
    return str(await handler), results


@pytest.fixture
def events() -> list[GuardEvent]:
    return []


@pytest.fixture
def guard(make_guard: Callable[..., Guard], events: list[GuardEvent]) -> Guard:
    return make_guard(on_event=events.append)


def agent_for(tool: FunctionTool, script: Script, **state: Any) -> FunctionAgent:
    return FunctionAgent(tools=[tool], llm=MockFunctionCallingLLM(response_generator=script), initial_state=state)


async def test_repeat_after_a_timeout_and_parallel_calls_charge_once_and_a_change_is_refused(
    guard: Guard, events: list[GuardEvent]
) -> None:
    ledger = Ledger()
    # a charge; the same call again (the model's retry after a timeout); two at once; one with another amount
    script = Script([500], [500], [500, 500], [700])
    answer, results = await run(agent_for(charge_tool(guard, ledger), script, task_id="task-42"))
    assert answer.strip() == "done"
    assert len(ledger.charges) == 1
    (record,) = await guard.records()
    assert record.task_id == "task-42" and ledger.charges[0][2] == record.key
    first = {"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500}
    for cid in ("call_0_0", "call_1_0", "call_2_0", "call_2_1"):
        assert results[cid].raw_output == first and not results[cid].is_error
    assert [e.kind for e in events].count("replayed") == 3
    refused = results["call_3_0"]
    assert refused.is_error and isinstance(refused.exception, GuardToolError)
    text = str(refused.content)
    assert "already called in task 'task-42' with different arguments" in text and "amount_cents" in text
    assert text.endswith("Nothing was executed.")
    assert script.tool_messages()[-1] == text  # what the model read


# a context given to a run is saved without its chat memory: "expected", LlamaIndex's warning says
@pytest.mark.filterwarnings("ignore::workflows.context.state_store.UnserializableKeyWarning")
async def test_the_store_task_id_holds_across_runs_and_a_restored_context(guard: Guard) -> None:
    ledger = Ledger()
    tool = charge_tool(guard, ledger)
    agent = agent_for(tool, Script([500]))
    ctx = Context(agent)
    await ctx.store.set("task_id", "order-77")  # the workflow's own store, not the agent's state
    await run(agent, ctx)
    await run(agent, ctx)  # a second run on the same context: a new run id, the same task
    restored = Context.from_dict(agent, ctx.to_dict())  # as after a restart
    await run(agent, restored)
    assert len(ledger.charges) == 1
    assert [r.task_id for r in await guard.records()] == ["order-77"]


async def test_identical_calls_in_one_message_run_concurrently_and_charge_once(guard: Guard) -> None:
    ledger = Ledger()
    arrived: list[str] = []
    all_in = asyncio.Event()

    @once(guard, key="order_id")
    async def guarded(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        await asyncio.sleep(0)
        return ledger.charge(order_id, amount_cents, idempotency_key)

    async def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order."""
        arrived.append(order_id)
        if len(arrived) == 3:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 60)  # all three calls are in flight at once before any goes on
        return await guarded(order_id=order_id, amount_cents=amount_cents)

    with task("task-7"):
        _, results = await run(agent_for(FunctionTool.from_defaults(charge), Script([500, 500, 500])))
    assert len(ledger.charges) == 1
    assert len({str(r.raw_output) for r in results.values()}) == 1 and len(results) == 3


async def test_a_sync_tool_without_context_takes_the_task_from_the_caller(guard: Guard) -> None:
    ledger = Ledger()

    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        """Charge an order."""
        return ledger.charge(order_id, amount_cents, idempotency_key)

    tool = FunctionTool.from_defaults(charge)
    assert set(tool.metadata.get_parameters_dict()["properties"]) == {"order_id", "amount_cents"}
    with task("ticket-1"):
        _, results = await run(agent_for(tool, Script([500, 500], [500])))
    assert len(ledger.charges) == 1
    assert len({str(r.raw_output) for r in results.values()}) == 1
    assert [r.task_id for r in await guard.records()] == ["ticket-1"]


async def test_without_a_task_id_nothing_runs_and_the_model_is_told(guard: Guard) -> None:
    ledger = Ledger()
    script = Script([500])
    _, results = await run(agent_for(charge_tool(guard, ledger), script))
    assert ledger.charges == []
    assert results["call_0_0"].is_error
    assert "no task id" in script.tool_messages()[-1] and "Nothing was executed." in script.tool_messages()[-1]


async def test_an_explicit_task_id_callable_gets_the_context(guard: Guard) -> None:
    ledger = Ledger()
    got: list[Any] = []

    def from_ctx(ctx: Context | None) -> str:
        got.append(ctx)
        return "explicit-1"

    await run(agent_for(charge_tool(guard, ledger, task_id=from_ctx), Script([500]), task_id="ignored"))
    assert isinstance(got[0], Context)
    assert [r.task_id for r in await guard.records()] == ["explicit-1"]


async def test_a_workflow_step_retried_after_a_timeout_replays_the_charge(guard: Guard) -> None:
    from workflows import Workflow, step
    from workflows.events import StartEvent, StopEvent
    from workflows.retry_policy import retry_policy, stop_after_attempt, wait_none

    ledger = Ledger()
    receipts: list[Any] = []

    @once(guard, key="order_id")
    async def charge(ctx: Context, order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        return ledger.charge(order_id, amount_cents, idempotency_key)

    class Checkout(Workflow):
        @step(retry_policy=retry_policy(wait=wait_none(), stop=stop_after_attempt(3)))
        async def pay(self, ctx: Context, ev: StartEvent) -> StopEvent:
            receipts.append(await charge(ctx, order_id="o-1", amount_cents=500))
            if len(receipts) == 1:
                raise TimeoutError("the receipt step timed out after the charge")  # the engine retries the step
            return StopEvent(result=receipts[-1])

    workflow = Checkout()
    ctx = Context(workflow)
    await ctx.store.set("task_id", "order-5")
    result = await workflow.run(ctx=ctx)
    assert len(receipts) == 2 and receipts[0] == receipts[1] == result
    assert len(ledger.charges) == 1
    assert [r.task_id for r in await guard.records()] == ["order-5"]


@pytest.mark.storeless
async def test_a_misspelt_key_is_refused_at_decoration(guard: Guard) -> None:
    ledger = Ledger()
    with pytest.raises(TypeError) as info:

        @once(guard, key="orderid")
        async def charge(ctx: Context, order_id: str, amount_cents: int) -> dict[str, Any]:
            return ledger.charge(order_id, amount_cents, "")

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, ctx, order_id")
    assert ledger.charges == []


NOTE = ("agentguard: REPLAY. charge[order_id=\"o-1\"] already happened in task {task!r}; this is its recorded "
        "result, returned again. Nothing was executed again.")


async def test_a_replayed_string_or_list_of_blocks_is_told_to_the_model(guard: Guard) -> None:
    """The second call in the task is replayed: the tool message the model reads is the note, then the first
    call's text (a string result), or a first text block before the first call's blocks (a list of blocks);
    a dict result keeps its raw_output (the first test); replay_note=False tells nothing."""
    ledger = Ledger()

    def text_tool(**options: Any) -> FunctionTool:
        @once(guard, key="order_id", **options)
        async def charge(ctx: Context, order_id: str, amount_cents: int) -> str:
            """Charge an order."""
            return "charged " + ledger.charge(order_id, amount_cents, "")["charge_id"]

        return FunctionTool.from_defaults(charge)

    script = Script([500], [500])
    _, results = await run(agent_for(text_tool(), script, task_id="task-t"))
    told = f"{NOTE.format(task='task-t')}\n\ncharged ch_1"
    assert script.tool_messages() == ["charged ch_1", told]
    assert results["call_1_0"].raw_output == told and results["call_0_0"].raw_output == "charged ch_1"

    @once(guard, key="order_id", operation="charge")
    async def blocks(ctx: Context, order_id: str, amount_cents: int) -> list[TextBlock]:
        """Charge an order."""
        return [TextBlock(text="charged " + ledger.charge(order_id, amount_cents, "")["charge_id"])]

    script = Script([500], [500])
    _, results = await run(agent_for(FunctionTool.from_defaults(blocks, name="charge"), script, task_id="task-b"))
    assert [b.text for b in results["call_1_0"].blocks] == [NOTE.format(task="task-b"), "charged ch_2"]
    assert script.tool_messages()[1] == f"{NOTE.format(task='task-b')}\ncharged ch_2"  # (its blocks, joined)
    script = Script([500], [500])
    await run(agent_for(text_tool(replay_note=False), script, task_id="task-q"))
    assert script.tool_messages() == ["charged ch_3", "charged ch_3"]
    assert len(ledger.charges) == 3  # three tasks, each charged once
