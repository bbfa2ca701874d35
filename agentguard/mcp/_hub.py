"""The proxy's hosts, as its upstream's notifications and unbidden requests reach them.

Change notifications (the tools, prompts or resources changed; a resource was updated) go to every host that
can receive them: in the handshake era to each host connection (a resource update only to those subscribed to
it), on 2026-07-28 to the ``subscriptions/listen`` streams that asked for them. The upstream is subscribed to
the union of the resources the hosts subscribed to. A log line or a request (elicitation, sampling, roots)
that names no call goes to the call it must belong to (:meth:`Exchanges.owner`); failing that, log lines go to
the handshake-era hosts and requests are refused, since nobody can tell whose they are.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, get_args

import anyio
import mcp_types as types
from mcp.server.connection import allowed_log_levels
from mcp.server.session import ServerSession
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp_types import INVALID_REQUEST, LOG_LEVEL_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from ._exchange import Answer, Context, Exchange, Exchanges, connection_of, host_of
from ._meta import FORWARDED, clean_meta

log = logging.getLogger("agentguard.mcp")

_LEVELS: Final = get_args(types.LoggingLevel)  # least severe first

# A change the upstream announced: what a handshake-era host is sent, what a 2026-07-28 stream is.
_CHANGES: Final[dict[type[types.ServerNotification], tuple[str, ServerEvent]]] = {
    types.PromptListChangedNotification: ("send_prompt_list_changed", PromptsListChanged()),
    types.ResourceListChangedNotification: ("send_resource_list_changed", ResourcesListChanged()),
    types.ToolListChangedNotification: ("send_tool_list_changed", ToolsListChanged()),
}


class Hub:
    """Knows the hosts: their connections (handshake era), their subscriptions and log levels."""

    def __init__(self, exchanges: Exchanges) -> None:
        self._exchanges = exchanges
        self.bus = InMemorySubscriptionBus()
        self._listen = ListenHandler(self.bus)
        self._hosts: dict[object, ServerSession] = {}  # handshake-era host connections, a session of each
        self._levels: dict[object, types.LoggingLevel] = {}
        self._subscribed: dict[str, set[object]] = {}  # resource -> hosts (or listen streams) subscribed to it
        self._url_asks: dict[str, Exchange] = {}  # URL-mode elicitations relayed, by id: where completion goes
        self.resubscribe: Callable[[frozenset[str]], Awaitable[None]] | None = None
        self.set_upstream_level: Callable[[types.LoggingLevel], Awaitable[None]] | None = None

    def seen(self, ctx: Context) -> None:
        """A request from ``ctx``'s host: a handshake-era host is remembered (until its connection ends) to be
        told of changes between its requests."""
        if ctx.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return
        host = host_of(ctx)
        if host not in self._hosts:
            connection = connection_of(ctx)
            if connection is not None:
                connection.exit_stack.push_async_callback(self._gone, host)
        self._hosts[host] = ctx.session

    async def _gone(self, host: object) -> None:
        self._hosts.pop(host, None)
        self._levels.pop(host, None)
        if any(host in hosts for hosts in self._subscribed.values()):
            for hosts in self._subscribed.values():
                hosts.discard(host)
            with anyio.CancelScope(shield=True):
                await self._sync()

    # -- changes ---------------------------------------------------------------------------------------------

    async def notify(self, notification: types.ServerNotification) -> None:
        """Relay what the upstream sent unasked (the proxy announces its own tool changes: :meth:`changed`)."""
        if isinstance(notification, types.ResourceUpdatedNotification):
            uri = notification.params.uri
            await self._send(lambda s: s.send_resource_updated(uri), self._subscribed.get(uri, set()))
            await self.bus.publish(ResourceUpdated(uri))
        elif type(notification) in _CHANGES and not isinstance(notification, types.ToolListChangedNotification):
            await self.changed(type(notification))
        elif isinstance(notification, types.LoggingMessageNotification):
            await self._log(notification)
        elif isinstance(notification, types.ElicitCompleteNotification):
            ex = self._url_asks.pop(notification.params.elicitation_id, None)
            if ex is not None and ex.ctx is not None:
                await ex.notify(notification)
            elif ex is not None and ex.host in self._hosts:
                await self._hosts[ex.host].send_notification(notification)
        else:
            log.debug("not relayed: %s from the upstream", notification.method)

    async def changed(self, kind: type[types.ServerNotification]) -> None:
        """Tell every host that a list changed, so that it lists again."""
        method, event = _CHANGES[kind]
        await self._send(lambda s: getattr(s, method)(), set(self._hosts))
        await self.bus.publish(event)

    async def _send(self, send: Callable[[ServerSession], Awaitable[None]], hosts: set[object]) -> None:
        for host in hosts:
            session = self._hosts.get(host)
            if session is not None:
                with contextlib.suppress(Exception):  # a host that hung up
                    await send(session)

    # -- resource subscriptions ------------------------------------------------------------------------------

    async def subscribe(self, ctx: Context, uri: str, *, on: bool) -> types.EmptyResult:
        """``resources/subscribe`` (``on``) or ``resources/unsubscribe`` of a handshake-era host."""
        self.seen(ctx)
        hosts = self._subscribed.setdefault(uri, set())
        if on:
            hosts.add(host_of(ctx))
        else:
            hosts.discard(host_of(ctx))
        await self._sync()
        return types.EmptyResult()

    async def listen(self, ctx: Context, params: types.SubscriptionsListenRequestParams) -> Any:
        """``subscriptions/listen`` (2026-07-28): the stream, and its resources subscribed upstream meanwhile."""
        stream = object()
        uris = params.notifications.resource_subscriptions or []
        for uri in uris:
            self._subscribed.setdefault(uri, set()).add(stream)
        try:
            if uris:
                await self._sync()
            return await self._listen(ctx, params)
        finally:
            for uri in uris:
                self._subscribed.get(uri, set()).discard(stream)
            if uris:
                with anyio.CancelScope(shield=True):
                    await self._sync()

    async def _sync(self) -> None:
        self._subscribed = {uri: hosts for uri, hosts in self._subscribed.items() if hosts}
        if self.resubscribe is not None:
            await self.resubscribe(frozenset(self._subscribed))

    # -- log lines ------------------------------------------------------------------------------------------

    async def set_level(self, ctx: Context, level: types.LoggingLevel) -> types.EmptyResult:
        """``logging/setLevel`` of a handshake-era host: its own filter, and the upstream's set to the most
        verbose level any host asked for."""
        self.seen(ctx)
        self._levels[host_of(ctx)] = level
        if self.set_upstream_level is not None:
            await self.set_upstream_level(min(self._levels.values(), key=_LEVELS.index))
        return types.EmptyResult()

    def forward_meta(self, ctx: Context, *, modern_upstream: bool) -> dict[str, Any]:
        """The ``_meta`` a host's request is passed on with: without reserved keys; with its log level for a
        2026-07-28 upstream (the request's own, or what its handshake-era host set)."""
        meta = clean_meta(ctx.meta, keep=FORWARDED if modern_upstream else frozenset())
        level = self._levels.get(host_of(ctx))
        if modern_upstream and level is not None:
            meta.setdefault(LOG_LEVEL_META_KEY, level)
        return meta

    async def _log(self, notification: types.LoggingMessageNotification) -> None:
        level = notification.params.level
        owner = self._exchanges.owner()
        ctx = owner.ctx if owner is not None else None
        if owner is not None and ctx is not None:
            if ctx.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
                allowed = self._allows(host_of(ctx), level)
            else:
                allowed = level in allowed_log_levels(ctx.protocol_version, ctx.meta)
            if allowed:
                await owner.notify(notification)
            return
        await self._send(lambda s: s.send_notification(notification),
                         {h for h in self._hosts if self._allows(h, level)})

    def _allows(self, host: object, level: types.LoggingLevel) -> bool:
        floor = self._levels.get(host)
        return floor is None or _LEVELS.index(level) >= _LEVELS.index(floor)

    # -- requests that name no call -------------------------------------------------------------------------

    async def ask(self, request: types.InputRequest) -> Answer:
        """A handshake-era upstream's request (elicitation, sampling, roots), to the host of its call."""
        owner = self._exchanges.owner()
        if owner is None:
            log.warning("the upstream sent %s while no single client's call was in flight: refused, as nobody can "
                        "tell which client it is for", request.method)
            return types.ErrorData(code=INVALID_REQUEST, message="agentguard proxy: this request cannot be matched "
                                                                 "to the call it belongs to")
        params = request.params
        if isinstance(params, types.ElicitRequestURLParams) and params.elicitation_id is not None:
            self._url_asks[params.elicitation_id] = owner
        return await owner.ask(request)
