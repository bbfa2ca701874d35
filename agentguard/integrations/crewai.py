"""CrewAI: a decorator placed *under* ``@tool``.

    @tool("charge")                                # CrewAI on top
    @once(guard, key="order_id")                   # agentguard right above the function
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str: ...

    with agentguard.task("ticket-8812"):
        crew.kickoff()                             # or: await crew.kickoff_async(), which keeps the task

Task id: ``task_id=`` (a callable, given None: CrewAI passes a tool nothing but its arguments) → ``with
agentguard.task(...)`` around the kickoff → refused. CrewAI has no stable id a tool can reach: a ``Crew``'s
and a ``Task``'s ``id`` are new uuids each time the objects are made (so after every restart), and the
kickoff's inputs never reach the tool. ``kickoff`` and ``kickoff_async`` run tools with the caller's context,
so the task reaches them; a task with ``async_execution=True`` runs on a thread of its own that does not
carry it, and there the guard refuses rather than run unkeyed (give such a tool ``task_id=``).

CrewAI's own safeguards are not enough for money: its tool cache and its "same input as last time" check
live in one executor's memory, so a new crew (a re-run after a timeout or a crash) or a concurrent one
charges again. The guard holds across crews, processes and restarts.

Refusals are returned as the tool's output, the observation the agent reads. (An exception would make
CrewAI call the tool again, up to its retry limit, and then tell the model "Moving on then".)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, Unpack

from .._extras import require
from .._guard import Guard
from ._common import AdapterOptions, Framework, ToolSpec, refusal_message

require("crewai", extra="crewai", by=__name__)

P = ParamSpec("P")
R = TypeVar("R")

_HINT = "CrewAI gives a tool no stable id of its own (wrap crew.kickoff() in `with agentguard.task(...)`)"

_FRAMEWORK = Framework(
    __name__, "@tool", context_names=lambda _fn: (), get_context=lambda _arguments, _names: None,
    fallback=None, hint=_HINT, refuse=refusal_message,
)


def once(
    guard: Guard, *, task_id: Callable[[Any], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for a CrewAI tool function; place it under ``@tool``. Refusals become the tool's output."""
    return _FRAMEWORK.once(guard, task_id, options)


__all__ = ["ToolSpec", "once"]
