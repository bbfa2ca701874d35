"""The pydantic-ai capability (imports pydantic-ai; reached through ``agentguard.integrations.pydantic_ai``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import WrapToolExecuteHandler
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import ToolDefinition

from .._errors import GuardError
from .._guard import Guard
from .._names import argument_names
from .._refusals import replay_note as note_for
from ._common import (
    ToolsArg,
    ToolSpec,
    call_ids,
    check_spec,
    check_specs,
    missing_task,
    resolve_task,
    tool_specs,
)
from ._pydantic_ai_run import HINT, deps_task_id, noted_return, refuse


class GuardTools(AbstractCapability[Any]):
    """A pydantic-ai capability that guards the named tools of an agent (``wrap_tool_execute``).

    ``tools``: ``["charge"]``, ``{"charge": "order_id"}`` or ``{"charge": ToolSpec(key=..., returns=...)}``.
    The arguments are the ones pydantic-ai validated; the ``RunContext`` never enters the fingerprint.
    Inside the tool, ``agentguard.current_key()`` is the downstream key. Do not also put ``once`` on a
    tool guarded here: one guard per tool. A replay is a ``ToolReturn``: the value unchanged, the replay note
    beside it for the model, ``metadata`` marking it (``replay_note=False``: the bare value).
    """

    def __init__(
        self,
        guard: Guard,
        tools: ToolsArg,
        *,
        task_id: Callable[[RunContext[Any]], str] | None = None,
        scope: str | None = None,
        replay_note: bool = True,
    ) -> None:
        self.guard = guard
        self.tools: dict[str, ToolSpec] = tool_specs(tools)
        self.task_id = task_id
        self.scope = scope
        self.replay_note = replay_note

    def __repr__(self) -> str:
        return f"GuardTools(tools={sorted(self.tools)!r})"

    async def prepare_tools(self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        # Each step's tools are prepared before the model sees them, so before any of them can run: a guarded
        # name the agent does not offer (its real tool would run unguarded) or a key field the tool does not
        # take (every call keyed on null) fails the run here.
        offered = {t.name: argument_names(t.parameters_json_schema) for t in tool_defs}
        check_specs(self.tools, offered, where="GuardTools", offered_by="the agent")
        return tool_defs

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
    ) -> Any:
        spec = self.tools.get(tool_def.name)
        if spec is None:
            return await handler(args)
        if not set(args) <= set(argument_names(tool_def.parameters_json_schema)):
            # The schema checked in prepare_tools does not name what the tool is handed (a tool taking one
            # pydantic model gets {"req": Req(...)} for the model's fields): check against what it is handed.
            check_spec(spec, tool_def.name, args, where="GuardTools", error=ValueError)

        async def body(_key: str) -> Any:
            return await handler(args)

        audit = call_ids(getattr(ctx, "tool_call_id", None))
        try:
            info = resolve_task(
                tool_def.name, explicit=self.task_id, context=ctx, fallback=deps_task_id, scope=self.scope,
                hint=HINT, on_missing=lambda: missing_task(self.guard, tool_def.name, audit),
            )
            outcome = await self.guard.run(
                tool_def.name, body, arguments=spec.fingerprinted(args), key=spec.key_values(args),
                task_id=info.task_id, scope=info.scope, returns=spec.returns, cache_errors=spec.cache_errors,
                audit=audit, on_unknown=spec.on_unknown,
            )
        except GuardError as exc:
            refuse(exc)
        if outcome.replayed and self.replay_note:
            return noted_return(outcome.value, note_for(outcome.operation, outcome.task_id))
        return outcome.value
