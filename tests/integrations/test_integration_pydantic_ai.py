"""pydantic-ai: a FunctionModel drives the real agent loop; the guard sits under @agent.tool or in a capability."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext, ToolReturn
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentguard import Guard, current_key, task
from agentguard.integrations.pydantic_ai import GuardTools, ToolSpec, once

from charges import Ledger
from guard_spans import guard_spans

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
class Receipt(BaseModel):
    charge_id: str
    amount_cents: int


@dataclass
class Deps:
    task_id: str | None


class Script:
    """A FunctionModel script: each turn is a list of tool calls, then a final text answer.

    Records the tool definitions the framework sent to the model and every tool result it got back.
    """

    def __init__(self, turns: Sequence[Sequence[tuple[str, dict[str, Any]]]]) -> None:
        self.turns = list(turns)
        self.tools: list[Any] = []
        self.results: dict[str, Any] = {}
        self.messages: list[ModelMessage] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.tools = list(info.function_tools)
        self.messages = list(messages)
        for m in messages:
            if isinstance(m, ModelRequest):
                for p in m.parts:
                    if isinstance(p, ToolReturnPart):
                        self.results[p.tool_call_id] = p
        n = sum(isinstance(m, ModelResponse) for m in messages)
        if n < len(self.turns):
            return ModelResponse(parts=[
                ToolCallPart(name, args, tool_call_id=f"call_{n}_{i}") for i, (name, args) in enumerate(self.turns[n])
            ])
        return ModelResponse(parts=[TextPart("done")])

    def content(self, call_id: str) -> Any:
        return self.results[call_id].content

    def told(self, call_id: str) -> list[str]:
        """The user content the model read in the request that carried the result of ``call_id``."""
        for m in self.messages:
            if isinstance(m, ModelRequest) and any(
                isinstance(p, ToolReturnPart) and p.tool_call_id == call_id for p in m.parts
            ):
                told = [p.content for p in m.parts if isinstance(p, UserPromptPart)]
                return [str(c) for content in told for c in ([content] if isinstance(content, str) else content)]
        raise AssertionError(f"no request carried {call_id}")


def charge_args(amount: int = 500, order: str = "o-1") -> tuple[str, dict[str, Any]]:
    return ("charge", {"order_id": order, "amount_cents": amount})


def decorated_agent(guard: Guard, ledger: Ledger, script: Script) -> Agent[Deps, str]:
    agent = Agent(FunctionModel(script), deps_type=Deps)

    @agent.tool
    @once(guard, key="order_id")
    async def charge(
        ctx: RunContext[Deps], order_id: str, amount_cents: int, idempotency_key: str = ""
    ) -> dict[str, Any]:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much
        """
        return ledger.charge(order_id, amount_cents, idempotency_key)

    return agent


@pytest.fixture
def guard(make_guard: Callable[..., Guard]) -> Guard:
    return make_guard()


async def test_two_calls_in_one_task_charge_once_and_replay(guard: Guard) -> None:
    ledger, script = Ledger(), Script([[charge_args()], [charge_args()]])
    result = await decorated_agent(guard, ledger, script).run("charge o-1", deps=Deps("task-42"))
    assert result.output == "done"
    assert len(ledger.charges) == 1
    assert script.content("call_1_0") == script.content("call_0_0") == {
        "charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500,
    }


async def test_identical_calls_in_one_turn_run_concurrently_and_charge_once(guard: Guard) -> None:
    ledger, script = Ledger(), Script([[charge_args(), charge_args()]])
    await decorated_agent(guard, ledger, script).run("charge o-1", deps=Deps("task-42"))
    assert len(ledger.charges) == 1
    assert script.content("call_0_0") == script.content("call_0_1")


async def test_different_amount_reaches_the_model_as_a_refusal(guard: Guard) -> None:
    ledger, script = Ledger(), Script([[charge_args(500)], [charge_args(700)]])
    result = await decorated_agent(guard, ledger, script).run("charge o-1", deps=Deps("task-42"))
    assert result.output == "done"  # the run goes on: the refusal is a tool result, not a crash
    assert len(ledger.charges) == 1
    refused = script.results["call_1_0"]
    assert refused.outcome == "failed"
    assert "already called in task 'task-42' with different arguments" in str(refused.content)
    assert "amount_cents" in str(refused.content) and str(refused.content).endswith("Nothing was executed.")


async def test_missing_task_id_is_refused_without_running(guard: Guard) -> None:
    ledger, script = Ledger(), Script([[charge_args()]])
    await decorated_agent(guard, ledger, script).run("charge o-1", deps=Deps(None))
    assert ledger.charges == []
    assert "no task id" in str(script.content("call_0_0"))


async def test_task_context_wins_over_deps(guard: Guard) -> None:
    ledger, script = Ledger(), Script([[charge_args()]])
    agent = decorated_agent(guard, ledger, script)
    with task("outer"):
        await agent.run("go", deps=Deps("inner"))
    records = await guard.records()
    assert [r.task_id for r in records] == ["outer"]


async def test_injected_key_and_context_are_not_in_the_model_schema(guard: Guard) -> None:
    ledger, script = Ledger(), Script([[charge_args()]])
    await decorated_agent(guard, ledger, script).run("go", deps=Deps("task-42"))
    (tool,) = script.tools
    schema = tool.parameters_json_schema
    assert set(schema["properties"]) == {"order_id", "amount_cents"}
    assert "idempotency_key" not in str(schema) and "ctx" not in schema["properties"]
    assert schema["properties"]["order_id"].get("description") == "the order to charge"
    # the downstream key reached the tool, and is the one the guard derived
    (record,) = await guard.records()
    assert ledger.charges[0][2] == record.key


async def test_sync_tool_plain_under_the_decorator_uses_the_run_deps(guard: Guard) -> None:
    ledger, script = Ledger(), Script([[charge_args(), charge_args()], [charge_args()]])
    agent = Agent(FunctionModel(script), deps_type=Deps)
    threads: set[str] = set()

    @agent.tool_plain
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        threads.add(threading.current_thread().name)
        return ledger.charge(order_id, amount_cents, current_key())

    await agent.run("go", deps=Deps("task-7"))
    assert len(ledger.charges) == 1
    assert script.content("call_0_0") == script.content("call_0_1") == script.content("call_1_0")
    assert [r.task_id for r in await guard.records()] == ["task-7"]


async def test_capability_guards_named_tools_only(guard: Guard) -> None:
    ledger, script = Ledger(), Script([
        [charge_args(), ("lookup", {"order_id": "o-1"})],
        [charge_args(), ("lookup", {"order_id": "o-1"})],
        [charge_args(900)],
    ])
    lookups: list[str] = []
    agent = Agent(FunctionModel(script), deps_type=Deps, capabilities=[GuardTools(guard, {"charge": "order_id"})])

    @agent.tool_plain
    async def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        return ledger.charge(order_id, amount_cents, current_key())

    @agent.tool_plain
    def lookup(order_id: str) -> str:
        lookups.append(order_id)
        return "open"

    await agent.run("go", deps=Deps("task-9"))
    assert len(ledger.charges) == 1 and len(lookups) == 2
    assert script.content("call_0_0") == script.content("call_1_0")
    assert "different arguments" in str(script.content("call_2_0"))
    assert {t.name for t in script.tools} == {"charge", "lookup"}
    (record,) = await guard.records()
    assert record.task_id == "task-9" and ledger.charges[0][2] == record.key
    await guard.flush_ledger()  # the attempt ledger keeps each tool call's id
    assert [(e.kind, e.call_id) for e in await guard.timeline("task-9")] == [
        ("ran", "call_0_0"), ("replayed", "call_1_0"), ("refused", "call_2_0")]


async def test_capability_replays_a_typed_result_as_its_type(guard: Guard) -> None:
    ledger, script = Ledger(), Script([[charge_args()], [charge_args()]])
    spec = ToolSpec(key="order_id", returns=Receipt)
    agent = Agent(FunctionModel(script), capabilities=[GuardTools(guard, {"charge": spec}, task_id=lambda ctx: "t-r")])

    @agent.tool_plain
    def charge(order_id: str, amount_cents: int) -> Receipt:
        ledger.charge(order_id, amount_cents, current_key())
        return Receipt(charge_id="ch_1", amount_cents=amount_cents)

    await agent.run("go")
    assert len(ledger.charges) == 1
    assert script.content("call_1_0") == script.content("call_0_0") == Receipt(charge_id="ch_1", amount_cents=500)


@pytest.mark.storeless
@pytest.mark.parametrize(("tools", "refusal"), [
    pytest.param({"chargee": "order_id"}, "GuardTools: the agent offers no tool named 'chargee' (did you mean "
                 "'charge'?); it offers: charge, lookup", id="tool"),
    pytest.param({"charge": ToolSpec(key="orderid")}, "GuardTools: key='orderid' is not an argument of charge "
                 "(did you mean 'order_id'?); its arguments are: amount_cents, order_id", id="key"),
])
async def test_capability_refuses_a_name_the_agent_lacks_before_any_tool_runs(
    guard: Guard, tools: dict[str, Any], refusal: str
) -> None:
    """A misspelt tool would leave the real one unguarded (it ran twice for one operation); a misspelt key
    field would key every call on null. The run fails when its tools are prepared, before the model is asked."""
    ledger, script = Ledger(), Script([[charge_args()], [charge_args()]])
    agent = Agent(FunctionModel(script), deps_type=Deps, capabilities=[GuardTools(guard, tools)])

    @agent.tool_plain
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        return ledger.charge(order_id, amount_cents, "")

    @agent.tool_plain
    def lookup(order_id: str) -> str:
        return "open"

    with pytest.raises(ValueError) as info:
        await agent.run("go", deps=Deps("task-typo"))
    assert str(info.value) == refusal
    assert ledger.charges == [] and script.results == {} and script.tools == []  # the model was never asked


@pytest.mark.storeless
async def test_decorator_refuses_a_misspelt_key_at_decoration(guard: Guard) -> None:
    agent = Agent(FunctionModel(Script([])), deps_type=Deps)
    with pytest.raises(TypeError) as info:

        @agent.tool
        @once(guard, key="orderid")
        async def charge(ctx: RunContext[Deps], order_id: str, amount_cents: int) -> None: ...

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, ctx, order_id")


class ChargeRequest(BaseModel):
    order_id: str
    amount_cents: int


@pytest.mark.storeless
async def test_capability_refuses_a_key_the_tool_is_not_handed_before_it_runs(guard: Guard) -> None:
    """A tool taking one pydantic model shows the model's fields in its schema but is handed the model itself:
    a key on one of the fields would read null. Refused on the call, before the tool runs."""
    ledger, script = Ledger(), Script([[charge_args()]])
    capability = GuardTools(guard, {"charge": "order_id"}, task_id=lambda _: "t")
    agent = Agent(FunctionModel(script), capabilities=[capability])

    @agent.tool_plain
    def charge(req: ChargeRequest) -> dict[str, Any]:
        return ledger.charge(req.order_id, req.amount_cents, current_key())

    with pytest.raises(ValueError) as info:
        await agent.run("go")
    assert str(info.value) == "GuardTools: key='order_id' is not an argument of charge; its arguments are: req"
    assert ledger.charges == [] and {t.name for t in script.tools} == {"charge"}


NOTE = "agentguard: REPLAY. charge[order_id=\"o-1\"] already happened in task {task!r}; this is its recorded " \
       "result, returned again. Nothing was executed again."
RECEIPT = {"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500}


async def test_a_replay_is_told_to_the_model_beside_the_unchanged_value(guard: Guard) -> None:
    """The second call of the tool in the task is replayed: the model reads the note in the same request as the
    tool's return, whose content is the first call's value unchanged; the metadata marks the replay for the
    program; the guarded function called by the program itself returns the bare value."""
    ledger, script = Ledger(), Script([[charge_args()], [charge_args()]])
    agent = Agent(FunctionModel(script), deps_type=Deps)

    @once(guard, key="order_id")
    async def charge(ctx: RunContext[Deps], order_id: str, amount_cents: int) -> dict[str, Any]:
        return ledger.charge(order_id, amount_cents, current_key())

    agent.tool(charge)
    result = await agent.run("charge o-1", deps=Deps("task-42"))
    assert len(ledger.charges) == 1
    first, again = script.results["call_0_0"], script.results["call_1_0"]
    assert first.content == again.content == RECEIPT
    assert script.told("call_0_0") == [] and first.metadata is None
    assert script.told("call_1_0") == [NOTE.format(task="task-42")]
    assert again.metadata == {"dev.agentguard/replayed": True}
    returns = [p for m in result.all_messages() if isinstance(m, ModelRequest) for p in m.parts
               if isinstance(p, ToolReturnPart)]  # what the program reads of the run: the same
    assert [(p.content, p.metadata) for p in returns] == [(RECEIPT, None), (RECEIPT, {"dev.agentguard/replayed": True})]
    with task("task-42"):  # the program's own call: replayed, and the value as it is
        assert await charge(None, "o-1", 500) == RECEIPT
    assert len(ledger.charges) == 1


async def test_the_capability_tells_a_replay_and_keeps_the_typed_value(guard: Guard) -> None:
    ledger, script = Ledger(), Script([[charge_args()], [charge_args()]])
    spec = ToolSpec(key="order_id", returns=Receipt)
    agent = Agent(FunctionModel(script), capabilities=[GuardTools(guard, {"charge": spec}, task_id=lambda ctx: "t-c")])

    @agent.tool_plain
    def charge(order_id: str, amount_cents: int) -> Receipt:
        ledger.charge(order_id, amount_cents, current_key())
        return Receipt(charge_id="ch_1", amount_cents=amount_cents)

    await agent.run("go")
    assert len(ledger.charges) == 1
    assert script.content("call_1_0") == script.content("call_0_0") == Receipt(charge_id="ch_1", amount_cents=500)
    assert script.told("call_0_0") == [] and script.told("call_1_0") == [NOTE.format(task="t-c")]
    assert script.results["call_1_0"].metadata == {"dev.agentguard/replayed": True}


@pytest.mark.parametrize("where", ["decorator", "capability"])
async def test_replay_note_false_replays_the_bare_value(guard: Guard, where: str) -> None:
    ledger, script = Ledger(), Script([[charge_args()], [charge_args()]])
    capabilities = [GuardTools(guard, {"charge": "order_id"}, replay_note=False)] if where == "capability" else []
    agent = Agent(FunctionModel(script), deps_type=Deps, capabilities=capabilities)

    async def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        return ledger.charge(order_id, amount_cents, current_key())

    agent.tool_plain(once(guard, key="order_id", replay_note=False)(charge) if where == "decorator" else charge)
    await agent.run("go", deps=Deps("task-quiet"))
    assert len(ledger.charges) == 1 and script.content("call_1_0") == RECEIPT
    assert script.told("call_1_0") == [] and script.results["call_1_0"].metadata is None


async def test_a_tool_that_returns_a_tool_return_keeps_its_parts_after_the_note(guard: Guard) -> None:
    ledger, script = Ledger(), Script([[charge_args()], [charge_args()]])
    agent = Agent(FunctionModel(script), deps_type=Deps)

    @agent.tool_plain
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int) -> ToolReturn:
        receipt = ledger.charge(order_id, amount_cents, current_key())
        return ToolReturn(return_value=receipt, content="check the receipt", metadata={"psp": "test"})

    await agent.run("go", deps=Deps("task-tr"))
    assert len(ledger.charges) == 1 and script.content("call_1_0") == script.content("call_0_0") == RECEIPT
    assert script.told("call_0_0") == ["check the receipt"]
    assert script.told("call_1_0") == [NOTE.format(task="task-tr"), "check the receipt"]
    assert script.results["call_1_0"].metadata == {"psp": "test", "dev.agentguard/replayed": True}


@pytest.mark.parametrize("where", ["tool", "tool_plain", "capability"])
async def test_each_guarded_calls_span_carries_the_models_tool_call_id(guard: Guard, where: str) -> None:
    """gen_ai.tool.call.id: the id of the model's call, the one that ran and each one replayed, under
    ``@agent.tool`` (its RunContext names the call) and the capability; a ``tool_plain`` is handed no context of
    its call, so it has none. A guarded function the body of another tool calls is not that tool's call."""
    ledger, script = Ledger(), Script([[charge_args(), ("settle", {"order_id": "o-1"})], [charge_args()]])
    capabilities = [GuardTools(guard, {"charge": "order_id"})] if where == "capability" else []
    agent = Agent(FunctionModel(script), deps_type=Deps, capabilities=capabilities)

    @once(guard, key="order_id", operation="refund_check")
    async def check(ctx: RunContext[Deps], order_id: str) -> str:
        return "ok"

    @agent.tool
    async def settle(ctx: RunContext[Deps], order_id: str) -> str:
        return await check(ctx, order_id)  # the program's own call of a guarded function, inside another tool

    if where == "tool":

        @agent.tool(name="charge")
        @once(guard, key="order_id", operation="charge")
        async def charge_ctx(ctx: RunContext[Deps], order_id: str, amount_cents: int) -> dict[str, Any]:
            return ledger.charge(order_id, amount_cents, current_key())
    elif where == "tool_plain":

        @agent.tool_plain(name="charge")
        @once(guard, key="order_id", operation="charge")
        def charge_guarded(order_id: str, amount_cents: int) -> dict[str, Any]:
            return ledger.charge(order_id, amount_cents, current_key())
    else:

        @agent.tool_plain
        def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
            return ledger.charge(order_id, amount_cents, current_key())
    with guard_spans() as spans:
        await agent.run("go", deps=Deps("task-ids"))
    assert len(ledger.charges) == 1
    ids = ("call_0_0", "call_1_0") if where != "tool_plain" else (None, None)
    assert sorted(spans.calls("charge")) == [("ran", ids[0]), ("replayed", ids[1])]
    assert spans.calls("refund_check") == [("ran", None)]
    await guard.flush_ledger()
    kept = {e.call_id for e in await guard.timeline("task-ids") if e.operation.startswith("charge")}
    assert kept == set(ids)  # the ledger keeps the same ids


@pytest.mark.parametrize("where", ["decorator", "capability"])
async def test_a_call_refused_for_want_of_a_task_id_has_its_span(guard: Guard, where: str) -> None:
    """Refused before any key exists (no task id): still a span, refused, error.type MissingTaskError, with the
    model's call id, as the decorator's own refusal has."""
    ledger, script = Ledger(), Script([[charge_args()]])
    if where == "decorator":
        agent = decorated_agent(guard, ledger, script)
    else:
        agent = Agent(FunctionModel(script), deps_type=Deps, capabilities=[GuardTools(guard, {"charge": "order_id"})])

        @agent.tool_plain
        def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
            return ledger.charge(order_id, amount_cents, current_key())
    with guard_spans() as spans:
        await agent.run("charge o-1", deps=Deps(None))
    assert ledger.charges == [] and "no task id" in str(script.content("call_0_0"))
    (span,) = spans.guarded("charge")
    assert span.attributes is not None and span.attributes["agentguard.outcome"] == "refused"
    assert span.attributes["error.type"] == "MissingTaskError" and span.attributes["gen_ai.tool.call.id"] == "call_0_0"
