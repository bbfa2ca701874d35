"""OpenAI Agents SDK: a decorator placed *under* ``@function_tool``, and :func:`guard_tool` for a
``FunctionTool`` that already exists (built by someone else, or by ``function_tool(fn)``).

    @function_tool                                # the SDK on top
    @once(guard, key="order_id")                  # agentguard right above the function
    async def charge(ctx: RunContextWrapper[Ctx], order_id: str, amount_cents: int) -> dict: ...

    charge = guard_tool(function_tool(charge_fn), guard, key="order_id")

Task id: ``task_id=`` (a callable of the ``ToolContext``) → ``with agentguard.task(...)`` →
``ctx.context.task_id`` → refused. Never the trace id or the tool call id: both change on re-invocation.

Refusals are returned as the tool's output text, which is how the SDK reports tool errors to the model.
(Raising would reach the model only as the SDK's default "An error occurred while running the tool." — before
openai-agents 0.25, "... Please try again." — which hides the reason and invites a repeat of the call.)

A replayed string output is told to the model: the replay note, a blank line, then the stored text unchanged.
The SDK sends the model its tool's output and keeps that same object as the run item's ``output``, so there is
no other place for the note: any other output (a dict, a model) is replayed as it is, since a note would change
its type. Return a string (``json.dumps(...)``) to have replays told; ``replay_note=False`` never tells.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, Unpack

from .._errors import GuardError
from .._extras import require
from .._guard import Guard
from .._names import argument_names
from .._refusals import replay_note as note_for
from ._common import (
    AdapterOptions,
    Framework,
    Replay,
    ToolSpec,
    attribute_task_id,
    call_ids,
    check_spec,
    context_params,
    missing_task,
    noted_text,
    refusal_message,
    resolve_task,
    subclass_of,
)

require("agents", extra="openai-agents", by=__name__)

if TYPE_CHECKING:
    from agents import FunctionTool, RunContextWrapper
    from agents.tool_context import ToolContext

P = ParamSpec("P")
R = TypeVar("R")

_HINT = "ctx.context carries no task_id"


def _context_task_id(ctx: Any) -> Any:
    return attribute_task_id(getattr(ctx, "context", None))


def _context_names(fn: Callable[..., Any]) -> Sequence[str]:
    from agents import RunContextWrapper

    return context_params(fn, lambda t: subclass_of(t, (RunContextWrapper,)), ["RunContextWrapper", "ToolContext"])


_FRAMEWORK = Framework(
    __name__, "@function_tool", context_names=_context_names,
    get_context=lambda arguments, names: arguments.get(names[0]) if names else None,
    fallback=lambda ctx: _context_task_id(ctx), hint=_HINT, refuse=refusal_message, told=noted_text,
    # a ToolContext (a RunContextWrapper has no call) of this tool's call, not of a tool whose body calls it
    call_id=lambda ctx, tool: getattr(ctx, "tool_call_id", None) if getattr(ctx, "tool_name", None) == tool else None,
)


def once(
    guard: Guard, *, task_id: Callable[[RunContextWrapper[Any]], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for an Agents SDK tool function; place it under ``@function_tool``.

    A first parameter typed ``RunContextWrapper``/``ToolContext`` is left out of the fingerprint.
    """
    return _FRAMEWORK.once(guard, task_id, options)


def guard_tool(
    tool: FunctionTool,
    guard: Guard,
    *,
    key: Sequence[str] | str | None = None,
    returns: Any = Any,
    cache_errors: tuple[type[BaseException], ...] = (),
    ignore: Sequence[str] = (),
    task_id: Callable[[ToolContext[Any]], str] | None = None,
    scope: str | None = None,
    on_unknown: Literal["retry", "hold"] = "hold",
    replay_note: bool = True,
) -> FunctionTool:
    """A copy of ``tool`` whose ``on_invoke_tool`` is guarded; the original is left as it was.

    The raw JSON arguments are parsed and canonicalised (key order, ``1.0`` vs ``1``) before they are
    fingerprinted. Inside the tool, ``agentguard.current_key()`` is the downstream key. An exception of the
    tool releases the claim (a later call runs it again with the same downstream key) and reaches the model
    through the tool's ``failure_error_function``, as it would unguarded. ``on_unknown``: what a call does when
    the worker of an earlier one died inside the tool (``ToolSpec``): hold it for a person, or retry it with the
    same key where the tool forwards ``current_key()`` to the provider. A replayed string output starts with
    the replay note (``replay_note=False``: never).
    """
    from agents import FunctionTool
    from agents.tool import maybe_invoke_function_tool_failure_error_function

    if not isinstance(tool, FunctionTool):
        raise TypeError(f"guard_tool needs an agents.FunctionTool, got {type(tool).__name__}")
    if getattr(tool.on_invoke_tool, "__agentguard__", None) is not None:
        raise TypeError(f"the tool {tool.name!r} is already guarded")
    spec = ToolSpec(key=key, returns=returns, cache_errors=cache_errors, ignore=ignore, on_unknown=on_unknown)
    # A key field the tool does not take would key every call on null: refused here, before any call.
    check_spec(spec, tool.name, argument_names(tool.params_json_schema))
    original = tool.on_invoke_tool
    # The SDK's invoker turns the tool's exceptions into strings for the model; a string would be stored as
    # a success and replayed forever. Run the inner implementation so errors stay errors, and format them
    # with the tool's own failure function afterwards.
    raw: Callable[[ToolContext[Any], str], Any] = getattr(original, "_invoke_tool_impl", None) or original

    async def on_invoke_tool(ctx: ToolContext[Any], input: str) -> Any:
        try:
            args = json.loads(input) if input and input.strip() else {}
        except ValueError:
            args = None
        if not isinstance(args, Mapping):
            return f"agentguard: the arguments of `{tool.name}` are not a JSON object; the tool was not run."

        async def body(_key: str) -> Any:
            return await raw(ctx, input)

        audit = call_ids(getattr(ctx, "tool_call_id", None))
        try:
            info = resolve_task(
                tool.name, explicit=task_id, context=ctx, fallback=_context_task_id, scope=scope, hint=_HINT,
                on_missing=lambda: missing_task(guard, tool.name, audit),
            )
            outcome = await guard.run(
                tool.name, body, arguments=spec.fingerprinted(args), key=spec.key_values(args),
                task_id=info.task_id, scope=info.scope, returns=spec.returns, cache_errors=spec.cache_errors,
                audit=audit, on_unknown=spec.on_unknown,
            )
        except GuardError as exc:
            return refusal_message(exc)
        except Exception as exc:
            if raw is original:
                raise
            message = await maybe_invoke_function_tool_failure_error_function(
                function_tool=guarded, context=ctx, error=exc
            )
            if message is None:
                raise
            return message
        if outcome.replayed and replay_note:
            return noted_text(outcome.value, Replay(note_for(outcome.operation, outcome.task_id), tool.name, ctx))
        return outcome.value

    on_invoke_tool.__agentguard__ = spec  # type: ignore[attr-defined]
    guarded = copy.copy(tool)
    guarded.on_invoke_tool = on_invoke_tool
    return guarded


__all__ = ["ToolSpec", "guard_tool", "once"]
