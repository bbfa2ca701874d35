"""The Claude Agent SDK's in-process MCP tools: a decorator placed *under* ``@tool(...)``, on the handler.

    @tool("charge", "Charge an order", {"order_id": str, "amount_cents": int})   # the SDK on top
    @once(guard, key="order_id")                                                 # agentguard on the handler
    async def charge(args: dict) -> dict:
        receipt = await psp.charge(args["order_id"], args["amount_cents"], idempotency_key=current_key())
        return {"content": [{"type": "text", "text": receipt}]}

    server = create_sdk_mcp_server("payments", tools=[charge])
    with agentguard.task("ticket-8812"):
        async for message in query(prompt=..., options=ClaudeAgentOptions(mcp_servers={"payments": server})): ...

``@tool`` returns an ``SdkMcpTool``: :func:`once` placed on top of it refuses with a ``TypeError`` saying
which way round. The handler receives the model's arguments as one dict (validated by the SDK against the
tool's schema): they are the fingerprint, and ``key`` names the entries that tell operations apart. The
downstream key is ``agentguard.current_key()`` inside the handler.

Task id: ``task_id=`` (a callable of the arguments dict: ``lambda args: args["task_id"]`` for a tool that asks
the model for it, as the MCP proxy does) → ``with agentguard.task(...)`` around ``query()`` or the
``ClaudeSDKClient`` (the SDK calls handlers from tasks started inside it, which keep its context) → refused.
The handler gets no session id, and none that would survive a resume is given to it.

Results follow the SDK's tool convention (and the MCP proxy's): a replay is the stored result with a leading
text block saying it is a replay and that nothing was executed again; a refusal is
``{"content": [{"type": "text", "text": <refusal>}], "is_error": True}``. An exception of the handler releases
the claim (a retry runs it again with the same downstream key) and reaches the model as the SDK reports it.
"""

from __future__ import annotations

import functools
import gc
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from .._context import MAX_SCOPE, check_id
from .._errors import GuardError
from .._extras import require
from .._guard import Guard
from .._names import argument_names
from .._refusals import replay_note as note_for
from ._common import ToolSpec, check_function, check_spec, refusal_message, resolve_task

require("claude_agent_sdk", extra="claude-agent-sdk", by=__name__)

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
HINT = "the Claude Agent SDK passes a tool handler only its arguments"


def refusal_result(exc: GuardError) -> dict[str, Any]:
    """A refusal as the SDK's tool error: an ``is_error`` result carrying the refusal's text."""
    return {"content": [{"type": "text", "text": refusal_message(exc)}], "is_error": True}


def replay_result(stored: Mapping[str, Any], operation: str, task_id: str) -> dict[str, Any]:
    """The stored result, after a text block saying it is a replay (the MCP proxy's words)."""
    note = {"type": "text", "text": note_for(operation, task_id)}
    return {**stored, "content": [note, *stored.get("content", [])]}


def schema_arguments(input_schema: Any) -> list[str]:
    """The arguments an ``SdkMcpTool``'s ``input_schema`` declares, in each of the SDK's three forms: a JSON
    schema, a dict of names to types, a ``TypedDict``."""
    if isinstance(input_schema, Mapping):
        if isinstance(input_schema.get("type"), str) and "properties" in input_schema:
            return argument_names(input_schema)
        return [str(n) for n in input_schema]
    if typing.is_typeddict(input_schema):
        return list(typing.get_type_hints(input_schema))
    return []


def holding_tools(handler: Handler) -> list[tuple[str, Any]]:
    """``(name, input_schema)`` of each ``SdkMcpTool`` holding ``handler``.

    ``@tool(...)`` sits on top of the guard, so the guard never sees the schema it is given: the tool object
    refers to the handler, and is found among the handler's referrers (one search of the process's objects,
    on the handler's first call).
    """
    from claude_agent_sdk import SdkMcpTool

    found = []
    for ref in gc.get_referrers(handler):
        if isinstance(ref, SdkMcpTool) and ref.handler is handler:
            found.append((ref.name, ref.input_schema))
        elif isinstance(ref, dict) and ref.get("handler") is handler and "input_schema" in ref:  # its __dict__
            found.append((str(ref.get("name")), ref["input_schema"]))
    return found


def once(
    guard: Guard,
    *,
    key: Sequence[str] | str | None = None,
    task_id: Callable[[Mapping[str, Any]], str] | None = None,
    operation: str | None = None,
    ignore: Sequence[str] = (),
    cache_errors: tuple[type[BaseException], ...] = (),
    scope: str | None = None,
    on_unknown: Literal["retry", "hold"] = "hold",
    replay_note: bool = True,
) -> Callable[[Handler], Handler]:
    """``guard.run`` around a Claude Agent SDK tool handler (``async def handler(args: dict) -> dict``); place it
    under ``@tool(...)``. ``operation`` defaults to the handler's name; ``key`` and ``ignore`` name entries of
    the arguments dict; ``on_unknown`` as for ``ToolSpec`` (a worker that died inside the handler);
    ``replay_note=False`` replays the stored result without the leading text block that tells the model."""
    spec = ToolSpec(key=key, cache_errors=cache_errors, ignore=(ignore,) if isinstance(ignore, str) else ignore,
                    on_unknown=on_unknown)
    if scope is not None:
        check_id(scope, "scope", MAX_SCOPE)

    def decorate(handler: Handler) -> Handler:
        check_function(handler, adapter=__name__, decorator='@tool("charge", ...)')
        if not inspect.iscoroutinefunction(handler):
            raise TypeError(f"{__name__}.once(...) needs an async handler (the SDK awaits it), got a plain function")
        name = operation or handler.__name__
        checked: list[bool] = []

        @functools.wraps(handler)
        async def guarded(args: dict[str, Any]) -> dict[str, Any]:
            if not checked:
                # The first call, before the handler runs: a key or ignored field the tool's schema lacks
                # would key every call on null. Raised, the SDK hands the model a tool error; nothing ran.
                for tool_name, schema in holding_tools(guarded):
                    check_spec(spec, tool_name, schema_arguments(schema))
                checked.append(True)

            async def body(_key: str) -> dict[str, Any]:
                return await handler(args)

            try:
                info = resolve_task(name, explicit=task_id, context=args, fallback=None, scope=scope, hint=HINT)
                outcome = await guard.run(
                    name, body, arguments=spec.fingerprinted(args), key=spec.key_values(args),
                    task_id=info.task_id, scope=info.scope, cache_errors=spec.cache_errors, on_unknown=spec.on_unknown,
                )
            except GuardError as exc:
                return refusal_result(exc)
            if outcome.replayed and replay_note:
                return replay_result(outcome.value, outcome.operation, outcome.task_id)
            return outcome.value

        return guarded

    return decorate


__all__ = ["ToolSpec", "once"]
