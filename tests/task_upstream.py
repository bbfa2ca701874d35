"""A test upstream that answers calls with tasks (the 2026-07-28 tasks extension), in process or over HTTP.

``pay(order_id, idempotency_key)`` answers with a task when the request declares the extension
(``io.modelcontextprotocol/tasks``), with its result otherwise. The payment is made when the call arrives (a
``pay`` line in the log: the side effect a test counts) and its task completes once the upstream is released
(:meth:`TaskUpstream.release`; a file for a test several processes away). ``pay_asking``'s task first asks
which card (``input_required``, answered with ``tasks/update``); ``doomed(end)``'s task ends ``failed`` (a
JSON-RPC error) or ``cancelled``; ``pay_legacy`` answers a handshake-era call with a 2025-11-25 task handle
nobody asked for. Every request is logged (``call``, ``get``, ``update``, ``cancel``) with its ``Mcp-Method``
and ``Mcp-Name`` headers and its ``Authorization`` header, over HTTP.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.context import CallNext
from mcp_types import INVALID_PARAMS
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ConfigDict
from upstream_log import events, record

Ctx = ServerRequestContext[Any, Any]
TASKS = "io.modelcontextprotocol/tasks"
CARD = types.ElicitRequest(params=types.ElicitRequestFormParams(
    message="Which card?", requested_schema={"type": "object", "properties": {"card": {"type": "string"}},
                                             "required": ["card"]}))


def _schema(**props: str) -> dict[str, Any]:
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}


TOOLS = [
    types.Tool(name="pay", input_schema=_schema(order_id="string", idempotency_key="string")),
    types.Tool(name="pay_asking", input_schema=_schema(order_id="string", idempotency_key="string")),
    types.Tool(name="doomed", input_schema=_schema(end="string", idempotency_key="string")),
    types.Tool(name="pay_legacy", input_schema=_schema(order_id="string")),
]


class TaskParams(types.RequestParams):
    model_config = ConfigDict(extra="allow")
    task_id: str
    request_state: str | None = None
    input_responses: dict[str, Any] | None = None


def _wire(ctx: Ctx) -> dict[str, Any]:
    """The request's routing headers, as the upstream received them (HTTP only)."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return {}
    return {k: headers.get(k) for k in ("mcp-method", "mcp-name", "authorization")}


class TaskUpstream:
    def __init__(self, log: Path, *, held: bool = False, release_file: Path | None = None, ttl: float = 3600) -> None:
        self.log = log
        self.ttl = ttl
        self.released = not held
        self.release_file = release_file
        self.tasks: dict[str, dict[str, Any]] = {}
        self.server = self._build()

    def release(self) -> None:
        self.released = True

    def _done(self) -> bool:
        return self.released or (self.release_file is not None and self.release_file.exists())

    def _state(self, task_id: str, **extra: Any) -> dict[str, Any]:
        return {"taskId": task_id, "createdAt": "2026-07-28T00:00:00Z", "lastUpdatedAt": "2026-07-28T00:00:00Z",
                "ttlSeconds": self.ttl, "pollIntervalMilliseconds": 20, "requestState": f"state-{task_id}", **extra}

    def _paid(self, tool: str, args: dict[str, Any], **more: Any) -> types.CallToolResult:
        record(self.log, {"event": "pay", "tool": tool, "args": args, **more})
        n = len(events(self.log, "pay"))
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"paid #{n}")],
                                    structured_content={"n": n})

    def _build(self) -> Server[Any]:
        async def list_tools(ctx: Ctx, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=TOOLS)

        async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> Any:
            args = dict(params.arguments or {})
            caps = (ctx.meta or {}).get(types.CLIENT_CAPABILITIES_META_KEY) or {}
            tasks = TASKS in (caps.get("extensions") or {})
            record(self.log, {"event": "call", "tool": params.name, "args": args, "tasks": tasks, **_wire(ctx)})
            if not tasks:
                return self._paid(params.name, args)
            task_id = uuid.uuid4().hex
            task: dict[str, Any] = {"tool": params.name, "args": args}
            if params.name == "pay":
                task["result"] = self._paid("pay", args, task=task_id).model_dump(by_alias=True, exclude_none=True)
            self.tasks[task_id] = task
            return {"resultType": "task", "status": "working", **self._state(task_id)}

        async def get(ctx: Ctx, params: TaskParams) -> dict[str, Any]:
            record(self.log, {"event": "get", "task": params.task_id, "state": params.request_state, **_wire(ctx)})
            task = self.tasks.get(params.task_id)
            if task is None:
                raise _not_found(params.task_id)
            if task["tool"] == "doomed":
                if task["args"].get("end") == "cancelled":
                    return self._state(params.task_id, status="cancelled", statusMessage="the provider gave up")
                return self._state(params.task_id, status="failed",
                                   error={"code": INVALID_PARAMS, "message": "no such account"})
            if task["tool"] == "pay_asking" and "card" not in task:
                return self._state(params.task_id, status="input_required", inputRequests={
                    "card": CARD.model_dump(by_alias=True, exclude_none=True)})
            if not self._done():
                return self._state(params.task_id, status="working")
            if "result" not in task:
                task["result"] = self._paid(task["tool"], task["args"], task=params.task_id, card=task.get(
                    "card")).model_dump(by_alias=True, exclude_none=True)
            return self._state(params.task_id, status="completed", result=task["result"])

        async def update(ctx: Ctx, params: TaskParams) -> dict[str, Any]:
            record(self.log, {"event": "update", "task": params.task_id, "answers": params.input_responses,
                              **_wire(ctx)})
            task = self.tasks.get(params.task_id)
            answer = (params.input_responses or {}).get("card") or {}
            if task is not None and answer.get("action") == "accept":
                task["card"] = answer["content"]["card"]
            return {}

        async def cancel(ctx: Ctx, params: TaskParams) -> dict[str, Any]:
            record(self.log, {"event": "cancel", "task": params.task_id, **_wire(ctx)})
            return {}

        async def legacy_task(ctx: Ctx, call_next: CallNext) -> Any:
            """A 2025-11-25 task handle for ``pay_legacy``, which no one asked for (the SDK would refuse to send
            it as a tool result: this middleware answers before it is checked)."""
            params: Mapping[str, Any] = ctx.params or {}
            if ctx.method == "tools/call" and params.get("name") == "pay_legacy" and (
                    ctx.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS):
                record(self.log, {"event": "call", "tool": "pay_legacy", "args": params.get("arguments"),
                                  "tasks": False})
                self._paid("pay_legacy", dict(params.get("arguments") or {}))
                return {"task": {"taskId": uuid.uuid4().hex, "status": "working", "ttl": 60000,
                                 "createdAt": "2025-11-25T00:00:00Z", "lastUpdatedAt": "2025-11-25T00:00:00Z"}}
            return await call_next(ctx)

        server: Server[Any] = Server("tasks", on_list_tools=list_tools, on_call_tool=call_tool)
        server.add_request_handler("tasks/get", TaskParams, get)
        server.add_request_handler("tasks/update", TaskParams, update)
        server.add_request_handler("tasks/cancel", TaskParams, cancel)
        server.middleware.append(legacy_task)
        return server


def _not_found(task_id: str) -> Exception:
    from mcp import MCPError

    return MCPError(INVALID_PARAMS, f"Failed to retrieve task: no task {task_id}")
