"""agno: a decorator placed *under* ``@tool`` (or on a plain function given to ``Agent(tools=[...])``).

    @tool                                          # agno on top (optional: a plain function works too)
    @once(guard, key="order_id")                   # agentguard right above the function
    def charge(run_context: RunContext, order_id: str, amount_cents: int, idempotency_key: str = "") -> dict: ...

    await agent.arun("charge o-1", session_state={"task_id": "ticket-8812"})

Task id: ``task_id=`` (a callable of agno's ``RunContext``) → ``with agentguard.task(...)`` → ``task_id`` in the
run's ``session_state`` (kept with the session in agno's database, so it survives a restart), then in its
``dependencies`` → refused. Neither the run id (a new uuid each run) nor the session id (a random uuid kept by
the ``Agent`` object when none is given, so a new one after a restart) is taken on its own; if your session
ids are your tickets, say so: ``once(guard, task_id=lambda rc: rc.session_id)``. The guard reads the run's
context only when the function takes ``run_context`` (agno injects it by that name); without it, use
``with agentguard.task(...)``. The parameters agno injects (``agent``, ``team``, ``run_context``, ``fc``, media)
never enter the fingerprint.

Refusals are raised as :class:`GuardToolError`, an ``agno.exceptions.AgentRunException``: agno reports the
text to the model as the tool's failed result (``tool_call_error``) and logs it at debug level only (any other
exception is logged with its traceback as a failure of the tool). agno's ``@tool`` decorator also logs every
exception of the function it wraps, a refusal included, at error level on the ``agno`` logger.

A replay is told to the model in the text agno sends it: a string result (or the content of agno's own
``ToolResult``) starts with the replay note. agno sends any other result as ``str(result)``, which a note would
turn into another type: it is replayed as it is, so return a string to have replays told. ``replay_note=False``
never tells.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar, Unpack

from .._errors import GuardError
from .._extras import require
from .._guard import Guard
from ._common import (
    AdapterOptions,
    Framework,
    Replay,
    ToolSpec,
    attribute_task_id,
    context_params,
    noted_text,
    refusal_message,
)

require("agno", extra="agno", by=__name__)

if TYPE_CHECKING:
    from agno.exceptions import AgentRunException
    from agno.run import RunContext

    class GuardToolError(AgentRunException):
        error: GuardError

P = ParamSpec("P")
R = TypeVar("R")

_HINT = "the run's session_state and dependencies hold no task_id"

# What agno passes a tool by parameter name (agno.tools.function.FunctionCall._build_entrypoint_args).
_INJECTED = frozenset({
    "agent", "team", "run_context", "fc", "_agno_agent", "_agno_team", "_agno_run_context",
    "images", "videos", "audios", "files",
})


def _context_names(fn: Callable[..., Any]) -> Sequence[str]:
    import inspect

    from agno.run import RunContext

    typed = set(context_params(fn, lambda t: isinstance(t, type) and issubclass(t, RunContext), ["RunContext"]))
    return [n for n in inspect.signature(fn).parameters if n in _INJECTED or n in typed]


def _run_context(arguments: Mapping[str, Any], names: Sequence[str]) -> Any:
    from agno.run import RunContext

    for name in ("run_context", "_agno_run_context", *names):
        if isinstance(arguments.get(name), RunContext):
            return arguments[name]
    return None


def run_task_id(run_context: Any) -> Any:
    """``task_id`` in a ``RunContext``'s ``session_state``, then in its ``dependencies``, else None."""
    if run_context is None:
        return None
    for holder in (getattr(run_context, "session_state", None), getattr(run_context, "dependencies", None)):
        found = attribute_task_id(holder) if isinstance(holder, Mapping) else None
        if found is not None:
            return found
    return None


_EXCEPTION: list[type[Exception]] = []


def _exception_class() -> type[Exception]:
    if not _EXCEPTION:
        from agno.exceptions import AgentRunException

        class GuardToolError(AgentRunException):
            """agentguard did not run the tool; ``str(exc)`` is the text for the model, ``.error`` the GuardError."""

            def __init__(self, error: GuardError) -> None:
                super().__init__(refusal_message(error))
                self.error = error

        GuardToolError.__module__ = __name__  # where users import it from
        _EXCEPTION.append(GuardToolError)
    return _EXCEPTION[0]


def _refuse(exc: GuardError) -> NoReturn:
    raise _exception_class()(exc) from exc


def noted_output(value: Any, replay: Replay) -> Any:
    """A replayed string, or agno ``ToolResult``'s content, after the note; anything else as it is."""
    from agno.tools.function import ToolResult

    if isinstance(value, ToolResult):
        return value.model_copy(update={"content": noted_text(value.content, replay)})
    return noted_text(value, replay)


_FRAMEWORK = Framework(
    __name__, "@tool", context_names=_context_names, get_context=_run_context, fallback=run_task_id, hint=_HINT,
    refuse=_refuse, told=noted_output,
)


def once(
    guard: Guard, *, task_id: Callable[[RunContext | None], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for an agno tool function; place it under ``@tool``. Refusals raise
    :class:`GuardToolError`, which agno hands the model as the tool's failed result."""
    return _FRAMEWORK.once(guard, task_id, options)


def __getattr__(name: str) -> Any:
    if name == "GuardToolError":  # made on first use: it subclasses agno's exception
        return _exception_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GuardToolError", "ToolSpec", "once", "run_task_id"]
