"""The LangChain ``wrap_tool_call`` middleware (imports LangChain; reached through
``agentguard.integrations.langchain``)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from pydantic import BaseModel, ValidationError

from .._errors import GuardError
from .._guard import Guard
from .._names import argument_names
from .._refusals import REPLAYED_MARK
from .._refusals import replay_note as note_for
from ._common import (
    ToolsArg,
    ToolSpec,
    call_ids,
    check_spec,
    check_specs,
    hearing_replays,
    missing_task,
    resolve_task,
    tool_specs,
)
from ._langchain_run import HINT, _exception_class, current_config, thread_id

Result = ToolMessage | Command[Any]


class _ToolErrored(Exception):
    """The tool failed and the ToolNode already turned the failure into an error message: do not store it."""

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(message.content)
        self.message = message


def _stored(result: Any) -> Any:
    # What is stored and replayed is the message's payload, never its tool_call_id: a replay answers the
    # call being made now. A Command or another type fails to store, and the claim stays held (fail closed).
    if isinstance(result, ToolMessage):
        if result.status == "error":
            raise _ToolErrored(result)
        return {"content": result.content, "artifact": result.artifact}
    return result


def noted_message(message: ToolMessage, note: str) -> ToolMessage:
    """A ``ToolMessage`` that tells the model it is a replay: the note before its content (a first paragraph of
    a string, a first text block of a list of blocks); its artifact, for the program, as it was; and
    ``response_metadata`` marking the replay (sent to no model)."""
    content = message.content
    told = f"{note}\n\n{content}" if isinstance(content, str) else [{"type": "text", "text": note}, *content]
    metadata = {**message.response_metadata, REPLAYED_MARK: True}
    return message.model_copy(update={"content": told, "response_metadata": metadata})


def tool_arguments(tool: BaseTool) -> list[str]:
    """The arguments the model sends a tool: its ``tool_call_schema`` (injected arguments left out)."""
    schema = tool.tool_call_schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return list(schema.model_fields)
    return argument_names(schema if isinstance(schema, Mapping) else None)


class ToolGuard(AgentMiddleware[Any, Any, Any]):
    """Guards the named tools of a ``create_agent`` agent or a ``ToolNode``; answers refusals in LangChain's
    convention, ``ToolMessage(status="error")``, with the current ``tool_call_id``.

    ``tools``: ``["charge"]``, ``{"charge": "order_id"}`` or ``{"charge": ToolSpec(...)}``; may be empty to only
    turn the refusals of ``once``-guarded tools into messages. The model's raw arguments are validated
    against the tool's schema before they are fingerprinted. Inside the tool, ``agentguard.current_key()``
    is the downstream key. Do not also put ``once`` on a tool guarded here: one guard per tool.

    A replay is told to the model in its ``ToolMessage``: the replay note before the content (a first paragraph
    of a string, a first text block of a list), the ``artifact`` left as the tool made it, and
    ``response_metadata["dev.agentguard/replayed"]`` marking it for the program; a replay of a ``once``-guarded
    tool under this middleware is told the same way, whatever its result's type. ``replay_note=False``: never.

    Every name is checked before a tool runs: in ``create_agent``, against the tools of each model request
    (a guarded tool the agent lacks, or a key field its tool does not take, fails the run before the model is
    asked); in a graph you build, :meth:`tool_node` checks them against the node's tools, and a guarded tool's
    key fields are checked on its call, before it runs.
    """

    def __init__(
        self,
        guard: Guard,
        tools: ToolsArg = (),
        *,
        task_id: Callable[[RunnableConfig], str] | None = None,
        scope: str | None = None,
        replay_note: bool = True,
    ) -> None:
        super().__init__()
        self.guard = guard
        self.guarded: dict[str, ToolSpec] = tool_specs(tools) if tools else {}
        self.task_id = task_id
        self.scope = scope
        self.replay_note = replay_note

    def __repr__(self) -> str:
        return f"ToolGuard(tools={sorted(self.guarded)!r})"

    def tool_node(self, tools: Sequence[BaseTool | Callable[..., Any]], **kwargs: Any) -> ToolNode:
        """A ``ToolNode`` of ``tools`` under this guard, built once every guarded name is found among them."""
        node = ToolNode(list(tools), wrap_tool_call=self.wrap_tool_call, awrap_tool_call=self.awrap_tool_call,
                        **kwargs)
        self._check(node.tools_by_name.values(), offered_by="the ToolNode")
        return node

    # -- pieces shared by the sync and async paths ---------------------------------------------------------

    def _check(self, tools: Iterable[BaseTool | Mapping[str, Any]], *, offered_by: str = "the agent") -> None:
        # A provider's built-in tool (a dict) never runs here: only the agent's own tools can be guarded.
        offered = {t.name: tool_arguments(t) for t in tools if isinstance(t, BaseTool)}
        check_specs(self.guarded, offered, where="ToolGuard", offered_by=offered_by)

    def _arguments(self, request: ToolCallRequest) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.tool_call.get("args") or {})
        tool = request.tool
        schema = tool.tool_call_schema if isinstance(tool, BaseTool) else None
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            try:
                # Validated and defaulted, so "500" and 500, or an omitted default, fingerprint alike.
                return dict(schema.model_validate(args))
            except ValidationError:
                pass  # the tool will report it; the raw arguments are still guarded
        return args

    def _config(self, request: ToolCallRequest) -> Any:
        runtime = getattr(request, "runtime", None)
        return getattr(runtime, "config", None) or current_config()

    def _message(self, request: ToolCallRequest, name: str, value: Any, note: str | None) -> Result:
        if isinstance(value, Mapping) and "content" in value:
            message = ToolMessage(
                content=value["content"], artifact=value.get("artifact"), tool_call_id=request.tool_call["id"],
                name=name,
            )
            return message if note is None or not self.replay_note else noted_message(message, note)
        return value  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def _hearing(self) -> Iterator[list[str]]:
        """Around a tool this middleware does not guard: a ``once``-guarded one's replay is told here."""
        if not self.replay_note:
            yield []
            return
        with hearing_replays() as notes:
            yield notes

    def _heard(self, result: Result, notes: list[str]) -> Result:
        if notes and isinstance(result, ToolMessage) and result.status != "error":
            return noted_message(result, notes[-1])
        return result

    def _refusal(self, request: ToolCallRequest, exc: BaseException) -> ToolMessage:
        return ToolMessage(
            content=str(exc), tool_call_id=request.tool_call["id"], name=request.tool_call["name"], status="error"
        )

    def _plan(self, request: ToolCallRequest) -> tuple[ToolSpec, dict[str, Any], str, str] | None:
        spec = self.guarded.get(request.tool_call["name"])
        if spec is None:
            return None
        if isinstance(request.tool, BaseTool):  # a graph's ToolNode shows the guard no tool list: check this one
            check_spec(spec, request.tool.name, tool_arguments(request.tool), where="ToolGuard", error=ValueError)
        args = self._arguments(request)
        name = request.tool_call["name"]
        info = resolve_task(
            name, explicit=self.task_id, context=self._config(request), fallback=thread_id, scope=self.scope,
            hint=HINT, on_missing=lambda: missing_task(self.guard, name, call_ids(request.tool_call.get("id"))),
        )
        return spec, args, info.task_id, info.scope

    def _as_refusal(self, exc: GuardError) -> Exception:
        return _exception_class()(exc)

    # -- the middleware hooks ----------------------------------------------------------------------------

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> Any:
        # Every model request shows the agent's tools before the model can call one of them: a guarded name
        # the agent lacks (its real tool would run unguarded) or a key field its tool does not take fails here.
        self._check(request.tools)
        return handler(request)

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]
    ) -> Any:
        self._check(request.tools)
        return await handler(request)

    @contextlib.contextmanager
    def _answering(self, request: ToolCallRequest) -> Iterator[list[Result]]:
        """Collects the answer to a tool call; a refusal, or the tool's own error message, becomes the answer."""
        answer: list[Result] = []
        try:
            yield answer
        except _ToolErrored as failed:
            answer.append(failed.message)
        except GuardError as exc:
            answer.append(self._refusal(request, self._as_refusal(exc)))
        except _exception_class() as exc:
            answer.append(self._refusal(request, exc))

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Result]) -> Result:
        name = request.tool_call["name"]
        with self._answering(request) as answer:
            plan = self._plan(request)
            if plan is None:
                with self._hearing() as notes:
                    result = handler(request)
                return self._heard(result, notes)
            spec, args, task_id, scope = plan
            outcome = self.guard.run_sync(
                name, lambda _key: _stored(handler(request)), arguments=spec.fingerprinted(args),
                key=spec.key_values(args), task_id=task_id, scope=scope, returns=Any,
                cache_errors=spec.cache_errors, audit=call_ids(request.tool_call.get("id")),
                on_unknown=spec.on_unknown,
            )
            note = note_for(outcome.operation, outcome.task_id) if outcome.replayed else None
            answer.append(self._message(request, name, outcome.value, note))
        return answer[0]

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Result]]
    ) -> Result:
        name = request.tool_call["name"]
        with self._answering(request) as answer:
            plan = self._plan(request)
            if plan is None:
                with self._hearing() as notes:
                    result = await handler(request)
                return self._heard(result, notes)
            spec, args, task_id, scope = plan

            async def body(_key: str) -> Any:
                return _stored(await handler(request))

            outcome = await self.guard.run(
                name, body, arguments=spec.fingerprinted(args), key=spec.key_values(args), task_id=task_id,
                scope=scope, returns=Any, cache_errors=spec.cache_errors, audit=call_ids(request.tool_call.get("id")),
                on_unknown=spec.on_unknown,
            )
            note = note_for(outcome.operation, outcome.task_id) if outcome.replayed else None
            answer.append(self._message(request, name, outcome.value, note))
        return answer[0]
