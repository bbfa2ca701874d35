"""smolagents: a scripted ``Model`` subclass drives the real ToolCallingAgent loop (parallel calls on its
worker threads); the tool is guarded with guard_tool or with once under tool(...)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from smolagents import Model, Tool, ToolCallingAgent, tool
from smolagents.models import ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole

from agentguard import Guard, GuardError, GuardEvent, current_key, task
from agentguard.integrations.smolagents import guard_tool, once

from charges import Ledger

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
class Scripted(Model):
    """Each turn lists the amounts of the charge calls the model makes for order o-1 in one message; then
    it answers. Keeps the messages it was given, so a test reads what the model was told."""

    def __init__(self, *turns: Sequence[int]) -> None:
        super().__init__(model_id="scripted")
        self.turns = list(turns)
        self.seen: list[list[Any]] = []

    def generate(self, messages: list[Any], stop_sequences: Any = None, response_format: Any = None,
                 tools_to_call_from: Any = None, **kwargs: Any) -> ChatMessage:
        n = len(self.seen)
        self.seen.append(list(messages))
        if n < len(self.turns):
            calls = [("charge", f"call_{n}_{i}", {"order_id": "o-1", "amount_cents": a})
                     for i, a in enumerate(self.turns[n])]
        else:
            calls = [("final_answer", "final", {"answer": "done"})]
        return ChatMessage(role=MessageRole.ASSISTANT, content="", tool_calls=[
            ChatMessageToolCall(id=cid, type="function", function=ChatMessageToolCallFunction(name=name, arguments=a))
            for name, cid, a in calls
        ])

    def told(self, turn: int = -1) -> str:
        """What the model read before ``turn`` (by default its last): the observations of the step before."""
        content = self.seen[turn][-1].content
        return "".join(part["text"] for part in content) if isinstance(content, list) else str(content)


def charge_tool(ledger: Ledger) -> Tool:
    @tool
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much, in cents
        """
        return ledger.charge(order_id, amount_cents, current_key())

    return charge


def observations(agent: ToolCallingAgent) -> list[Any]:
    return [s.observations for s in agent.memory.steps if getattr(s, "tool_calls", None)]


@pytest.fixture
def events() -> list[GuardEvent]:
    return []


@pytest.fixture
def guard(make_guard: Callable[..., Guard], events: list[GuardEvent]) -> Guard:
    return make_guard(on_event=events.append)


def run(agent: ToolCallingAgent, task_id: str | None) -> Any:
    if task_id is None:
        return agent.run("charge o-1")
    with task(task_id):
        return agent.run("charge o-1")


async def test_repeat_after_a_timeout_and_parallel_calls_charge_once_and_a_change_is_refused(
    guard: Guard, events: list[GuardEvent]
) -> None:
    ledger = Ledger()
    # a charge; the same call again (the model's retry after a timeout); two at once; one with another amount
    model = Scripted([500], [500], [500, 500], [700])
    agent = ToolCallingAgent(tools=[guard_tool(charge_tool(ledger), guard, key="order_id")], model=model,
                             verbosity_level=0)
    assert run(agent, "task-42") == "done"
    assert len(ledger.charges) == 1
    (record,) = await guard.records()
    assert ledger.charges[0][2] == record.key and record.task_id == "task-42"
    first = {"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500}
    obs = observations(agent)
    assert obs[0] == obs[1] == str(first)
    assert obs[2] == f"{first}\n{first}"  # both parallel calls: the recorded outcome
    assert [e.kind for e in events].count("replayed") == 3
    text = model.told(4)  # what the model read after the call with another amount
    assert "already called in task 'task-42' with different arguments" in text and "amount_cents" in text
    assert text.rstrip().endswith("Nothing was executed.")
    assert "Please try again" not in text and "Error" not in text


async def test_two_identical_calls_in_one_message_run_on_two_threads_and_charge_once(guard: Guard) -> None:
    ledger = Ledger()
    threads: set[int] = set()

    @tool
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much, in cents
        """
        threads.add(threading.get_ident())
        return ledger.charge(order_id, amount_cents, current_key())

    model = Scripted([500, 500, 500, 500])
    agent = ToolCallingAgent(tools=[guard_tool(charge, guard, key="order_id")], model=model, verbosity_level=0,
                             max_tool_threads=4)
    run(agent, "task-7")
    assert len(ledger.charges) == 1
    assert len(set(observations(agent)[0].splitlines())) == 1


async def test_once_under_tool_hides_the_key_parameter_and_guards(guard: Guard) -> None:
    ledger = Ledger()

    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much, in cents
        """
        return ledger.charge(order_id, amount_cents, idempotency_key)

    charge_t = tool(once(guard, key="order_id")(charge))
    assert set(charge_t.inputs) == {"order_id", "amount_cents"}
    model = Scripted([500], [500, 500], [900])
    agent = ToolCallingAgent(tools=[charge_t], model=model, verbosity_level=0)
    run(agent, "task-9")
    assert len(ledger.charges) == 1
    (record,) = await guard.records()
    assert ledger.charges[0][2] == record.key
    assert "different arguments" in model.told() and "Nothing was executed." in model.told()


async def test_without_a_task_nothing_runs_and_the_model_is_told_why(guard: Guard) -> None:
    ledger = Ledger()
    model = Scripted([500])
    agent = ToolCallingAgent(tools=[guard_tool(charge_tool(ledger), guard)], model=model, verbosity_level=0)
    run(agent, None)
    assert ledger.charges == []
    assert "no task id" in model.told() and "Nothing was executed." in model.told()


async def test_guard_tool_leaves_the_original_and_refuses_twice_and_non_tools(guard: Guard) -> None:
    ledger = Ledger()
    original = charge_tool(ledger)
    guarded = guard_tool(original, guard, key="order_id")
    assert guarded is not original and guarded.inputs == original.inputs
    with task("t"):
        guarded(order_id="o-2", amount_cents=1)
        with pytest.raises(GuardError, match="outside a guarded call"):  # the original stays unguarded
            original(order_id="o-2", amount_cents=1)
    assert len(ledger.charges) == 1
    with pytest.raises(TypeError, match="already guarded"):
        guard_tool(guarded, guard)
    with pytest.raises(TypeError, match=r"smolagents\.Tool"):
        guard_tool(lambda: None, guard)  # type: ignore[arg-type]


async def test_a_tool_error_releases_and_the_retry_charges(guard: Guard) -> None:
    ledger = Ledger()
    failures = [RuntimeError("card network down")]

    @tool
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much, in cents
        """
        if failures:
            raise failures.pop()
        return ledger.charge(order_id, amount_cents, current_key())

    model = Scripted([500], [500])
    agent = ToolCallingAgent(tools=[guard_tool(charge, guard, key="order_id")], model=model, verbosity_level=0)
    run(agent, "task-3")
    assert len(ledger.charges) == 1
    assert "card network down" in str(agent.memory.steps[1].error)  # smolagents' own report of the error


@pytest.mark.storeless
async def test_a_misspelt_key_is_refused_by_guard_tool_and_at_decoration(guard: Guard) -> None:
    ledger = Ledger()
    refusal = ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments are: "
               "amount_cents, order_id")
    with pytest.raises(TypeError) as info:
        guard_tool(charge_tool(ledger), guard, key="orderid")
    assert str(info.value) == refusal

    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much, in cents
        """
        return ledger.charge(order_id, amount_cents, current_key())

    with pytest.raises(TypeError) as info:
        tool(once(guard, key="orderid")(charge))
    assert str(info.value) == refusal
    assert ledger.charges == []


NOTE = ("agentguard: REPLAY. charge[order_id=\"o-1\"] already happened in task {task!r}; this is its recorded "
        "result, returned again. Nothing was executed again.")


def text_charge(ledger: Ledger) -> Callable[[str, int], str]:
    def charge(order_id: str, amount_cents: int) -> str:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much, in cents
        """
        return "charged " + ledger.charge(order_id, amount_cents, current_key())["charge_id"]

    return charge


@pytest.mark.parametrize("how", ["guard_tool", "once"])
async def test_a_replayed_string_observation_is_told_to_the_model(guard: Guard, how: str) -> None:
    """The second call in the task is replayed: the observation the model reads is the note, then the first
    call's text; replay_note=False tells nothing."""
    ledger = Ledger()

    def made(quiet: bool) -> Tool:
        if how == "guard_tool":
            return guard_tool(tool(text_charge(ledger)), guard, key="order_id", replay_note=not quiet)
        return tool(once(guard, key="order_id", replay_note=not quiet)(text_charge(ledger)))

    model = Scripted([500], [500])
    agent = ToolCallingAgent(tools=[made(False)], model=model, verbosity_level=0)
    assert run(agent, f"task-{how}") == "done"
    assert observations(agent)[:2] == ["charged ch_1", f"{NOTE.format(task=f'task-{how}')}\n\ncharged ch_1"]
    assert f"{NOTE.format(task=f'task-{how}')}\n\ncharged ch_1" in model.told(2)
    quiet = ToolCallingAgent(tools=[made(True)], model=Scripted([500], [500]), verbosity_level=0)
    run(quiet, f"quiet-{how}")
    assert observations(quiet)[:2] == ["charged ch_2"] * 2
    assert len(ledger.charges) == 2  # two tasks, each charged once
