"""pydantic-ai: a decorator placed *under* ``@agent.tool`` / ``@agent.tool_plain``, and a capability that
guards named tools of an agent without touching their functions.

    @agent.tool                                  # pydantic-ai on top
    @once(guard, key="order_id")                 # agentguard right above the function
    async def charge(ctx: RunContext[Deps], order_id: str, amount_cents: int) -> Receipt: ...

    agent = Agent(model, deps_type=Deps, capabilities=[GuardTools(guard, {"charge": "order_id"})])

Order matters and pydantic-ai cannot tell you: ``@agent.tool`` registers the function it is given and
returns it unchanged, so a guard placed *above* it would wrap only the module-level name and the agent would
run the unguarded function. :func:`once` finds the agent's ``Tool`` holding the function and refuses with a
``TypeError`` (the plain ``guard.once`` does not look). Put the guard underneath, or use :class:`GuardTools`.

Task id: ``task_id=`` (a callable of the ``RunContext``) → ``with agentguard.task(...)`` → ``ctx.deps.task_id``
→ refused. Refusals are raised as pydantic-ai's ``ToolFailed``: the model sees the message as a failed tool
result, without retry instructions and without consuming the tool's retry budget.

A replay reaches the agent as pydantic-ai's ``ToolReturn``: the stored value, unchanged, is the tool's return
(``ToolReturnPart.content``), the replay note goes to the model beside it (``ToolReturn.content``, a user part
of the same request) and ``ToolReturnPart.metadata`` marks it for the program (``{"dev.agentguard/replayed":
True}``). The decorator does so when the agent runs the tool under the function's own name; called by your own
code, the guarded function returns the value as it is. ``replay_note=False`` (or ``GuardTools(...,
replay_note=False)``) returns the bare value.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack

from .._extras import require
from .._guard import Guard
from ._common import (
    AdapterOptions,
    Framework,
    ToolSpec,
    context_params,
    subclass_of,
)
from ._pydantic_ai_run import HINT, call_id, deps_task_id, refuse, told_in_run

require("pydantic_ai", extra="pydantic-ai", by=__name__)

if TYPE_CHECKING:
    from pydantic_ai import RunContext

    from ._pydantic_ai_capability import GuardTools

P = ParamSpec("P")
R = TypeVar("R")

def _run_context(arguments: Mapping[str, Any], names: Sequence[str]) -> Any:
    if names and names[0] in arguments:
        return arguments[names[0]]
    # A tool_plain has no ctx parameter; pydantic-ai still keeps the run's context in a contextvar.
    try:
        from pydantic_ai._run_context import get_current_run_context
    except ImportError:  # pragma: no cover - a pydantic-ai without it
        return None
    return get_current_run_context()


def registered_tool(fn: Any) -> str | None:
    """What holds ``fn`` as a pydantic-ai tool already, else None.

    ``@agent.tool`` / ``@agent.tool_plain`` (and ``Agent(tools=[fn])``, ``@toolset.tool``) keep the function
    in a ``Tool`` and return it unchanged: a guard put on top afterwards wraps only the module-level name, and
    the agent runs the bare function. Nothing on the function says so; the objects referring to it do. That
    search walks the process's objects once per decoration (tens of milliseconds in a large process, at
    import time), and once more only after a hit.
    """
    from pydantic_ai import Tool

    def holders() -> list[str]:
        names = []
        for ref in gc.get_referrers(fn):
            if isinstance(ref, Tool) and ref.function is fn:
                names.append(ref.name)
            elif isinstance(ref, dict) and ref.get("function") is fn and "takes_ctx" in ref:  # a Tool's __dict__
                names.append(str(ref.get("name")))
        return names

    if not holders():
        return None
    gc.collect()  # the Tool of an agent that is gone, but not collected yet, registers nothing
    names = holders()
    if not names:
        return None
    return (
        f"a function that a pydantic-ai agent or toolset already holds, unguarded, as its tool {names[0]!r} "
        "(@agent.tool and @agent.tool_plain return the function unchanged, so the agent would run it without "
        "the guard; if the agent guards it with GuardTools, do not also put once on it)"
    )


def _context_names(fn: Callable[..., Any]) -> Sequence[str]:
    from pydantic_ai import RunContext

    return context_params(fn, lambda t: subclass_of(t, (RunContext,)), ["RunContext"])


_FRAMEWORK = Framework(
    __name__, "@agent.tool", context_names=_context_names, get_context=lambda a, names: _run_context(a, names),
    fallback=deps_task_id, hint=HINT, refuse=refuse, registered=lambda fn: registered_tool(fn), told=told_in_run,
    call_id=call_id,
)


def once(
    guard: Guard, *, task_id: Callable[[RunContext[Any]], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for a pydantic-ai tool function; place it under ``@agent.tool``/``@agent.tool_plain``.

    The ``RunContext`` parameter is left out of the fingerprint; only the model's validated arguments count. A
    replay in the agent's run is a ``ToolReturn`` that tells the model (``replay_note=False``: the bare value).
    """
    return _FRAMEWORK.once(guard, task_id, options)


def __getattr__(name: str) -> Any:
    # GuardTools subclasses pydantic-ai's AbstractCapability: import the framework only when it is asked for.
    if name == "GuardTools":
        from ._pydantic_ai_capability import GuardTools

        return GuardTools
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GuardTools", "ToolSpec", "once"]
