"""CrewAI: a scripted subclass of CrewAI's own ``BaseLLM`` (answering in the ReAct text CrewAI parses, or with
native tool calls) drives the real Crew → Agent → executor loop; one step's native calls, and crews kicked off at
once, run their tools at once. A sync ``kickoff`` runs on a worker thread, as from a plain sync caller (CrewAI
refuses it inside a running event loop).

crewai pulls mcp 1.x, which the mcp extra's mcp 2 excludes, so scripts/test.sh runs this file in a virtualenv of
its own (SQLite)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest

os.environ.update(  # nothing leaves the machine, and no prompt waits for an answer
    CREWAI_DISABLE_TELEMETRY="true", OTEL_SDK_DISABLED="true", CREWAI_TRACING_ENABLED="false", CREWAI_TESTING="true"
)

with warnings.catch_warnings():  # crewai.rag's lazily set submodules warn on import (CrewAI's, not ours)
    warnings.simplefilter("ignore", ImportWarning)
    from crewai import Agent, Crew, Task
    from crewai.context import get_current_task_id
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import tool

from agentguard import Guard, GuardEvent, task
from agentguard.integrations.crewai import once

pytestmark = [
    pytest.mark.storeless,  # the adapter layer, not the store's SQL: runs once
    pytest.mark.anyio,
    # CrewAI reads its own deprecated fields (function_calling_llm, ...) on every Agent and Crew it builds
    pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai"),
]


class Ledger:
    """The side effect: every real charge, with the downstream key it was made under."""

    def __init__(self) -> None:
        self.charges: list[tuple[str, int, str]] = []
        self.lock = threading.Lock()

    def charge(self, order_id: str, amount_cents: int, key: str) -> str:
        with self.lock:
            self.charges.append((order_id, amount_cents, key))
            n = len(self.charges)
        return json.dumps({"charge_id": f"ch_{n}", "order_id": order_id, "amount_cents": amount_cents})


class Scripted(BaseLLM):
    """Calls the charge tool for order o-1 once per amount, one step each, then gives its final answer. Keeps
    what it was sent, so a test reads the observations the agent was given."""

    def __init__(self, amounts: Sequence[int]) -> None:
        super().__init__(model="scripted")
        self.amounts = list(amounts)
        self.seen: list[Any] = []

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
             from_task: Any = None, from_agent: Any = None, response_model: Any = None) -> str:
        self.seen.append(messages)
        if self.amounts:
            args = json.dumps({"order_id": "o-1", "amount_cents": self.amounts.pop(0)})
            return f"Thought: I charge the order.\nAction: charge\nAction Input: {args}"
        return "Thought: I now know the final answer\nFinal Answer: done"

    async def acall(self, messages: Any, *args: Any, **kwargs: Any) -> str:  # akickoff's native async loop
        return self.call(messages, *args, **kwargs)

    def supports_function_calling(self) -> bool:
        return False  # the ReAct loop: one action per step, its observation fed back

    def supports_stop_words(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 8192

    def get_input_tokens_count(self, messages: Any, tools: Any = None, response_model: Any = None) -> int:
        return len(str(messages)) // 4  # CrewAI's own estimate, without its warning that it is one

    def observations(self) -> list[str]:
        """The observations the agent was given, in order."""
        last = self.seen[-1]
        said = [m["content"] for m in last if m["role"] == "assistant"] if isinstance(last, list) else []
        return [s.split("Observation:", 1)[1].strip() for s in said if "Observation:" in s]


class ScriptedNative(Scripted):
    """Native function calling: one step asks for the charge once per amount, all at once (CrewAI runs the calls
    of one step on threads of a pool), then the final answer. Observations are the tool messages."""

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        self.seen.append(messages)
        if not self.amounts:
            return "done"
        calls = [{"id": f"call_{i}", "type": "function", "function": {
            "name": "charge", "arguments": json.dumps({"order_id": "o-1", "amount_cents": amount})}}
            for i, amount in enumerate(self.amounts)]
        self.amounts = []
        return calls

    def supports_function_calling(self) -> bool:
        return True

    def observations(self) -> list[str]:
        return [m["content"] for m in self.seen[-1] if m["role"] == "tool"]


def guarded_tool(guard: Guard, ledger: Ledger, before: Callable[[], None] = lambda: None) -> Any:
    @once(guard, key="order_id", operation="charge")
    def charge_order(order_id: str, amount_cents: int, idempotency_key: str = "") -> str:
        return ledger.charge(order_id, amount_cents, idempotency_key)

    @tool("charge")
    def charge(order_id: str, amount_cents: int) -> str:
        """Charge an order."""
        before()
        return charge_order(order_id=order_id, amount_cents=amount_cents)

    return charge


def crew_of(tool_: Any, llm: Scripted, *, async_execution: bool = False) -> Crew:
    agent = Agent(role="billing", goal="charge orders", backstory="a careful clerk", llm=llm, tools=[tool_],
                  verbose=False)
    tasks = [Task(description="charge o-1", expected_output="done", agent=agent, async_execution=async_execution)]
    return Crew(agents=[agent], tasks=tasks, verbose=False)


async def kickoff(crew: Crew) -> str:
    """``crew.kickoff()`` as a sync caller makes it: on a thread with no event loop (the task context goes along)."""
    return str(await asyncio.to_thread(crew.kickoff))


NOTE = ("agentguard: REPLAY. charge[order_id=\"o-1\"] already happened in task {task!r}; this is its recorded "
        "result, returned again. Nothing was executed again.")


def bare(observation: str, task_id: str) -> tuple[str, bool]:
    """An observation without the replay note (and whether it had one: a replay tells the model so)."""
    note = NOTE.format(task=task_id) + "\n\n"
    return (observation[len(note):], True) if observation.startswith(note) else (observation, False)


@pytest.fixture(autouse=True)
def crewai_storage(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """CrewAI records each kickoff's task outputs in SQLite under the user's data directory, shared by every crew
    (and every crewai version) run from the same directory name: each test gets its own."""
    monkeypatch.setenv("CREWAI_STORAGE_DIR", str(tmp_path / "crewai"))


@pytest.fixture
def events() -> list[GuardEvent]:
    return []


@pytest.fixture
def guard(make_guard: Callable[..., Guard], events: list[GuardEvent]) -> Guard:
    return make_guard(on_event=events.append)


async def test_a_rerun_after_a_timeout_replays_and_a_change_is_refused(guard: Guard, events: list[GuardEvent]) -> None:
    ledger = Ledger()

    @tool("charge")
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str:
        """Charge an order."""
        return ledger.charge(order_id, amount_cents, idempotency_key)

    first, rerun = Scripted([500]), Scripted([500, 700])
    with task("task-42"):
        assert await kickoff(crew_of(charge, first)) == "done"
        # the crew is run again (its caller timed out): new objects, so CrewAI's own cache cannot help
        assert await kickoff(crew_of(charge, rerun)) == "done"
    assert len(ledger.charges) == 1
    (record,) = await guard.records()
    assert record.task_id == "task-42" and ledger.charges[0][2] == record.key
    charged = json.loads(first.observations()[0])
    assert charged == {"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500}
    replayed, refused = rerun.observations()
    assert bare(replayed, "task-42") == (json.dumps(charged), True)  # the stored text, after the note
    assert [e.kind for e in events].count("replayed") == 1
    assert refused.startswith("Refused by agentguard:") and "amount_cents" in refused
    assert "already called in task 'task-42' with different arguments" in refused
    assert refused.endswith("Nothing was executed.")


@pytest.mark.parametrize("start", ["kickoff_async", "akickoff"])  # kickoff on a thread; CrewAI's native async loop
async def test_two_crews_at_once_charge_once(guard: Guard, start: str) -> None:
    ledger = Ledger()
    both_in = threading.Barrier(2)
    tool_ = guarded_tool(guard, ledger, before=lambda: both_in.wait(timeout=60))  # both calls in flight at once
    one, two = Scripted([500]), Scripted([500])
    with task("task-7"):
        outs = await asyncio.gather(getattr(crew_of(tool_, one), start)(), getattr(crew_of(tool_, two), start)())
    assert [str(o) for o in outs] == ["done", "done"]
    assert len(ledger.charges) == 1
    (a,), (b,) = one.observations(), two.observations()
    (text_a, told_a), (text_b, told_b) = bare(a, "task-7"), bare(b, "task-7")
    assert text_a == text_b and sorted([told_a, told_b]) == [False, True]  # the replay, and only it, is told


async def test_two_calls_in_one_step_run_on_two_threads_and_charge_once(guard: Guard, events: list[GuardEvent]) -> None:
    ledger = Ledger()
    both_in = threading.Barrier(2)
    tool_ = guarded_tool(guard, ledger, before=lambda: both_in.wait(timeout=60))  # both calls in flight at once
    llm = ScriptedNative([500, 500])
    with task("task-8"):
        assert await kickoff(crew_of(tool_, llm)) == "done"
    assert len(ledger.charges) == 1
    charged = {"charge_id": "ch_1", "order_id": "o-1", "amount_cents": 500}
    seen = [bare(o, "task-8") for o in llm.observations()]
    assert [json.loads(o) for o, _ in seen] == [charged, charged] and sorted(t for _, t in seen) == [False, True]
    assert [e.kind for e in events].count("replayed") == 1


async def test_an_async_execution_task_keeps_the_task_and_charges_once(guard: Guard) -> None:
    ledger = Ledger()
    tool_ = guarded_tool(guard, ledger)
    first, rerun = Scripted([500]), Scripted([500])
    with task("task-9"):  # CrewAI runs an async_execution task on a thread of its own, with a copy of this context
        assert await kickoff(crew_of(tool_, first, async_execution=True)) == "done"
        assert await kickoff(crew_of(tool_, rerun, async_execution=True)) == "done"
    assert len(ledger.charges) == 1
    (said,), (again,) = first.observations(), rerun.observations()
    assert bare(again, "task-9") == (said, True)
    (record,) = await guard.records()
    assert record.task_id == "task-9"


async def test_without_a_task_nothing_runs_and_crewais_own_task_ids_are_not_taken_for_one(guard: Guard) -> None:
    ledger = Ledger()
    crewai_ids: list[str | None] = []
    tool_ = guarded_tool(guard, ledger, before=lambda: crewai_ids.append(get_current_task_id()))
    first, rerun = Scripted([500]), Scripted([500])
    await kickoff(crew_of(tool_, first))
    await kickoff(crew_of(tool_, rerun))  # the same work again: CrewAI's task id is new, so it cannot be the key
    assert ledger.charges == []
    assert len(crewai_ids) == 2 and None not in crewai_ids and crewai_ids[0] != crewai_ids[1]
    for llm in (first, rerun):
        (said,) = llm.observations()
        assert said.startswith("Refused by agentguard:") and "no task id" in said
        assert said.endswith("Nothing was executed.")


async def test_once_on_top_of_tool_says_which_way_round(guard: Guard) -> None:
    @tool("charge")
    def charge(order_id: str) -> str:
        """Charge an order."""
        return order_id

    with pytest.raises(TypeError, match=r"crewai\.once\(\.\.\.\) was placed on top of a Tool made by CrewAI's @tool; "
                                        r"put it underneath"):
        once(guard, key="order_id")(charge)


async def test_the_schema_the_model_sees_has_only_the_model_arguments(guard: Guard) -> None:
    @tool("charge")
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str:
        """Charge an order."""
        return order_id

    assert set(charge.args_schema.model_json_schema()["properties"]) == {"order_id", "amount_cents"}


@pytest.mark.storeless
async def test_a_misspelt_key_is_refused_at_decoration(guard: Guard) -> None:
    ledger = Ledger()
    with pytest.raises(TypeError) as info:

        @tool("charge")
        @once(guard, key="orderid")
        def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str:
            """Charge an order."""
            return ledger.charge(order_id, amount_cents, idempotency_key)

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, order_id")
    assert ledger.charges == []


async def test_replay_note_false_replays_the_observation_as_it_is(guard: Guard) -> None:
    ledger = Ledger()

    @tool("charge")
    @once(guard, key="order_id", replay_note=False)
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str:
        """Charge an order."""
        return ledger.charge(order_id, amount_cents, idempotency_key)

    first, rerun = Scripted([500]), Scripted([500])
    with task("task-q"):
        await kickoff(crew_of(charge, first))
        await kickoff(crew_of(charge, rerun))
    assert len(ledger.charges) == 1 and first.observations() == rerun.observations()
