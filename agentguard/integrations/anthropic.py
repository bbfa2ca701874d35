"""The Anthropic SDK's tool runner (``client.beta.messages.tool_runner``): a decorator placed *under*
``@beta_tool`` / ``@beta_async_tool``.

    @beta_tool                                   # the Anthropic SDK on top
    @once(guard, key="order_id")                 # agentguard right above the function
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str: ...

    with agentguard.task("ticket-8812"):
        client.beta.messages.tool_runner(model=..., max_tokens=..., tools=[charge], messages=[...]).until_done()

``@beta_tool`` returns a tool object: :func:`once` placed on top of it refuses with a ``TypeError`` saying
which way round. The runner hands a tool only its validated input, with no context and no tool-use id, so the
task id is ``task_id=`` (a callable of nothing: ``lambda _: ...``, for an id from your own state) →
``with agentguard.task(...)`` around the runner → refused. It runs sync tools in the caller's thread and
copies the context into the threads it uses, so the ``task(...)`` around the loop reaches the tool.

Refusals are raised as the SDK's ``ToolError`` with the refusal text: the runner sends it back as a
``tool_result`` with ``is_error: true`` and that text alone (any other exception would reach the model as its
``repr``). The runner executes the tool-use blocks of one reply one after another, so a model's parallel
duplicate is replayed from the stored result.

A replay is told to the model in its ``tool_result``: a string result starts with the replay note, a list of
content blocks gets a first text block holding it; anything else is replayed as it is. ``replay_note=False``
never tells.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn, ParamSpec, TypeVar, Unpack

from .._errors import GuardError
from .._extras import require
from .._guard import Guard
from ._common import AdapterOptions, Framework, Replay, ToolSpec, noted_blocks, refusal_message

require("anthropic", extra="anthropic", by=__name__)

P = ParamSpec("P")
R = TypeVar("R")

HINT = "the Anthropic tool runner passes a tool no context to take one from"


def refuse(exc: GuardError) -> NoReturn:
    """A refusal as the SDK's ``ToolError``: an ``is_error`` tool result carrying only the refusal's text."""
    from anthropic.lib.tools import ToolError

    raise ToolError(refusal_message(exc)) from None


def noted_content(value: Any, replay: Replay) -> Any:
    """A replayed tool result after the note: a first paragraph of a string, a first text block of a list."""
    return noted_blocks(value, replay, lambda note: {"type": "text", "text": note})


_FRAMEWORK = Framework(
    __name__, "@beta_tool", context_names=lambda _fn: (), get_context=lambda _arguments, _names: None,
    fallback=None, hint=HINT, refuse=refuse, told=noted_content,
)


def once(
    guard: Guard, *, task_id: Callable[[None], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for a tool of the Anthropic tool runner; place it under ``@beta_tool``/``@beta_async_tool``.

    ``task_id``, if given, is called with ``None`` (the runner has no context to offer).
    """
    return _FRAMEWORK.once(guard, task_id, options)


__all__ = ["ToolSpec", "once"]
