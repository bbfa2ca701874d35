"""LangChain / LangGraph: GenericFakeChatModel drives a real StateGraph with a ToolNode and a checkpointer,
and a real create_agent loop with the ToolGuard middleware."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, interrupt
from pydantic import Field

from agentguard import Guard, GuardEvent, current_key, task
from agentguard.integrations.langchain import GuardToolException, ToolGuard, once

from guard_spans import guard_spans

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
class Ledger:
    """A provider that deduplicates by idempotency key, like Stripe; counts real charges and every attempt."""

    def __init__(self) -> None:
        self.by_key: dict[str, dict[str, Any]] = {}
        self.attempts: list[str] = []
        self.lock = threading.Lock()

    def charge(self, order_id: str, amount_cents: int, key: str) -> dict[str, Any]:
        with self.lock:
            self.attempts.append(key)
            if key not in self.by_key:
                self.by_key[key] = {"charge_id": f"ch_{len(self.by_key) + 1}", "order_id": order_id,
                                    "amount_cents": amount_cents}
            return self.by_key[key]

    @property
    def charges(self) -> int:
        return len(self.by_key)


def call(cid: str, amount: int = 500, name: str = "charge", **extra: Any) -> dict[str, Any]:
    args = {"order_id": "o-1", "amount_cents": amount} if name == "charge" else extra
    return {"name": name, "args": args, "id": cid, "type": "tool_call"}


def fake_model(turns: Sequence[Sequence[dict[str, Any]]]) -> GenericFakeChatModel:
    messages = [AIMessage("", tool_calls=list(t)) for t in turns] + [AIMessage("done")]
    return GenericFakeChatModel(messages=iter(messages))


def graph(tools: Sequence[BaseTool], model: GenericFakeChatModel, **node: Any) -> Any:
    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(list(tools), **node))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=InMemorySaver())


def thread(tid: str = "thread-42") -> RunnableConfig:
    return {"configurable": {"thread_id": tid}}


def tool_messages(state: Any) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}


def decorated(guard: Guard, ledger: Ledger) -> BaseTool:
    @tool
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        """Charge an order."""
        return ledger.charge(order_id, amount_cents, idempotency_key)

    return charge


@pytest.fixture
def events() -> list[GuardEvent]:
    return []


@pytest.fixture
def guard(make_guard: Callable[..., Guard], events: list[GuardEvent]) -> Guard:
    return make_guard(on_event=events.append)


async def test_two_calls_in_one_thread_charge_once_and_replay(guard: Guard) -> None:
    ledger = Ledger()
    app = graph([decorated(guard, ledger)], fake_model([[call("call_1")], [call("call_2")]]))
    out = tool_messages(app.invoke({"messages": [HumanMessage("go")]}, thread()))
    assert ledger.charges == 1 and len(ledger.attempts) == 1
    assert out["call_1"].content == out["call_2"].content
    assert json.loads(str(out["call_1"].content))["charge_id"] == "ch_1"
    assert [r.task_id for r in await guard.records()] == ["thread-42"]  # the LangGraph thread id


async def test_identical_calls_in_one_message_run_concurrently_and_charge_once(guard: Guard) -> None:
    ledger = Ledger()
    app = graph([decorated(guard, ledger)], fake_model([[call("call_1"), call("call_2")]]))
    out = tool_messages(app.invoke({"messages": [HumanMessage("go")]}, thread()))
    assert len(ledger.attempts) == 1
    assert out["call_1"].content == out["call_2"].content


async def test_different_amount_reaches_the_model_as_an_error_tool_message(guard: Guard) -> None:
    ledger = Ledger()
    refusals = ToolGuard(guard)  # no tools of its own: answers the refusals of once-guarded tools
    app = graph([decorated(guard, ledger)], fake_model([[call("call_1", 500)], [call("call_2", 700)]]),
                wrap_tool_call=refusals.wrap_tool_call)
    out = tool_messages(app.invoke({"messages": [HumanMessage("go")]}, thread()))
    assert len(ledger.attempts) == 1
    assert out["call_2"].status == "error" and out["call_2"].tool_call_id == "call_2"
    assert "different arguments" in str(out["call_2"].content) and "amount_cents" in str(out["call_2"].content)


async def test_decorator_alone_refuses_with_a_tool_exception(guard: Guard) -> None:
    ledger = Ledger()
    charge = decorated(guard, ledger)
    charge.handle_tool_error = True  # LangChain's own switch for ToolException -> error ToolMessage
    app = graph([charge], fake_model([[call("call_1", 500)], [call("call_2", 700)]]))
    out = tool_messages(app.invoke({"messages": [HumanMessage("go")]}, thread()))
    assert out["call_2"].status == "error" and "different arguments" in str(out["call_2"].content)
    charge.handle_tool_error = False
    with pytest.raises(GuardToolException, match="different arguments") as info, task("thread-42"):
        charge.invoke({"order_id": "o-1", "amount_cents": 900})
    assert info.value.error.status == 422


async def test_missing_thread_id_is_refused_without_running(guard: Guard) -> None:
    ledger = Ledger()
    charge = decorated(guard, ledger)
    with pytest.raises(GuardToolException, match="no task id"):
        charge.invoke({"order_id": "o-1", "amount_cents": 500})  # no graph, no thread, no task(...)
    assert ledger.attempts == []


async def test_injected_key_and_injected_args_are_not_in_the_model_schema(guard: Guard) -> None:
    ledger = Ledger()

    @tool
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int, tool_call_id: Annotated[str, InjectedToolCallId],
               idempotency_key: str = "") -> dict[str, Any]:
        """Charge an order."""
        return ledger.charge(order_id, amount_cents, idempotency_key)

    schema = convert_to_openai_tool(charge)["function"]["parameters"]
    assert set(schema["properties"]) == {"order_id", "amount_cents"}
    assert "idempotency_key" not in json.dumps(schema) and "tool_call_id" not in json.dumps(schema)
    # the injected tool_call_id differs per call and must not split the fingerprint
    app = graph([charge], fake_model([[call("call_1")], [call("call_2")]]))
    out = tool_messages(app.invoke({"messages": [HumanMessage("go")]}, thread()))
    assert len(ledger.attempts) == 1 and out["call_1"].content == out["call_2"].content


async def test_interrupt_reruns_the_tool_step_and_the_charge_is_replayed(
    guard: Guard, events: list[GuardEvent]
) -> None:
    ledger = Ledger()

    @tool
    def confirm(question: str) -> str:
        """Ask a human."""
        return str(interrupt(question))

    app = graph([decorated(guard, ledger), confirm],
                fake_model([[call("call_1"), call("call_c", name="confirm", question="ship it?")]]))
    first = app.invoke({"messages": [HumanMessage("go")]}, thread())
    assert "__interrupt__" in first and len(ledger.attempts) == 1
    final = app.invoke(Command(resume="yes"), thread())
    out = tool_messages(final)
    assert out["call_c"].content == "yes"
    assert len(ledger.attempts) == 1  # the whole ToolNode step ran again; the guard replayed the charge
    assert [e.kind for e in events].count("replayed") == 1


async def test_crash_in_the_tools_node_resumed_from_the_checkpointer_replays(guard: Guard) -> None:
    ledger = Ledger()
    crashes = [RuntimeError("worker died")]

    @tool
    def notify(text: str) -> str:
        """Tell someone."""
        if crashes:
            raise crashes.pop()
        return "sent"

    app = graph([decorated(guard, ledger), notify],
                fake_model([[call("call_1"), call("call_n", name="notify", text="charged")]]))
    with pytest.raises(RuntimeError, match="worker died"):
        app.invoke({"messages": [HumanMessage("go")]}, thread())
    assert len(ledger.attempts) == 1
    out = tool_messages(app.invoke(None, thread()))  # resume from the last checkpoint
    assert out["call_n"].content == "sent" and json.loads(str(out["call_1"].content))["charge_id"] == "ch_1"
    assert len(ledger.attempts) == 1


async def test_crash_after_the_provider_charged_retries_with_the_same_key(guard: Guard) -> None:
    ledger = Ledger()
    crashes = [RuntimeError("connection reset after the charge")]

    @tool
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order."""
        receipt = ledger.charge(order_id, amount_cents, current_key())
        if crashes:
            raise crashes.pop()
        return receipt

    app = graph([charge], fake_model([[call("call_1")]]))
    with pytest.raises(RuntimeError, match="connection reset"):
        app.invoke({"messages": [HumanMessage("go")]}, thread())
    out = tool_messages(app.invoke(None, thread()))
    assert len(ledger.attempts) == 2 and len(set(ledger.attempts)) == 1  # same downstream key both times
    assert ledger.charges == 1 and json.loads(str(out["call_1"].content))["charge_id"] == "ch_1"


BOUND: list[dict[str, Any]] = []


class ToolCallingFake(GenericFakeChatModel):
    """create_agent binds the tools to the model: record the schemas it would send."""

    def bind_tools(self, tools: Sequence[Any], **kw: Any) -> Any:
        BOUND[:] = [convert_to_openai_tool(t) for t in tools]
        return self


def plain_charge(ledger: Ledger) -> BaseTool:
    @tool
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order."""
        return ledger.charge(order_id, amount_cents, current_key())

    return charge


@pytest.fixture
def middleware_model() -> Iterator[Callable[[Sequence[Sequence[dict[str, Any]]]], ToolCallingFake]]:
    def make(turns: Sequence[Sequence[dict[str, Any]]]) -> ToolCallingFake:
        messages = [AIMessage("", tool_calls=list(t)) for t in turns] + [AIMessage("done")]
        return ToolCallingFake(messages=iter(messages))

    yield make


async def test_create_agent_middleware_replays_with_the_current_tool_call_id(
    guard: Guard, middleware_model: Callable[..., ToolCallingFake]
) -> None:
    ledger = Ledger()
    model = middleware_model([[call("call_1"), call("call_2")], [call("call_3")], [call("call_4", 700)]])
    agent = create_agent(model, tools=[plain_charge(ledger)], middleware=[ToolGuard(guard, {"charge": "order_id"})],
                         checkpointer=InMemorySaver())
    out = tool_messages(agent.invoke({"messages": [HumanMessage("go")]}, thread("t-mw")))
    assert len(ledger.attempts) == 1
    # call_1 and call_2 run at once (the ToolNode's threads): either may be the one that ran
    ran, replayed = sorted(("call_1", "call_2"), key=lambda c: "dev.agentguard/replayed" in out[c].response_metadata)
    assert out[ran].content == untold(out[replayed], "t-mw") == untold(out["call_3"], "t-mw")
    assert [out[c].tool_call_id for c in ("call_1", "call_2", "call_3")] == ["call_1", "call_2", "call_3"]
    assert out["call_4"].status == "error" and "different arguments" in str(out["call_4"].content)
    (sent,) = BOUND
    assert set(sent["function"]["parameters"]["properties"]) == {"order_id", "amount_cents"}
    (record,) = await guard.records()
    assert record.task_id == "t-mw" and ledger.attempts[0] == record.key


async def test_middleware_async_path_and_validated_arguments(guard: Guard) -> None:
    ledger = Ledger()

    @tool
    async def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order."""
        return ledger.charge(order_id, amount_cents, current_key())

    tg = ToolGuard(guard, {"charge": "order_id"}, task_id=lambda config: "explicit-task")
    turns = [[call("call_1")], [{"name": "charge", "args": {"amount_cents": "500", "order_id": "o-1"},
                                 "id": "call_2", "type": "tool_call"}]]
    app = graph([charge], fake_model(turns), wrap_tool_call=tg.wrap_tool_call, awrap_tool_call=tg.awrap_tool_call)
    out = tool_messages(await app.ainvoke({"messages": [HumanMessage("go")]}, thread()))
    assert len(ledger.attempts) == 1  # "500" validates to 500: the same operation, replayed
    assert out["call_1"].content == untold(out["call_2"], "explicit-task") and out["call_2"].tool_call_id == "call_2"
    assert [r.task_id for r in await guard.records()] == ["explicit-task"]


async def test_middleware_does_not_store_a_handled_tool_error(guard: Guard) -> None:
    ledger = Ledger()
    fails = [ValueError("card declined, try later")]

    @tool
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order."""
        if fails:
            raise fails.pop()
        return ledger.charge(order_id, amount_cents, current_key())

    tg = ToolGuard(guard, {"charge": "order_id"})
    app = graph([charge], fake_model([[call("call_1")], [call("call_2")]]), wrap_tool_call=tg.wrap_tool_call,
                handle_tool_errors=True)
    out = tool_messages(app.invoke({"messages": [HumanMessage("go")]}, thread()))
    assert out["call_1"].status == "error" and "card declined" in str(out["call_1"].content)
    assert out["call_2"].status == "success" and len(ledger.attempts) == 1


async def test_guard_on_top_of_tool_is_a_type_error(guard: Guard) -> None:
    with pytest.raises(TypeError, match="put it underneath"):
        guard.once(plain_charge(Ledger()))  # type: ignore[call-overload]


TYPOS = [
    pytest.param({"chargee": "order_id"}, "the agent offers no tool named 'chargee' (did you mean 'charge'?); it "
                 "offers: charge", id="tool"),
    pytest.param({"charge": "orderid"}, "key='orderid' is not an argument of charge (did you mean 'order_id'?); its "
                 "arguments are: amount_cents, order_id", id="key"),
]


@pytest.mark.storeless
@pytest.mark.parametrize(("tools", "refusal"), TYPOS)
async def test_create_agent_refuses_a_name_the_agent_lacks_before_any_tool_runs(
    guard: Guard, middleware_model: Callable[..., ToolCallingFake], tools: dict[str, Any], refusal: str
) -> None:
    ledger = Ledger()
    agent = create_agent(middleware_model([[call("call_1")], [call("call_2")]]), tools=[plain_charge(ledger)],
                         middleware=[ToolGuard(guard, tools)], checkpointer=InMemorySaver())
    with pytest.raises(ValueError) as info:
        agent.invoke({"messages": [HumanMessage("go")]}, thread("t-typo"))
    assert str(info.value) == f"ToolGuard: {refusal}"
    with pytest.raises(ValueError) as info:
        await agent.ainvoke({"messages": [HumanMessage("go")]}, thread("t-typo-async"))
    assert str(info.value) == f"ToolGuard: {refusal}"
    assert ledger.attempts == []


@pytest.mark.storeless
@pytest.mark.parametrize(("tools", "refusal"), TYPOS)
async def test_tool_node_is_built_only_when_every_name_is_there(
    guard: Guard, tools: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(ValueError) as info:
        ToolGuard(guard, tools).tool_node([plain_charge(Ledger())])
    assert str(info.value) == "ToolGuard: " + refusal.replace("the agent", "the ToolNode")


@pytest.mark.storeless
async def test_a_hand_built_tool_node_refuses_a_misspelt_key_before_the_tool_runs(guard: Guard) -> None:
    ledger = Ledger()
    tg = ToolGuard(guard, {"charge": "orderid"})
    app = graph([plain_charge(ledger)], fake_model([[call("call_1")]]), wrap_tool_call=tg.wrap_tool_call)
    with pytest.raises(ValueError, match=r"key='orderid' is not an argument of charge \(did you mean 'order_id'\?\)"):
        app.invoke({"messages": [HumanMessage("go")]}, thread())
    assert ledger.attempts == []


@pytest.mark.storeless
async def test_decorator_refuses_a_misspelt_key_at_decoration(guard: Guard) -> None:
    ledger = Ledger()
    with pytest.raises(TypeError) as info:

        @tool
        @once(guard, key="orderid")
        def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
            """Charge an order."""
            return ledger.charge(order_id, amount_cents, current_key())

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, order_id")
    assert ledger.attempts == []


NOTE = ("agentguard: REPLAY. charge[order_id=\"o-1\"] already happened in task {task!r}; this is its recorded "
        "result, returned again. Nothing was executed again.")


def untold(message: ToolMessage, task_id: str) -> Any:
    """The content of a replay's message without the note it must start with (and the mark it must carry)."""
    assert message.response_metadata.get("dev.agentguard/replayed") is True
    content = message.content
    if isinstance(content, str):
        note = NOTE.format(task=task_id) + "\n\n"
        assert content.startswith(note), content
        return content[len(note):]
    assert content[0] == {"type": "text", "text": NOTE.format(task=task_id)}, content
    return content[1:]


class Recording(GenericFakeChatModel):
    """Keeps the messages of every call: what the model was told."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def recording(turns: Sequence[Sequence[dict[str, Any]]]) -> Recording:
    return Recording(messages=iter([AIMessage("", tool_calls=list(t)) for t in turns] + [AIMessage("done")]))


def told_to(model: Recording, call_id: str) -> ToolMessage:
    """The tool message of ``call_id`` as the model last read it."""
    (found,) = [m for m in model.seen[-1] if isinstance(m, ToolMessage) and m.tool_call_id == call_id]
    return found


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_the_middleware_tells_a_replay_and_keeps_the_artifact(guard: Guard, path: str) -> None:
    """A content-and-artifact tool guarded by ToolGuard: the second call in the thread is replayed; the model
    reads the note before the content; the artifact, the program's value, is the first call's unchanged."""
    ledger = Ledger()

    @tool(response_format="content_and_artifact")
    def charge(order_id: str, amount_cents: int) -> tuple[str, dict[str, Any]]:
        """Charge an order."""
        receipt = ledger.charge(order_id, amount_cents, current_key())
        return f"charged {order_id}", receipt

    tg = ToolGuard(guard, {"charge": "order_id"})
    model = recording([[call("call_1")], [call("call_2")]])
    app = graph([charge], model, wrap_tool_call=tg.wrap_tool_call, awrap_tool_call=tg.awrap_tool_call)
    start = {"messages": [HumanMessage("go")]}
    state = app.invoke(start, thread("t-art")) if path == "sync" else await app.ainvoke(start, thread("t-art"))
    out = tool_messages(state)
    assert ledger.charges == 1 and len(ledger.attempts) == 1
    first, again = told_to(model, "call_1"), told_to(model, "call_2")
    assert first.content == "charged o-1" and "dev.agentguard/replayed" not in first.response_metadata
    assert again.content == f"{NOTE.format(task='t-art')}\n\ncharged o-1"
    assert out["call_2"].artifact == out["call_1"].artifact == {"charge_id": "ch_1", "order_id": "o-1",
                                                                "amount_cents": 500}
    assert untold(out["call_2"], "t-art") == out["call_1"].content


async def test_a_once_guarded_tool_under_the_middleware_is_told_whatever_it_returns(guard: Guard) -> None:
    """A dict result has no room for a note, but its ToolMessage has: ToolGuard with no tools of its own tells
    the replay of a once-guarded tool there, once."""
    ledger = Ledger()
    tg = ToolGuard(guard)
    model = recording([[call("call_1")], [call("call_2")]])
    app = graph([decorated(guard, ledger)], model, wrap_tool_call=tg.wrap_tool_call)
    out = tool_messages(app.invoke({"messages": [HumanMessage("go")]}, thread("t-once")))
    assert ledger.charges == 1
    assert json.loads(untold(told_to(model, "call_2"), "t-once")) == json.loads(str(out["call_1"].content))
    assert str(told_to(model, "call_2").content).count("agentguard: REPLAY.") == 1


async def test_the_decorator_alone_tells_a_string_result_and_replay_note_false_nothing(guard: Guard) -> None:
    ledger = Ledger()

    def text_charge(replay_note: bool) -> BaseTool:
        @tool
        @once(guard, key="order_id", replay_note=replay_note)
        def charge(order_id: str, amount_cents: int) -> str:
            """Charge an order."""
            return json.dumps(ledger.charge(order_id, amount_cents, current_key()))

        return charge

    model = recording([[call("call_1")], [call("call_2")]])
    graph([text_charge(True)], model).invoke({"messages": [HumanMessage("go")]}, thread("t-text"))
    first = str(told_to(model, "call_1").content)
    assert told_to(model, "call_2").content == f"{NOTE.format(task='t-text')}\n\n{first}"
    quiet = recording([[call("call_1")], [call("call_2")]])
    graph([text_charge(False)], quiet).invoke({"messages": [HumanMessage("go")]}, thread("t-quiet"))
    assert told_to(quiet, "call_2").content == told_to(quiet, "call_1").content
    tg = ToolGuard(guard, {"charge": "order_id"}, replay_note=False)
    quiet = recording([[call("call_1")], [call("call_2")]])
    graph([plain_charge(ledger)], quiet, wrap_tool_call=tg.wrap_tool_call).invoke(
        {"messages": [HumanMessage("go")]}, thread("t-quiet-mw"))
    again = told_to(quiet, "call_2")
    assert again.content == told_to(quiet, "call_1").content and not again.response_metadata
    assert ledger.charges == len(ledger.attempts) == 3  # three threads: three tasks, each charged once


async def test_a_call_the_middleware_refuses_for_want_of_a_task_id_has_its_span(
    guard: Guard, middleware_model: Callable[..., ToolCallingFake]
) -> None:
    """No thread id, no task: the model is told nothing ran, and the refusal has its span (refused, error.type
    MissingTaskError, the tool call's id)."""
    ledger = Ledger()
    agent = create_agent(middleware_model([[call("call_1")]]), tools=[plain_charge(ledger)],
                         middleware=[ToolGuard(guard, {"charge": "order_id"})])
    with guard_spans() as spans:
        out = tool_messages(await agent.ainvoke({"messages": [HumanMessage("go")]}))
    assert ledger.attempts == [] and out["call_1"].status == "error" and "no task id" in str(out["call_1"].content)
    (span,) = spans.guarded("charge")
    assert span.attributes is not None and span.attributes["agentguard.outcome"] == "refused"
    assert span.attributes["error.type"] == "MissingTaskError" and span.attributes["gen_ai.tool.call.id"] == "call_1"
