"""Google ADK (Agent Development Kit): a decorator placed on the tool function that ``LlmAgent(tools=[...])``
or ``FunctionTool(...)`` is given.

    @once(guard, key="order_id")                 # agentguard on the function
    async def charge(order_id: str, amount_cents: int, tool_context: ToolContext) -> dict: ...

    agent = LlmAgent(name="billing", model=model, tools=[charge])   # ADK wraps it in a FunctionTool

ADK has no tool decorator: it wraps the functions it is given in a ``FunctionTool``. :func:`once` given a
``FunctionTool`` (the guard put round the wrapper instead of the function) refuses with a ``TypeError``.

Task id: ``task_id=`` (a callable of the ``ToolContext``) → ``with agentguard.task(...)`` →
``tool_context.state["task_id"]`` → the ADK session id (``tool_context.session.id``: stable across the
invocations of one conversation and across a restart with a persistent session service) → refused. Never the
invocation id (a new one per user message: "did it go through? try again" is a new invocation) nor the
function call id. The fallbacks need the tool to declare a ``ToolContext`` parameter (ADK injects it; it is
never part of the fingerprint nor of the schema the model sees).

Refusals are returned as ``{"error": "<text>"}``, the dict ADK's own ``FunctionTool`` answers with when it
did not run a function (a missing argument, a rejected confirmation): the run goes on and the model reads
why nothing was executed. A tool that raises is not a refusal: ADK ends the run with the exception, and the
guard releases the claim (a retry runs with the same downstream key).

A replay is told to the model in ADK's response dict: a dict result is replayed with one more entry,
``"agentguard"``, holding the replay note (its own entries as they were stored); a string result (which ADK
sends as ``{"result": ...}``) starts with the note. Any other result is replayed as it is (a note would change
its type): return a dict, as ADK recommends. ``replay_note=False`` never tells.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack

from .._errors import GuardError
from .._extras import require
from .._guard import Guard
from ._common import (
    AdapterOptions,
    Framework,
    Replay,
    ToolSpec,
    context_params,
    noted_text,
    refusal_message,
    subclass_of,
)

require("google.adk", extra="google-adk", by=__name__)

if TYPE_CHECKING:
    from google.adk.tools.tool_context import ToolContext

P = ParamSpec("P")
R = TypeVar("R")

HINT = "the tool has no ToolContext parameter whose state or session gives one"
CONTEXT_NAME = "tool_context"  # ADK injects a parameter of this name even without an annotation


def session_task_id(tool_context: Any) -> Any:
    """``tool_context.state["task_id"]``, else the ADK session id, else None (no context)."""
    if tool_context is None:
        return None
    state = getattr(tool_context, "state", None)
    found = state.get("task_id") if state is not None else None
    if found is not None:
        return found
    session = getattr(tool_context, "session", None)
    return getattr(session, "id", None)


def _context_names(fn: Callable[..., Any]) -> Sequence[str]:
    from google.adk.agents.context import Context

    names = context_params(fn, lambda t: subclass_of(t, (Context,)), ["ToolContext", "Context"])
    if not names and CONTEXT_NAME in inspect.signature(fn).parameters:
        names = [CONTEXT_NAME]
    return names


def _get_context(arguments: Mapping[str, Any], names: Sequence[str]) -> Any:
    return arguments.get(names[0]) if names else None


def refuse(exc: GuardError) -> dict[str, str]:
    """A refusal as ADK's tool-error dict: ``{"error": text}``."""
    return {"error": refusal_message(exc)}


NOTE_ENTRY = "agentguard"
"""The entry of a replayed dict response that holds the replay note."""


def noted_response(value: Any, replay: Replay) -> Any:
    """A replayed dict response with the note in one more entry; a string after the note; else as it is."""
    if isinstance(value, dict):
        return value if NOTE_ENTRY in value else {**value, NOTE_ENTRY: replay.note}
    return noted_text(value, replay)


_FRAMEWORK = Framework(
    __name__, "FunctionTool(...)", context_names=_context_names, get_context=_get_context,
    fallback=session_task_id, hint=HINT, refuse=refuse, told=noted_response,
    call_id=lambda ctx, _tool: getattr(ctx, "function_call_id", None),
)


def once(
    guard: Guard, *, task_id: Callable[[ToolContext], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for an ADK tool function, given to ``LlmAgent(tools=[...])`` or ``FunctionTool(...)``.

    The ``ToolContext`` parameter is left out of the fingerprint; its state's ``task_id`` or its session id
    is the task id when no ``task(...)`` is around the run.
    """
    return _FRAMEWORK.once(guard, task_id, options)


__all__ = ["ToolSpec", "once", "session_task_id"]
