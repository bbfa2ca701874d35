"""Everything but tools, passed through: resources, prompts, completions, logging, roots.

A request goes to the upstream as the host sent it, its ``_meta`` without the reserved keys of the host's hop
(a log level goes on to an upstream of the same era); the result comes back without the upstream's reserved
``_meta`` keys. A resource read or a prompt whose upstream needs input is an exchange, like a tool call
(``_exchange.py``). The proxy advertises what its upstream offers (:class:`ProxyServer`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import mcp_types as types
from mcp import Client, MCPError
from mcp.server import Server
from pydantic import BaseModel

from ._exchange import Context, Exchange, Exchanges, digest, resolve
from ._hub import Hub
from ._meta import strip_reserved
from ._upstream import Upstream

log = logging.getLogger("agentguard.mcp")

M = TypeVar("M", bound=BaseModel)

# Requests passed through as they are: method -> (params, request, result).
_PLAIN: dict[str, tuple[type[BaseModel], type[Any], type[BaseModel]]] = {
    "resources/list": (types.PaginatedRequestParams, types.ListResourcesRequest, types.ListResourcesResult),
    "resources/templates/list": (types.PaginatedRequestParams, types.ListResourceTemplatesRequest,
                                 types.ListResourceTemplatesResult),
    "prompts/list": (types.PaginatedRequestParams, types.ListPromptsRequest, types.ListPromptsResult),
    "completion/complete": (types.CompleteRequestParams, types.CompleteRequest, types.CompleteResult),
}


def cleaned(result: M) -> M:
    """A result of the upstream's, without its reserved ``_meta`` keys (its serverInfo stamp and the like)."""
    data = strip_reserved(result.model_dump(by_alias=True, mode="json", exclude_none=True))
    return type(result).model_validate(data, by_name=False)


class ProxyServer(Server[Any]):
    """The proxy's MCP server: it advertises what its upstream offers (resources, prompts, completions,
    logging) besides its tools, whose changes it announces."""

    upstream_capabilities: Callable[[], types.ServerCapabilities | None] = staticmethod(lambda: None)

    def get_capabilities(
        self, notification_options: Any = None, experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None, *, protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        caps = super().get_capabilities(notification_options, experimental_capabilities, extensions,
                                        protocol_version=protocol_version)
        up = self.upstream_capabilities()
        if up is None:  # not connected yet (an in-process proxy before its first connection): all relayed
            return caps
        resources = None if up.resources is None else types.ResourcesCapability(
            subscribe=bool(up.resources.subscribe), list_changed=bool(up.resources.list_changed))
        prompts = None if up.prompts is None else types.PromptsCapability(list_changed=bool(up.prompts.list_changed))
        return caps.model_copy(update={
            "tools": types.ToolsCapability(list_changed=True),
            "resources": resources, "prompts": prompts,
            "completions": caps.completions if up.completions is not None else None,
            "logging": caps.logging if up.logging is not None else None,
        })


class Relayer:
    """The handlers of everything but tools."""

    def __init__(self, hub: Hub, exchanges: Exchanges, upstream: Callable[[], Upstream]) -> None:
        self._hub, self._exchanges, self._upstream = hub, exchanges, upstream

    def register(self, server: Server[Any]) -> None:
        for method, (params_type, request_type, result_type) in _PLAIN.items():
            server.add_request_handler(method, params_type, self._plain(request_type, result_type))
        server.add_request_handler("resources/read", types.ReadResourceRequestParams, self._read)
        server.add_request_handler("prompts/get", types.GetPromptRequestParams, self._get_prompt)
        server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, self._subscribe)
        server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, self._unsubscribe)
        server.add_request_handler("subscriptions/listen", types.SubscriptionsListenRequestParams, self._hub.listen)
        server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self._set_level)
        server.add_notification_handler("notifications/roots/list_changed", types.NotificationParams,
                                        self._roots_changed)

    def _meta(self, ctx: Context) -> dict[str, Any] | None:
        return self._hub.forward_meta(ctx, modern_upstream=self._upstream().modern) or None

    def _plain(self, request_type: type[Any], result_type: type[M]) -> Any:
        async def handle(ctx: Context, params: BaseModel) -> M:
            self._hub.seen(ctx)
            request = request_type(params=params.model_copy(update={"meta": self._meta(ctx)}))
            return cleaned(await self._upstream().request(lambda c: c.session.send_request(request, result_type)))

        return handle

    async def _read(self, ctx: Context, params: types.ReadResourceRequestParams) -> Any:
        uri = params.uri

        def send(client: Client, meta: Any) -> Any:
            return lambda answers, state: client.session.read_resource(
                uri, input_responses=answers, request_state=state, meta=meta, allow_input_required=True)

        return await self._exchange(ctx, params, f"resources/read {uri}", digest("resources/read", uri, None), send)

    async def _get_prompt(self, ctx: Context, params: types.GetPromptRequestParams) -> Any:
        name, arguments = params.name, params.arguments

        def send(client: Client, meta: Any) -> Any:
            return lambda answers, state: client.session.get_prompt(
                name, arguments, input_responses=answers, request_state=state, meta=meta, allow_input_required=True)

        return await self._exchange(ctx, params, f"prompts/get {name}", digest("prompts/get", name, arguments), send)

    async def _exchange(self, ctx: Context, params: types.InputResponseRequestParams, what: str, key: str,
                        send: Callable[[Client, Any], Any]) -> Any:
        """A read or a prompt: an exchange, for the upstream may ask for input (2026-07-28) on the way."""
        self._hub.seen(ctx)
        meta = self._meta(ctx)

        async def run(ex: Exchange) -> Any:
            with ex.upstream():
                return cleaned(await self._upstream().request(lambda c: resolve(send(c, meta), ex.ask)))

        return await self._exchanges.serve(ctx, what=what, key=key, keep=False, resume=params.request_state,
                                           responses=params.input_responses, run=run)

    async def _subscribe(self, ctx: Context, params: types.SubscribeRequestParams) -> types.EmptyResult:
        return await self._hub.subscribe(ctx, params.uri, on=True)

    async def _unsubscribe(self, ctx: Context, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        return await self._hub.subscribe(ctx, params.uri, on=False)

    async def _set_level(self, ctx: Context, params: types.SetLevelRequestParams) -> types.EmptyResult:
        return await self._hub.set_level(ctx, params.level)

    async def set_upstream_level(self, level: types.LoggingLevel) -> None:
        """The upstream's log level (handshake era; on 2026-07-28 each request carries its own)."""
        up = self._upstream()
        caps = up.capabilities
        if up.modern or caps is None or caps.logging is None:
            return
        request = types.SetLevelRequest(params=types.SetLevelRequestParams(level=level))
        try:
            await up.request(lambda c: c.session.send_request(request, types.EmptyResult))
        except MCPError as exc:
            log.warning("the upstream refused logging/setLevel: %s", exc.error.message)

    async def _roots_changed(self, ctx: Context, params: types.NotificationParams) -> None:
        up = self._upstream()
        if up.modern:
            return
        try:
            await up.request(lambda c: c.session.send_notification(types.RootsListChangedNotification()))
        except MCPError as exc:
            log.debug("roots/list_changed not passed on: %s", exc.error.message)

