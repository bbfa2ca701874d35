"""AG2 (formerly AutoGen, the ``ag2`` 1.x agents): a decorator placed *under* ``@tool``, and a middleware
that hands its refusals to the model as clean tool errors.

    @tool                                          # AG2 on top
    @once(guard, key="order_id")                   # agentguard right above the function
    async def charge(order_id: str, amount_cents: int, context: Context) -> dict: ...

    agent = Agent("billing", config=config, tools=[charge], middleware=[refusals()])
    await agent.ask("charge o-1", variables={"task_id": "ticket-8812"})

``@tool`` returns a ``FunctionTool``: :func:`once` placed on top of it refuses with a ``TypeError`` saying
which way round. Task id: ``task_id=`` (a callable of the AG2 ``Context``) → ``with agentguard.task(...)`` →
the context variable ``task_id`` (``agent.ask(..., variables={"task_id": ...})`` or ``Agent(variables=...)``;
it needs the tool to declare a ``Context`` parameter) → refused. Never the tool call id. The ``Context`` and
every injected parameter (``Inject``, ``Variable``, ``Depends``) stay out of the fingerprint.

Refusals: AG2 turns an exception raised by a tool into a tool error (``ToolErrorEvent``) whose text is the
formatted traceback. :func:`once` raises :class:`GuardToolError`, whose message is the refusal; the
:func:`refusals` middleware makes that message alone the tool error the model reads (no traceback). Without
the middleware the model still gets a tool error, with the refusal on its last line.

A replay is AG2's own tool result, ``ToolResult``, with the replay note as its first part (a text input the
model reads) and the stored value, unchanged, as the part after it (whatever its type: AG2 makes every result
a ``ToolResult``); its ``metadata`` marks the replay for the program. A ``ToolResult`` the tool returned itself
keeps its parts, after the note. ``replay_note=False`` replays the value alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar, Unpack

from .._errors import GuardError
from .._extras import require
from .._guard import Guard
from .._refusals import REPLAYED_MARK
from ._common import (
    AdapterOptions,
    Framework,
    Replay,
    ToolSpec,
    attribute_task_id,
    context_params,
    refusal_message,
    subclass_of,
)

require("ag2", extra="ag2", by=__name__)

if TYPE_CHECKING:
    from ag2 import Middleware
    from ag2.context import ConversationContext

P = ParamSpec("P")
R = TypeVar("R")

HINT = "the tool has no Context parameter whose variables hold a task_id"
_INJECTED_NAMES = ("Context", "ConversationContext", "Inject", "Variable", "Depends")


class GuardToolError(Exception):
    """agentguard did not run the tool: ``str(exc)`` is the text for the model, ``.error`` the GuardError."""

    def __init__(self, error: GuardError) -> None:
        super().__init__(refusal_message(error))
        self.error = error


def _is_injected(annotation: Any) -> bool:
    from ag2.context import ConversationContext
    from fast_depends.library import CustomField

    return subclass_of(annotation, (ConversationContext,)) or isinstance(annotation, CustomField)


def _context_names(fn: Callable[..., Any]) -> Sequence[str]:
    import inspect

    from fast_depends.dependencies import Dependant

    names = list(context_params(fn, _is_injected, _INJECTED_NAMES))
    for name, param in inspect.signature(fn).parameters.items():  # x = Depends(...) as a default
        if isinstance(param.default, Dependant) and name not in names:
            names.append(name)
    return names


def _get_context(arguments: Mapping[str, Any], names: Sequence[str]) -> Any:
    from ag2.context import ConversationContext

    for name in names:
        if isinstance(arguments.get(name), ConversationContext):
            return arguments[name]
    return None


def variables_task_id(context: Any) -> Any:
    """The AG2 context variable ``task_id``, else None."""
    return attribute_task_id(getattr(context, "variables", None))


def _refuse(exc: GuardError) -> NoReturn:
    raise GuardToolError(exc) from None


def noted_result(value: Any, replay: Replay) -> Any:
    """A replay as AG2's ``ToolResult``: the note as a first text part, then the value's parts, unchanged; the
    metadata marking it."""
    from ag2 import ToolResult
    from ag2.events import TextInput

    result = ToolResult.ensure_result(value)
    if result.final:  # the agent's final answer (one part), not a tool result the model reads: as it is
        return value
    return ToolResult(TextInput(replay.note), *result.parts, metadata={**result.metadata, REPLAYED_MARK: True})


_FRAMEWORK = Framework(
    __name__, "@tool", context_names=_context_names, get_context=_get_context, fallback=variables_task_id,
    hint=HINT, refuse=_refuse, told=noted_result, call_id=lambda ctx, _tool: getattr(ctx, "tool_call_id", None),
)


def once(
    guard: Guard, *, task_id: Callable[[ConversationContext], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for an AG2 tool function; place it under ``@tool``.

    The ``Context`` parameter and injected values are left out of the fingerprint; ``context.variables``'
    ``task_id`` is the task id when no ``task(...)`` is around the run.
    """
    return _FRAMEWORK.once(guard, task_id, options)


def refusals() -> Middleware:
    """An AG2 middleware (``Agent(middleware=[refusals()])``) under which a :class:`GuardToolError` reaches the
    model as a tool error carrying only the refusal's text. Other tool errors pass through untouched."""
    from ag2 import Middleware
    from ag2.events import ToolErrorEvent
    from ag2.events.tool_events import ToolResult
    from ag2.middleware import BaseMiddleware

    class GuardRefusals(BaseMiddleware):
        async def on_tool_execution(self, call_next: Any, event: Any, context: Any) -> Any:
            result = await call_next(event, context)
            if isinstance(result, ToolErrorEvent) and isinstance(result.error, GuardToolError):
                return ToolErrorEvent(
                    parent_id=result.parent_id, name=result.name, error=result.error,
                    result=ToolResult(str(result.error)),
                )
            return result

    return Middleware(GuardRefusals)


__all__ = ["GuardToolError", "ToolSpec", "once", "refusals", "variables_task_id"]
