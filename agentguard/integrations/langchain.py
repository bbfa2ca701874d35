"""LangChain / LangGraph: a decorator placed *under* ``@tool``, and :class:`ToolGuard`, a ``wrap_tool_call``
middleware for ``create_agent`` that also plugs into a hand-built ``ToolNode``.

    @tool                                          # LangChain on top
    @once(guard, key="order_id")                   # agentguard right above the function
    def charge(order_id: str, amount_cents: int) -> dict: ...

    agent = create_agent(model, tools=[charge], middleware=[ToolGuard(guard, {"charge": "order_id"})])
    tg = ToolGuard(guard, {"charge": "order_id"})
    node = ToolNode([charge], wrap_tool_call=tg.wrap_tool_call, awrap_tool_call=tg.awrap_tool_call)

Task id: ``task_id=`` (a callable of the ``RunnableConfig``) → ``with agentguard.task(...)`` → the LangGraph
thread id (``config["configurable"]["thread_id"]``, stable across interrupts and checkpoint resumes) →
refused. Never the tool call id or the run id: both change on re-invocation. Injected parameters
(``ToolRuntime``, ``RunnableConfig``, ``InjectedToolCallId``, ``InjectedState``, ...) never enter the fingerprint.

Refusals: :class:`ToolGuard` answers with ``ToolMessage(status="error")`` carrying the current
``tool_call_id`` — for the tools it guards and for tools guarded with :func:`once` below it. The decorator on
its own raises :class:`GuardToolException`, a ``ToolException``: LangChain turns it into the same error
message when the tool has ``handle_tool_error=True``; a bare ``ToolNode`` would re-raise it.

Replays are told to the model in the ``ToolMessage``: :class:`ToolGuard` puts the replay note before its
content, leaves its ``artifact`` as the tool made it and marks ``response_metadata["dev.agentguard/replayed"]``,
for the tools it guards and for ``once``-guarded ones under it, whatever their result. The decorator on its own
can only change what the tool returns: a string result starts with the note; any other is replayed as it is
(a note would change its type). ``replay_note=False`` (on either) never tells.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack

from .._errors import GuardError
from .._extras import require
from .._guard import Guard
from ._common import (
    AdapterOptions,
    Framework,
    ToolSpec,
    context_params,
    noted_text,
    subclass_of,
)
from ._langchain_run import HINT, _exception_class, current_config, refuse, thread_id

require("langchain_core", "langgraph", "langchain", extra="langchain", by=__name__)

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import ToolException

    from ._langchain_middleware import ToolGuard

    class GuardToolException(ToolException):
        error: GuardError

P = ParamSpec("P")
R = TypeVar("R")

_INJECTED_NAMES = (
    "ToolRuntime", "RunnableConfig", "InjectedToolArg", "InjectedToolCallId", "InjectedState", "InjectedStore",
)


def is_injected(annotation: Any) -> bool:
    """LangChain's injected argument kinds: ToolRuntime, RunnableConfig, Annotated[..., InjectedToolArg]."""
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import InjectedToolArg

    if annotation is RunnableConfig:
        return True
    if subclass_of(annotation, (InjectedToolArg,)):
        return True
    try:
        from langgraph.prebuilt import ToolRuntime
    except ImportError:  # pragma: no cover - langchain-core without langgraph
        return False
    return subclass_of(annotation, (ToolRuntime,))


_FRAMEWORK = Framework(
    __name__, "@tool", context_names=lambda fn: context_params(fn, is_injected, _INJECTED_NAMES),
    get_context=lambda _arguments, _names: current_config(), fallback=thread_id, hint=HINT, refuse=refuse,
    told=noted_text,
)


def once(
    guard: Guard, *, task_id: Callable[[RunnableConfig], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for a LangChain tool function; place it under ``@tool``.

    The task id falls back to the LangGraph thread id, read from the running graph's config, so the tool
    needs no extra parameter.
    """
    return _FRAMEWORK.once(guard, task_id, options)


def __getattr__(name: str) -> Any:
    # Import LangChain only when these are asked for.
    if name == "ToolGuard":
        from ._langchain_middleware import ToolGuard

        return ToolGuard
    if name == "GuardToolException":
        return _exception_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GuardToolException", "ToolGuard", "ToolSpec", "once", "thread_id"]
