"""CrewAI: a decorator placed *under* ``@tool``.

    @tool("charge")                                # CrewAI on top
    @once(guard, key="order_id")                   # agentguard right above the function
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str: ...

    with agentguard.task("ticket-8812"):
        crew.kickoff()                             # or kickoff_async(), akickoff(): each keeps the task

Task id: ``task_id=`` (a callable, given None: CrewAI passes a tool nothing but its arguments) → ``with
agentguard.task(...)`` around the kickoff → refused. CrewAI has no id a tool can reach that is stable across a
re-run of the same work: the running task's id (``crewai.context.get_current_task_id()``) and the crew's are
uuids made with the objects, so new after every restart (kept only by ``Crew.from_checkpoint``); the execution
id is new each kickoff; a flow's state id is new each run unless a persisted flow is resumed by that id; and
the kickoff's inputs never reach the tool. ``kickoff``, ``kickoff_async``, ``akickoff`` and a task with
``async_execution=True`` (run on a thread with a copy of the caller's context) all carry the task to the tool.
An executor that runs a tool without it (``akickoff`` under ``executor_class=CrewAgentExecutor``) gets a
refusal, never an unkeyed run: give such a tool ``task_id=``.

CrewAI's own safeguards are not enough for money: its tool cache and its "same input as last time" check
live in one executor's memory, so a new crew (a re-run after a timeout or a crash) or a concurrent one
charges again. The guard holds across crews, processes and restarts.

Refusals are returned as the tool's output, the observation the agent reads. (An exception would make
CrewAI call the tool again, up to its retry limit, and then tell the model "Moving on then".)

A replayed string output is told to the model: the observation starts with the replay note, then the stored
text. CrewAI sends any other output as its ``str``, which a note would turn into another type: it is replayed
as it is, so return a string to have replays told. ``replay_note=False`` never tells.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, Unpack

from .._extras import require
from .._guard import Guard
from ._common import AdapterOptions, Framework, ToolSpec, noted_text, refusal_message

require("crewai", extra="crewai", by=__name__)

P = ParamSpec("P")
R = TypeVar("R")

_HINT = "CrewAI gives a tool no stable id of its own (wrap crew.kickoff() in `with agentguard.task(...)`)"

_FRAMEWORK = Framework(
    __name__, "@tool", context_names=lambda _fn: (), get_context=lambda _arguments, _names: None,
    fallback=None, hint=_HINT, refuse=refusal_message, told=noted_text,
)


def once(
    guard: Guard, *, task_id: Callable[[Any], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for a CrewAI tool function; place it under ``@tool``. Refusals become the tool's output."""
    return _FRAMEWORK.once(guard, task_id, options)


__all__ = ["ToolSpec", "once"]
