"""Decorator order: every adapter's ``once`` placed *on top of* a framework's tool decorator (so it is handed the
framework's tool object, or a function the framework already registered as it is) refuses with a TypeError
that says which way round, naming the framework's decorator — before anything inspects the object. Each
framework's real decorator makes the object."""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from pydantic_ai import RunContext

from agentguard import Guard
from agentguard.integrations import (
    ag2,
    agno,
    anthropic,
    claude_agent_sdk,
    dbos,
    google_adk,
    langchain,
    llamaindex,
    openai_agents,
    pydantic_ai,
    smolagents,
    temporal,
)

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
ADAPTERS: dict[str, tuple[ModuleType, str]] = {  # adapter → (module, its framework's decorator)
    "openai_agents": (openai_agents, "@function_tool"),
    "langchain": (langchain, "@tool"),
    "pydantic_ai": (pydantic_ai, "@agent.tool"),
    "dbos": (dbos, "@DBOS.step()"),
    "temporal": (temporal, "@activity.defn"),
    "smolagents": (smolagents, "tool(...)"),
    "llamaindex": (llamaindex, "FunctionTool.from_defaults"),
    "agno": (agno, "@tool"),
    "google_adk": (google_adk, "FunctionTool(...)"),
    "ag2": (ag2, "@tool"),
    "anthropic": (anthropic, "@beta_tool"),
    "claude_agent_sdk": (claude_agent_sdk, '@tool("charge", ...)'),
}


def charge(order_id: str, amount_cents: int) -> str:
    """Charge an order."""
    return f"{order_id}:{amount_cents}"


async def acharge(order_id: str, amount_cents: int) -> str:
    """Charge an order."""
    return f"{order_id}:{amount_cents}"


def function_tool() -> Any:
    from agents import function_tool

    return function_tool(charge)


def async_function_tool() -> Any:
    from agents import function_tool

    return function_tool(acharge)


def langchain_tool() -> Any:
    from langchain_core.tools import tool

    return tool(charge)


def langchain_async_tool() -> Any:
    from langchain_core.tools import tool

    return tool(acharge)


def beta_tool() -> Any:
    from anthropic import beta_tool

    return beta_tool(charge)


def beta_async_tool() -> Any:
    from anthropic import beta_async_tool

    return beta_async_tool(acharge)


def adk_function_tool() -> Any:
    from google.adk.tools import FunctionTool

    return FunctionTool(charge)


def ag2_tool() -> Any:
    from ag2 import tool

    return tool(acharge)


def sdk_mcp_tool() -> Any:
    from claude_agent_sdk import tool

    async def handler(args: dict[str, Any]) -> dict[str, Any]:
        return {"content": []}

    return tool("charge", "Charge an order", {"order_id": str})(handler)


def pydantic_ai_tool() -> Any:
    from pydantic_ai import Tool

    return Tool(charge)


def smolagents_tool() -> Any:
    from smolagents import tool

    def charge(order_id: str, amount_cents: int) -> str:
        """Charge an order.

        Args:
            order_id: the order
            amount_cents: how much
        """
        return f"{order_id}:{amount_cents}"

    return tool(charge)


def llamaindex_tool() -> Any:
    from llama_index.core.tools import FunctionTool

    return FunctionTool.from_defaults(charge)


def agno_tool() -> Any:
    from agno.tools import tool

    return tool(charge)


# tool object maker → (its class, what made it as the message names it; a decorator is shown on top, anything
# else gives way to the adapter's own decorator)
TOOL_OBJECTS: dict[str, tuple[Callable[[], Any], str, str]] = {
    "function_tool": (function_tool, "FunctionTool", "@function_tool"),
    "function_tool-async": (async_function_tool, "FunctionTool", "@function_tool"),
    "langchain-tool": (langchain_tool, "StructuredTool", "@tool"),
    "langchain-tool-async": (langchain_async_tool, "StructuredTool", "@tool"),
    "beta_tool": (beta_tool, "BetaFunctionTool", "@beta_tool"),
    "beta_async_tool": (beta_async_tool, "BetaAsyncFunctionTool", "@beta_async_tool"),
    "pydantic_ai.Tool": (pydantic_ai_tool, "Tool", "Tool(...)"),  # a call, not a decorator
    "smolagents-tool": (smolagents_tool, "SimpleTool", "@tool"),
    "llamaindex-FunctionTool": (llamaindex_tool, "FunctionTool", "FunctionTool.from_defaults(...)"),  # a call
    "agno-tool": (agno_tool, "Function", "@tool"),
    "google_adk.FunctionTool": (adk_function_tool, "FunctionTool", "FunctionTool(...)"),
    "ag2.tool": (ag2_tool, "FunctionTool", "@tool"),
    "claude_agent_sdk.tool": (sdk_mcp_tool, "SdkMcpTool", "@tool"),
}


@pytest.fixture
def guard(make_guard: Callable[..., Guard]) -> Guard:
    return make_guard()


def says_which_way_round(adapter: str, what: str, top: str) -> str:
    """The message, as a pattern: who was put on top of what, and the right order with ``top`` on top."""
    return (
        rf"agentguard\.integrations\.{adapter}\.once\(\.\.\.\) was placed on top of {what}; "
        rf"put it underneath instead, directly on the function:\n\s+{re.escape(top)}\s+# the framework's "
        r"decorator on top\n\s+@once\(guard, \.\.\.\)\s+# agentguard right above the function"
    )


@pytest.mark.parametrize("made", list(TOOL_OBJECTS))
@pytest.mark.parametrize("adapter", list(ADAPTERS))
async def test_once_on_top_of_a_framework_tool_object_says_which_way_round(
    guard: Guard, adapter: str, made: str
) -> None:
    module, own = ADAPTERS[adapter]
    make, cls, maker = TOOL_OBJECTS[made]
    tool = make()
    assert type(tool).__name__ == cls
    what = rf"a {cls} made by .+'s {re.escape(maker)}"
    top = maker if maker.startswith("@") else own
    with pytest.raises(TypeError, match=says_which_way_round(adapter, what, top)):
        module.once(guard, key="order_id")(tool)


@pytest.mark.parametrize("adapter", list(ADAPTERS))
async def test_once_on_a_non_callable_is_a_type_error(guard: Guard, adapter: str) -> None:
    module, _ = ADAPTERS[adapter]
    with pytest.raises(TypeError, match=rf"integrations\.{adapter}\.once\(\.\.\.\) needs a function, got int"):
        module.once(guard)(42)


async def test_the_right_order_still_makes_each_framework_tool(guard: Guard) -> None:
    from agents import FunctionTool
    from agents import function_tool as agents_function_tool
    from langchain_core.tools import StructuredTool, tool

    assert isinstance(agents_function_tool(openai_agents.once(guard, key="order_id")(charge)), FunctionTool)
    assert isinstance(tool(langchain.once(guard, key="order_id", operation="charge_lc")(charge)), StructuredTool)


async def test_beta_tool_in_the_right_order(guard: Guard) -> None:
    from anthropic import beta_async_tool, beta_tool

    sync_tool = beta_tool(guard.once(key="order_id")(charge))
    async_tool = beta_async_tool(guard.once(key="order_id", operation="acharge")(acharge))
    for made in (sync_tool, async_tool):
        assert set(made.to_dict()["input_schema"]["properties"]) == {"order_id", "amount_cents"}


# -- pydantic-ai: @agent.tool returns the function unchanged, so only its registry tells ----------------------


def agent() -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    return Agent(TestModel())


async def test_pydantic_ai_once_on_top_of_agent_tool_plain_is_refused(guard: Guard) -> None:
    a = agent()
    what = (
        r"a function that a pydantic-ai agent or toolset already holds, unguarded, as its tool 'charge_plain' "
        r"\(@agent\.tool and @agent\.tool_plain return the function unchanged, so the agent would run it "
        r"without the guard; .*\)"
    )
    with pytest.raises(TypeError, match=says_which_way_round("pydantic_ai", what, "@agent.tool")):

        @pydantic_ai.once(guard, key="order_id")
        @a.tool_plain
        def charge_plain(order_id: str, amount_cents: int) -> str:
            return f"{order_id}:{amount_cents}"

    assert list(a._function_toolset.tools) == ["charge_plain"]  # what the agent would have run: the bare function


async def test_pydantic_ai_once_on_top_of_agent_tool_is_refused(guard: Guard) -> None:
    a = agent()
    with pytest.raises(TypeError, match=r"already holds, unguarded, as its tool 'charge_ctx'"):

        @pydantic_ai.once(guard, key="order_id")
        @a.tool(retries=2)
        async def charge_ctx(ctx: RunContext[None], order_id: str) -> str:
            return order_id


async def test_pydantic_ai_registered_through_agent_tools_is_refused(guard: Guard) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    def refund(order_id: str) -> str:
        return order_id

    a = Agent(TestModel(), tools=[refund])
    with pytest.raises(TypeError, match=r"already holds, unguarded, as its tool 'refund'"):
        pydantic_ai.once(guard, key="order_id")(refund)
    assert a is not None


async def test_pydantic_ai_right_order_and_a_gone_agent_are_accepted(guard: Guard) -> None:
    a = agent()

    @a.tool_plain
    @pydantic_ai.once(guard, key="order_id")
    def charge_ok(order_id: str, amount_cents: int) -> str:
        return f"{order_id}:{amount_cents}"

    assert a._function_toolset.tools["charge_ok"].function is charge_ok  # the agent holds the guarded wrapper

    def refund(order_id: str) -> str:
        return order_id

    gone = agent()
    gone.tool_plain(refund)
    del gone  # an agent nobody holds any more registers nothing, whether or not it was collected yet
    guarded = pydantic_ai.once(guard, key="order_id")(refund)
    gc.collect()
    assert guarded.__wrapped__ is not None


# -- DBOS: a function @DBOS.step() already registered ---------------------------------------------------------


async def test_dbos_once_on_top_of_a_step_is_refused(guard: Guard) -> None:
    from dbos import DBOS

    what = r"a function DBOS has already registered \(as '.*charge_step'\)"
    with pytest.raises(TypeError, match=says_which_way_round("dbos", what, "@DBOS.step()")):

        @dbos.once(guard, key="order_id")
        @DBOS.step()
        def charge_step(order_id: str, amount_cents: int) -> str:
            return f"{order_id}:{amount_cents}"

    @DBOS.step()
    @dbos.once(guard, key="order_id")
    def charge_step_ok(order_id: str, amount_cents: int) -> str:
        return f"{order_id}:{amount_cents}"

    assert charge_step_ok.dbos_function_name.endswith("charge_step_ok")  # type: ignore[attr-defined]
