"""LlamaIndex (agents and workflows): a decorator for the function you make a ``FunctionTool`` of.

    @once(guard, key="order_id")
    async def charge(ctx: Context, order_id: str, amount_cents: int, idempotency_key: str = "") -> dict: ...

    agent = FunctionAgent(tools=[FunctionTool.from_defaults(charge)], llm=llm, initial_state={"task_id": "t-1"})

``FunctionTool.from_defaults(fn)`` is a call, not a decorator on the function's definition; ``once`` given a
``FunctionTool`` (the two turned round) refuses with a ``TypeError`` that says which way round.

Task id: ``task_id=`` (a callable of the workflow ``Context``, or None when the tool takes none) → ``with
agentguard.task(...)`` → for an async tool that takes a ``ctx: Context``, the ``task_id`` in the agent's state
(``initial_state={"task_id": ...}``, read as ``await ctx.store.get("state")``) or else a ``task_id`` the
workflow put in its store (``await ctx.store.set("task_id", ...)``) → refused. The context's store is the
run's own record: it persists across runs that share the ``Context`` and is serialised with it
(``ctx.to_dict()``), so the id survives a restart; the run id (``handler.run_id``) is new each run, and never
used. The ``Context`` parameter never enters the fingerprint.

Refusals are raised as :class:`GuardToolError`: the agent turns a tool's exception into a ``ToolOutput`` with
``is_error=True`` whose content is the refusal text, which is how LlamaIndex reports a failed tool to the model.

A replay is told to the model in the ``ToolOutput``'s content: a string result starts with the replay note; a
list of content blocks gets a first ``TextBlock`` holding it. Any other result is replayed as it is (the
``ToolOutput``'s ``raw_output`` is the function's return value, which a note would change the type of).
``replay_note=False`` never tells.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar, Unpack

from .._errors import GuardError
from .._extras import require
from .._guard import Guard
from ._common import (
    AdapterOptions,
    Framework,
    Replay,
    ToolSpec,
    context_params,
    noted_blocks,
    refusal_message,
    subclass_of,
)

require("llama_index", "workflows", extra="llamaindex", by=__name__)

if TYPE_CHECKING:
    from workflows import Context

P = ParamSpec("P")
R = TypeVar("R")

_HINT = "the workflow context's store holds no task_id (initial_state={'task_id': ...} on the agent)"
_STORE_PATHS = ("state.task_id", "task_id")  # the agent's state, then the workflow's own store

# The id read from the context's store (an await) by the async wrapper, for the adapter's sync fallback.
_store_task: contextvars.ContextVar[Any] = contextvars.ContextVar("agentguard_llamaindex_task", default=None)


class GuardToolError(Exception):
    """agentguard did not run the tool; ``str(exc)`` is the text for the model, ``.error`` the GuardError."""

    def __init__(self, error: GuardError) -> None:
        super().__init__(refusal_message(error))
        self.error = error


def _refuse(exc: GuardError) -> NoReturn:
    raise GuardToolError(exc) from exc


def _is_context(annotation: Any) -> bool:
    from workflows import Context

    return subclass_of(annotation, (Context,))


def _context_names(fn: Callable[..., Any]) -> Sequence[str]:
    return context_params(fn, _is_context, ["Context"])


def noted_output(value: Any, replay: Replay) -> Any:
    """A replayed string after the note; a list of content blocks after a ``TextBlock`` holding it (LlamaIndex
    sends any other list as its ``str``: as it is)."""
    from llama_index.core.base.llms import types as blocks

    # (the blocks FunctionTool takes as they are: any other list is sent as its str)
    kinds = (blocks.TextBlock, blocks.ImageBlock, blocks.AudioBlock, blocks.CitableBlock, blocks.CitationBlock,
             blocks.DocumentBlock, blocks.VideoBlock)
    if isinstance(value, list) and not (value and all(isinstance(item, kinds) for item in value)):
        return value
    return noted_blocks(value, replay, lambda note: blocks.TextBlock(text=note))


_FRAMEWORK = Framework(
    __name__, "FunctionTool.from_defaults", context_names=_context_names,
    get_context=lambda arguments, names: arguments.get(names[0]) if names else None,
    fallback=lambda _ctx: _store_task.get(), hint=_HINT, refuse=_refuse, told=noted_output,
)


async def store_task_id(ctx: Any) -> Any:
    """The task id a workflow ``Context`` keeps in its store (the agent's state first), else None."""
    store = getattr(ctx, "store", None)
    if store is None:
        return None
    for path in _STORE_PATHS:
        try:
            found = await store.get(path, default=None)
        except Exception:  # a state that is not a mapping, a path the state model lacks
            found = None
        if found is not None:
            return found
    return None


def once(
    guard: Guard, *, task_id: Callable[[Context | None], str] | None = None, **options: Unpack[AdapterOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` for a function you make a LlamaIndex ``FunctionTool`` of; refusals raise
    :class:`GuardToolError`, which the agent reports to the model as a tool error."""
    inner = _FRAMEWORK.once(guard, task_id, options)

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        wrapped = inner(fn)
        names = _context_names(fn)
        if not names:
            return wrapped
        sig = _context_resolved(inspect.signature(wrapped), names)
        wrapped.__signature__ = sig  # type: ignore[attr-defined]
        if not inspect.iscoroutinefunction(wrapped):
            return wrapped
        call: Any = wrapped

        async def reading_the_store(*args: Any, **kwargs: Any) -> Any:
            try:
                ctx = sig.bind_partial(*args, **kwargs).arguments.get(names[0])
            except TypeError:
                ctx = None
            token = _store_task.set(await store_task_id(ctx))
            try:
                return await call(*args, **kwargs)
            finally:
                _store_task.reset(token)

        functools.update_wrapper(reading_the_store, wrapped)
        reading_the_store.__signature__ = sig  # type: ignore[attr-defined]
        out: Callable[P, R] = reading_the_store  # type: ignore[assignment]
        return out

    return decorate


def _context_resolved(sig: inspect.Signature, names: Sequence[str]) -> inspect.Signature:
    # LlamaIndex finds the context parameter by comparing its annotation with the class: a string annotation
    # (``from __future__ import annotations``) would hide it, and the tool would be called without one.
    from workflows import Context

    return sig.replace(parameters=[
        p.replace(annotation=Context) if name in names and isinstance(p.annotation, str) else p
        for name, p in sig.parameters.items()
    ])


__all__ = ["GuardToolError", "ToolSpec", "once", "store_task_id"]
