"""smolagents: :func:`guard_tool` for a ``Tool`` (made by ``@tool`` or a ``Tool`` subclass), and :func:`once`
for the function you hand to ``tool(...)``.

    @tool                                          # smolagents, as usual
    def charge(order_id: str, amount_cents: int) -> dict: ...

    charge = guard_tool(charge, guard, key="order_id")        # a guarded copy; the tool reads current_key()
    charge = tool(once(guard, key="order_id")(charge_fn))     # or: guard the plain function, then make the tool

smolagents warns about any decorator stacked under ``@tool`` (its remote executors re-create a tool from its
source), hence the call forms above rather than two decorator lines. ``once`` placed on top of ``@tool``
(on the ``Tool`` object) refuses with a ``TypeError`` that says which way round.

Task id: ``task_id=`` (a callable, given None: smolagents passes a tool no context) → ``with
agentguard.task(...)`` around ``agent.run(...)`` → refused. smolagents has no stable id of its own to fall back
on (a run's memory and step numbers start again with every run); parallel tool calls run on worker threads
that copy the caller's context, so the task reaches them.

Refusals are returned as the tool's output, which is the observation the model reads. (Raising would reach
the model as "Error executing tool ... Please try again or use another tool": an invitation to repeat.)

A replayed string output is told to the model: the observation starts with the replay note, then the stored
text. Any other output (a dict, a number, an image) is replayed as it is: a note would change its type, which a
``CodeAgent``'s code goes on to use. ``replay_note=False`` never tells.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack

from .._extras import require
from .._guard import Guard
from ._common import AdapterOptions, Framework, ToolSpec, adapt, noted_text, refusal_message

require("smolagents", extra="smolagents", by=__name__)

if TYPE_CHECKING:
    from smolagents import Tool

P = ParamSpec("P")
R = TypeVar("R")

_HINT = "smolagents gives a tool no stable id of its own (wrap agent.run(...) in `with agentguard.task(...)`)"

_FRAMEWORK = Framework(
    __name__, "tool(...)", context_names=lambda _fn: (), get_context=lambda _arguments, _names: None,
    fallback=None, hint=_HINT, refuse=refusal_message, told=noted_text,
)


def once(
    guard: Guard, *, task_id: Callable[[None], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for a function that ``smolagents.tool(...)`` then makes a tool of; refusals become the
    tool's output text."""
    return _FRAMEWORK.once(guard, task_id, options)


def guard_tool(
    tool: Tool,
    guard: Guard,
    *,
    key: Sequence[str] | str | None = None,
    ignore: Sequence[str] = (),
    cache_errors: tuple[type[BaseException], ...] = (),
    task_id: Callable[[None], str] | None = None,
    scope: str | None = None,
    replay_note: bool = True,
) -> Tool:
    """A copy of ``tool`` whose ``forward`` is guarded; the original is left as it was.

    The operation is the tool's name. Inside ``forward``, ``agentguard.current_key()`` is the downstream key.
    An exception of the tool releases the claim and reaches the model as smolagents reports it. A replayed
    string output starts with the replay note (``replay_note=False``: never).
    """
    from smolagents import Tool

    if not isinstance(tool, Tool):
        raise TypeError(f"guard_tool needs a smolagents.Tool, got {type(tool).__name__}")
    if getattr(tool.forward, "__agentguard__", None) is not None:
        raise TypeError(f"the tool {tool.name!r} is already guarded")
    forward = tool.forward  # a @tool's function (a staticmethod), or a Tool subclass's bound method
    if "self" in inspect.signature(forward).parameters:  # @tool states its forward's signature with self
        original = forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **kwargs)

        forward.__signature__ = _without_self(original)  # type: ignore[attr-defined]
    guarded = copy.copy(tool)
    guarded.forward = adapt(
        guard, forward, task_id=task_id, context_names=(), get_context=lambda _arguments: None, fallback=None,
        hint=_HINT, refuse=refusal_message, told=noted_text, operation=tool.name, key=key, ignore=ignore,
        cache_errors=cache_errors, inject=None, scope=scope, replay_note=replay_note,
    )
    return guarded


def _without_self(fn: Callable[..., Any]) -> inspect.Signature:
    sig = inspect.signature(fn)
    return sig.replace(parameters=[p for name, p in sig.parameters.items() if name != "self"])


__all__ = ["ToolSpec", "guard_tool", "once"]
