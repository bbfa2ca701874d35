"""A test upstream with the whole MCP surface, in process or as a stdio server, in both protocol eras.

    FULL_LOG=log.jsonl python tests/full_upstream.py

Tools: ``pay(order_id, amount_cents, idempotency_key)`` reports progress (1/2, 2/2) and then pays (every
payment is a line in the log: the side effect a test counts); ``pay_asking`` first asks its user which card to
use (elicitation); ``sample`` asks the host's model (sampling), ``roots`` for its roots; ``log`` sends a log
line at a level; ``touch(uri)`` updates a resource; ``add(kind, name)`` adds a prompt or a resource and
announces the change; ``tasky``/``tasky_optional`` are offered as MCP tasks only/optionally; ``stamped``
answers with ``_meta`` keys under reserved and unreserved prefixes. Resources ``memo://a``, ``memo://b`` and
the template ``memo://{name}``; ``memo://secret`` asks before it is read. Prompts ``greet(name)`` and
``careful`` (which asks first); completions of ``greet``'s ``name``.

In the handshake era it asks its host with server-to-client requests and announces changes unasked (a
resource update only once subscribed); on 2026-07-28 it asks with ``input_required`` and announces on
``subscriptions/listen`` streams. Every request's ``_meta``, every subscription and every notice that the
host's roots changed is logged too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.connection import allowed_log_levels
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
)
from mcp.shared.message import ServerMessageMetadata
from upstream_log import events, record

Ctx = ServerRequestContext[Any, Any]

CARD_SCHEMA = {"type": "object", "properties": {"card": {"type": "string"}}, "required": ["card"]}
STAMP = {"io.modelcontextprotocol/serverInfo": {"name": "up", "version": "9"}, "dev.mcp/trace": "x",
         "org.mcp.tools/y": 1, "com.example.mcp/kept": "kept", "dev.acme/kept": True}
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


def _text(text: str, meta: dict[str, Any] | None = None) -> types.TextContent:
    return types.TextContent(type="text", text=text, _meta=meta)


def _schema(**props: str) -> dict[str, Any]:
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}


TOOLS = [
    types.Tool(name="pay", input_schema={**_schema(order_id="string", amount_cents="integer",
                                                   idempotency_key="string"), "required": ["order_id"]},
               annotations=types.ToolAnnotations(destructive_hint=True, open_world_hint=True, title="Pay")),
    types.Tool(name="pay_asking", input_schema=_schema(order_id="string", idempotency_key="string")),
    types.Tool(name="sample", input_schema=_schema(prompt="string")),
    types.Tool(name="roots", input_schema=_schema()),
    types.Tool(name="log", input_schema=_schema(level="string", message="string")),
    types.Tool(name="touch", input_schema=_schema(uri="string")),
    types.Tool(name="add", input_schema=_schema(kind="string", name="string")),
    types.Tool(name="stamped", input_schema=_schema()),
    types.Tool(name="tasky", input_schema=_schema(), execution=types.ToolExecution(task_support="required")),
    types.Tool(name="tasky_optional", input_schema=_schema(),
               execution=types.ToolExecution(task_support="optional")),
]


def build_server(log: Path) -> Server[Any]:
    bus = InMemorySubscriptionBus()
    listen = ListenHandler(bus)
    state: dict[str, Any] = {"prompts": ["greet", "careful"], "resources": ["memo://a", "memo://b"],
                             "subscribed": set(), "level": None}

    async def ask(ctx: Ctx, params: Any, key: str, request: types.InputRequest) -> Any:
        """The host's answer (handshake era), or an input_required result asking for it (2026-07-28)."""
        if ctx.session.can_send_request:
            result_type = {"elicitation/create": types.ElicitResult, "sampling/createMessage":
                           types.CreateMessageResult, "roots/list": types.ListRootsResult}[request.method]
            return await ctx.session.send_request(request, result_type,  # type: ignore[arg-type]
                                                  metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
        answers = params.input_responses or {}
        if key in answers:
            return answers[key]
        return types.InputRequiredResult(input_requests={key: request}, request_state=f"asked-{key}")

    async def announce(ctx: Ctx, legacy: Any, event: Any) -> None:
        if ctx.session.can_send_request:
            await legacy()
        await bus.publish(event)

    async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> Any:
        args = dict(params.arguments or {})
        record(log, {"event": "call", "tool": params.name, "meta": dict(ctx.meta or {})})
        if params.name == "pay":
            await ctx.session.report_progress(1, 2, "charging")
            record(log, {"event": "pay", "args": args})
            await ctx.session.report_progress(2, 2, "charged")
            n = len(events(log, "pay"))
            return types.CallToolResult(content=[_text(f"paid #{n}")], structured_content={"n": n})
        if params.name == "pay_asking":
            answer = await ask(ctx, params, "card", types.ElicitRequest(params=types.ElicitRequestFormParams(
                message="Which card?", requested_schema=CARD_SCHEMA)))
            if isinstance(answer, types.InputRequiredResult):
                return answer
            if answer.action != "accept":
                return types.CallToolResult(content=[_text(f"not paid: {answer.action}")], is_error=True)
            record(log, {"event": "pay", "args": args, "card": answer.content["card"]})
            return types.CallToolResult(content=[_text(f"paid with {answer.content['card']}")])
        if params.name == "sample":
            answer = await ask(ctx, params, "llm", types.CreateMessageRequest(params=types.CreateMessageRequestParams(
                messages=[types.SamplingMessage(role="user", content=_text(args["prompt"]))], max_tokens=10)))
            if isinstance(answer, types.InputRequiredResult):
                return answer
            return types.CallToolResult(content=[_text(f"model said: {answer.content.text}")])
        if params.name == "roots":
            answer = await ask(ctx, params, "roots", types.ListRootsRequest())
            if isinstance(answer, types.InputRequiredResult):
                return answer
            return types.CallToolResult(content=[_text(" ".join(str(r.uri) for r in answer.roots))])
        if params.name == "log":
            level = args["level"]
            floor = state["level"]
            if level in allowed_log_levels(ctx.protocol_version, ctx.meta) and (
                    floor is None or LEVELS.index(level) >= LEVELS.index(floor)):
                await ctx.session.send_notification(types.LoggingMessageNotification(
                    params=types.LoggingMessageNotificationParams(level=level, data=args["message"], logger="up")),
                    related_request_id=ctx.request_id)
            return types.CallToolResult(content=[_text("logged")])
        if params.name == "touch":
            uri = args["uri"]
            if ctx.session.can_send_request and uri in state["subscribed"]:
                await ctx.session.send_resource_updated(uri)
            await bus.publish(ResourceUpdated(uri))
            return types.CallToolResult(content=[_text("touched")])
        if params.name == "add":
            if args["kind"] == "prompt":
                state["prompts"].append(args["name"])
                await announce(ctx, ctx.session.send_prompt_list_changed, PromptsListChanged())
            else:
                state["resources"].append(args["name"])
                await announce(ctx, ctx.session.send_resource_list_changed, ResourcesListChanged())
            return types.CallToolResult(content=[_text("added")])
        if params.name == "stamped":
            return types.CallToolResult(content=[_text("stamped", dict(STAMP))], structured_content={"ok": True},
                                        _meta=dict(STAMP))
        record(log, {"event": "pay", "args": args, "tool": params.name})  # tasky: must never be reached
        return types.CallToolResult(content=[_text("ran")])

    async def list_tools(ctx: Ctx, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def list_resources(ctx: Ctx, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(uri=u, name=u.split("//")[1], _meta=dict(STAMP))
                                                    for u in state["resources"]])

    async def list_templates(ctx: Ctx, params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(uri_template="memo://{name}", name="memo")])

    async def read_resource(ctx: Ctx, params: types.ReadResourceRequestParams) -> Any:
        record(log, {"event": "read", "uri": params.uri, "meta": dict(ctx.meta or {})})
        text = f"contents of {params.uri}"
        if params.uri == "memo://secret":
            answer = await ask(ctx, params, "ok", types.ElicitRequest(params=types.ElicitRequestFormParams(
                message="Show the secret?", requested_schema=_schema(ok="boolean"))))
            if isinstance(answer, types.InputRequiredResult):
                return answer
            text = "the secret" if answer.action == "accept" else "withheld"
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=params.uri, text=text,
                                                                             _meta=dict(STAMP))], _meta=dict(STAMP))

    async def subscribe(ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        state["subscribed"].add(params.uri)
        record(log, {"event": "subscribe", "uri": params.uri})
        return types.EmptyResult()

    async def unsubscribe(ctx: Ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        state["subscribed"].discard(params.uri)
        record(log, {"event": "unsubscribe", "uri": params.uri})
        return types.EmptyResult()

    async def on_listen(ctx: Ctx, params: types.SubscriptionsListenRequestParams) -> Any:
        record(log, {"event": "listen", "uris": params.notifications.resource_subscriptions or []})
        return await listen(ctx, params)

    async def list_prompts(ctx: Ctx, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(
            name=n, arguments=[types.PromptArgument(name="name", required=False)]) for n in state["prompts"]])

    async def get_prompt(ctx: Ctx, params: types.GetPromptRequestParams) -> Any:
        who = (params.arguments or {}).get("name", "you")
        if params.name == "careful":
            answer = await ask(ctx, params, "sure", types.ElicitRequest(params=types.ElicitRequestFormParams(
                message="Really?", requested_schema=_schema(sure="boolean"))))
            if isinstance(answer, types.InputRequiredResult):
                return answer
            who = f"{who} ({answer.action})"
        return types.GetPromptResult(description=params.name, messages=[
            types.PromptMessage(role="user", content=_text(f"Hello, {who}"))])

    async def complete(ctx: Ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
        prefix = params.argument.value
        values = [v for v in ("alice", "albert", "bob") if v.startswith(prefix)]
        return types.CompleteResult(completion=types.Completion(values=values, total=len(values)))

    async def set_level(ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
        state["level"] = params.level
        record(log, {"event": "level", "level": params.level})
        return types.EmptyResult()

    server: Server[Any] = Server(
        "full", version="1", instructions="Pay with care.", on_call_tool=call_tool, on_list_tools=list_tools,
        on_list_resources=list_resources, on_list_resource_templates=list_templates,
        on_read_resource=read_resource, on_subscribe_resource=subscribe, on_unsubscribe_resource=unsubscribe,
        on_subscriptions_listen=on_listen, on_list_prompts=list_prompts, on_get_prompt=get_prompt,
        on_completion=complete,
    )
    async def roots_changed(ctx: Ctx, params: types.NotificationParams) -> None:
        record(log, {"event": "roots_changed"})

    server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
    server.add_notification_handler("notifications/roots/list_changed", types.NotificationParams, roots_changed)
    # It announces its changes (the handshake era's listChanged flags), however it is served.
    changes = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)
    options = server.create_initialization_options
    server.create_initialization_options = lambda *_a, **_k: options(changes)  # type: ignore[method-assign]
    return server


def main() -> int:
    server = build_server(Path(os.environ["FULL_LOG"]))

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
