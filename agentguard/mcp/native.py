"""Guarded tools on a native ``MCPServer``: ``Guard.once`` plus the MCP plumbing.

    server = MCPServer("payments")
    guard = Guard()

    @guarded_tool(server, guard, key=["order_id"])
    async def create_charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> Charge:
        return await provider.charge(order_id, amount_cents, idempotency_key=idempotency_key)

``guarded_tool`` applies ``guard.once`` with the options given (``key``, ``ignore``, ``cache_errors``,
``inject``, ``key_shape``, ``operation``) and registers the tool, listed with ``idempotentHint: true`` (the
``annotations`` given are kept otherwise). The tool schema gains a required ``task_id`` argument and never
shows the injected key (a value sent for it anyway is dropped: the tool gets the guard's key). The task id
comes from that argument if it is sent, else ``_meta["dev.agentguard/task_id"]``, else ``$AGENTGUARD_TASK_ID``;
a value that is present but not a usable task id (a number, a list, ``""``) is refused, never replaced by the
next source; without one the call is refused. A replay carries
``_meta["dev.agentguard/replayed"] = true`` and a leading text line saying it is a replay. Refusals are tool
errors whose text says that nothing was executed.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, ParamSpec, TypeVar

import mcp_types as types
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.func_metadata import func_metadata
from pydantic import Field, PlainValidator

from .._context import DEFAULT_SCOPE, current_key, task
from .._errors import GuardError, MissingTaskError
from .._guard import Guard
from .._refusals import refusal, replay_note
from .._shapes import Shape
from ._meta import ABSENT, META_KEY, META_REPLAYED, TASK_ID_DESCRIPTION, TASK_ID_FIX, resolve_task_id

P = ParamSpec("P")
R = TypeVar("R")

# One list per tool call: the body appends the downstream key when it really runs (absent: a replay).
_RAN: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("agentguard_mcp_ran", default=None)


def _is_context(annotation: Any) -> bool:
    if inspect.isclass(annotation):
        return issubclass(annotation, Context)
    return any(_is_context(a) for a in typing.get_args(annotation))


def _as_sent(value: object) -> object:
    return value


# The tool's ``task_id`` parameter: advertised as a string, but validated by agentguard's one rule, not by
# pydantic (a number or a list is refused with that rule's message, and saying nothing was executed), and
# absent when not sent (``ABSENT``, no default in the schema), so that only an absent argument falls back to
# ``_meta`` and the environment. Annotated ``str``: MCPServer then passes a string such as "[1]" as sent.
_TaskIdParam = Annotated[
    str,
    PlainValidator(_as_sent, json_schema_input_type=str),
    Field(default_factory=lambda: ABSENT, description=TASK_ID_DESCRIPTION),
]


def guarded_tool(
    server: MCPServer,
    guard: Guard,
    *,
    key: Sequence[str] | str | Callable[[Mapping[str, Any]], str] | None = None,
    ignore: Sequence[str] = (),
    cache_errors: tuple[type[BaseException], ...] = (),
    inject: str | None = "idempotency_key",
    key_shape: Shape = None,
    operation: str | None = None,
    scope: str = DEFAULT_SCOPE,
    name: str | None = None,
    title: str | None = None,
    description: str | None = None,
    annotations: types.ToolAnnotations | None = None,
    structured_output: bool | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Register ``fn`` on ``server`` as a tool guarded by ``guard.once(...)``; returns the guarded function.

    A parameter annotated ``Context`` still receives the request context (and is not fingerprinted).
    """

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        tool_name: str = name or str(getattr(fn, "__name__", "tool"))
        sig = inspect.signature(fn)
        if "task_id" in sig.parameters:
            raise TypeError(f"{tool_name}: `task_id` is added by guarded_tool; rename the parameter")
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
            raise TypeError(f"{tool_name}: an MCP tool cannot take *args or **kwargs")
        hints = typing.get_type_hints(fn, include_extras=True)
        ctx_param = next((n for n, a in hints.items() if n != "return" and _is_context(a)), None)
        is_async = inspect.iscoroutinefunction(fn)

        def _mark() -> None:
            ran = _RAN.get()
            if ran is not None:
                ran.append(current_key())

        if is_async:

            @functools.wraps(fn)
            async def marked_async(*args: Any, **kwargs: Any) -> Any:
                _mark()
                return await fn(*args, **kwargs)  # type: ignore[misc]

            marked: Callable[..., Any] = marked_async
        else:

            @functools.wraps(fn)
            def marked_sync(*args: Any, **kwargs: Any) -> Any:
                _mark()
                return fn(*args, **kwargs)

            marked = marked_sync

        ignored = (*ignore, ctx_param) if ctx_param else tuple(ignore)
        guarded: Callable[..., Any] = guard.once(
            operation=operation or tool_name, key=key, ignore=ignored, cache_errors=cache_errors, inject=inject,
            key_shape=key_shape,
        )(marked)

        public = inspect.signature(guarded)
        ctx_name = ctx_param or "ctx"
        if ctx_param is None and "ctx" in public.parameters:
            ctx_name = "agentguard_context"
        # Resolved annotations: string ones (``from __future__ import annotations``) would be looked up in
        # this module's globals by MCPServer, not in the tool's.
        params = [p.replace(annotation=hints.get(n, p.annotation)) for n, p in public.parameters.items()
                  if n != ctx_param]
        params.append(inspect.Parameter("task_id", inspect.Parameter.KEYWORD_ONLY, annotation=_TaskIdParam))
        params.append(inspect.Parameter(ctx_name, inspect.Parameter.KEYWORD_ONLY, annotation=Context))
        tool_sig = public.replace(parameters=params, return_annotation=hints.get("return", public.empty))
        tool_annotations = {n: hints[n] for n in public.parameters if n in hints and n != ctx_param}
        tool_annotations.update(task_id=params[-2].annotation, **{ctx_name: Context})
        if "return" in hints:
            tool_annotations["return"] = hints["return"]

        def prepare(kwargs: dict[str, Any]) -> tuple[str, Context, list[str]]:
            ctx: Context = kwargs.pop(ctx_name)
            meta = ctx.request_context.meta if _has_request(ctx) else None
            try:
                task_id = resolve_task_id(tool_name, kwargs.pop("task_id", ABSENT), meta, os.environ)
            except MissingTaskError as exc:
                raise ToolError(refusal(exc, fix=TASK_ID_FIX)) from None
            if ctx_param is not None:
                kwargs[ctx_param] = ctx
            return task_id, ctx, []

        def finish(value: Any, task_id: str, ran: list[str]) -> types.CallToolResult:
            result = metadata.convert_result(value)
            assert isinstance(result, types.CallToolResult)
            meta = dict(result.meta or {})
            meta[META_REPLAYED] = not ran
            if ran:
                meta[META_KEY] = ran[0]
                return result.model_copy(update={"meta": meta})
            op = tool_name if key is None else f"{operation or tool_name} (same key fields)"
            note = types.TextContent(type="text", text=replay_note(op, task_id))
            return result.model_copy(update={"meta": meta, "content": [note, *result.content]})

        if is_async:

            async def tool_async(*args: Any, **kwargs: Any) -> Any:
                task_id, _ctx, ran = prepare(kwargs)
                token = _RAN.set(ran)
                try:
                    with task(task_id, scope=scope):
                        value = await guarded(*args, **kwargs)
                except GuardError as exc:
                    raise ToolError(refusal(exc, ran=bool(ran))) from None
                finally:
                    _RAN.reset(token)
                return finish(value, task_id, ran)

            tool_fn: Callable[..., Any] = tool_async
        else:

            def tool_sync(*args: Any, **kwargs: Any) -> Any:
                task_id, _ctx, ran = prepare(kwargs)
                token = _RAN.set(ran)
                try:
                    with task(task_id, scope=scope):
                        value = guarded(*args, **kwargs)
                except GuardError as exc:
                    raise ToolError(refusal(exc, ran=bool(ran))) from None
                finally:
                    _RAN.reset(token)
                return finish(value, task_id, ran)

            tool_fn = tool_sync

        tool_fn.__name__ = tool_name
        tool_fn.__qualname__ = getattr(fn, "__qualname__", tool_name)
        tool_fn.__module__ = getattr(fn, "__module__", __name__)
        tool_fn.__doc__ = fn.__doc__
        tool_fn.__signature__ = tool_sig  # type: ignore[attr-defined]
        tool_fn.__annotations__ = tool_annotations
        metadata = func_metadata(tool_fn, skip_names=[ctx_name], structured_output=structured_output)

        # Safe to repeat, and the model is told so; the other hints are the caller's (destructiveHint first).
        idempotent = (annotations or types.ToolAnnotations()).model_copy(update={"idempotent_hint": True})
        server.add_tool(tool_fn, name=tool_name, title=title, description=description, annotations=idempotent,
                        structured_output=structured_output)
        _require_task_id(server, tool_name)
        return typing.cast(Callable[P, R], guarded)

    return decorate


def _has_request(ctx: Context) -> bool:
    try:
        ctx.request_context  # noqa: B018 - raises outside a request
    except ValueError:
        return False
    return True


def _require_task_id(server: MCPServer, tool_name: str) -> None:
    # The schema says "required" so models always send it, while validation accepts its absence so that
    # programmatic callers may send _meta or rely on the environment instead. MCPServer builds the schema
    # from the signature only, so the registered tool's schema is amended here.
    manager = getattr(server, "_tool_manager", None)
    tool = manager.get_tool(tool_name) if manager is not None else None
    if tool is None:
        return
    required = list(tool.parameters.get("required", []))
    if "task_id" not in required:
        tool.parameters["required"] = [*required, "task_id"]
