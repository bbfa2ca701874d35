"""Strands Agents: a decorator placed *under* ``@tool``.

    @tool(context=True)                            # Strands on top
    @once(guard, key="order_id")                   # agentguard right above the function
    async def charge(order_id: str, amount_cents: int, tool_context: ToolContext, idempotency_key: str = "") -> dict:
        ...

    agent("charge o-1", invocation_state={"task_id": "ticket-8812"})

Task id: ``task_id=`` (a callable of the ``ToolContext``, or of the ``Agent`` for a tool that takes ``agent``) →
``with agentguard.task(...)`` → ``task_id`` in the invocation state (what the caller passed to ``agent(...)``),
then in the agent's state (``agent.state``, kept by a session manager), then the session manager's session id
(given by you and persisted, so stable across restarts) → refused. The guard reads these only when the
function takes the ``ToolContext`` (``@tool(context=True)``) or ``agent``; without either, use ``with
agentguard.task(...)`` around the call to the agent. Never the tool use id or a request id: both are new on
every call. The parameters Strands injects never enter the fingerprint.

Refusals are returned as a tool result with ``status: "error"`` whose text is the refusal, which is how
Strands reports a failed tool to the model (an exception would reach it prefixed with "Error: GuardError - ").

A replay is told to the model in its tool result: a string result starts with the replay note; a tool result
the tool made itself (``{"status": ..., "content": [...]}``) gets a first text block holding it. Strands sends
any other result as its JSON, which a note would turn into another type: it is replayed as it is, so return a
string or a tool result to have replays told. ``replay_note=False`` never tells.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack

from .._errors import GuardError
from .._extras import require
from .._guard import Guard
from ._common import AdapterOptions, Framework, Replay, ToolSpec, context_params, noted_text, refusal_message

require("strands", extra="strands", by=__name__)

if TYPE_CHECKING:
    from strands.types.tools import ToolContext

P = ParamSpec("P")
R = TypeVar("R")

_HINT = (
    "the invocation state and the agent's state hold no task_id, and the agent has no session manager "
    "(the tool needs @tool(context=True) and a tool_context parameter for the guard to read them)"
)


def _is_tool_context(annotation: Any) -> bool:
    from strands.types.tools import ToolContext

    return annotation is ToolContext or (isinstance(annotation, type) and issubclass(annotation, ToolContext))


def _context_names(fn: Callable[..., Any]) -> Sequence[str]:
    typed = set(context_params(fn, _is_tool_context, ["ToolContext"]))
    return [n for n in inspect.signature(fn).parameters if n in typed or n in ("agent", "tool_context")]


def _context(arguments: Mapping[str, Any], names: Sequence[str]) -> Any:
    for name in names:  # the ToolContext if the tool takes one, else the agent
        if hasattr(arguments.get(name), "invocation_state"):
            return arguments[name]
    for name in names:
        if arguments.get(name) is not None:
            return arguments[name]
    return None


def tool_use_id(context: Any, tool: str) -> Any:
    """The model's ``toolUseId`` of this call of ``tool``, from its ``ToolContext`` (an agent holds none)."""
    use = getattr(context, "tool_use", None)
    return use.get("toolUseId") if isinstance(use, Mapping) and use.get("name") == tool else None


def context_task_id(context: Any) -> Any:
    """The task id a ``ToolContext`` (or an ``Agent``) carries: ``task_id`` in the invocation state, in the
    agent's state, then the session manager's session id; else None."""
    if context is None:
        return None
    state = getattr(context, "invocation_state", None)
    if isinstance(state, Mapping) and state.get("task_id") is not None:
        return state["task_id"]
    agent = getattr(context, "agent", context)
    agent_state: Any = getattr(agent, "state", None)
    found = agent_state.get("task_id") if hasattr(agent_state, "get") else None
    if found is not None:
        return found
    return getattr(getattr(agent, "_session_manager", None), "session_id", None)


def refusal_result(exc: GuardError) -> dict[str, Any]:
    """A Strands tool result with ``status: "error"`` (Strands adds the ``toolUseId``)."""
    return {"status": "error", "content": [{"text": refusal_message(exc)}]}


def noted_result(value: Any, replay: Replay) -> Any:
    """A replayed string after the note; a Strands tool result with a first text block holding it."""
    if isinstance(value, dict) and "status" in value and isinstance(value.get("content"), list):
        return {**value, "content": [{"text": replay.note}, *value["content"]]}
    return noted_text(value, replay)


_FRAMEWORK = Framework(
    __name__, "@tool", context_names=_context_names, get_context=_context, fallback=context_task_id, hint=_HINT,
    refuse=refusal_result, told=noted_result, call_id=lambda ctx, tool: tool_use_id(ctx, tool),
)


def once(
    guard: Guard, *, task_id: Callable[[ToolContext[Any] | Any], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for a Strands tool function; place it under ``@tool``. Refusals are returned as error
    tool results."""
    return _FRAMEWORK.once(guard, task_id, options)


__all__ = ["ToolSpec", "context_task_id", "once", "refusal_result"]
