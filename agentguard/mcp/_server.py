"""The guarding proxy: an MCP server in front of the upstream, guarding the tools its config names.

``tools/list`` relays the upstream's tools (``_tools.py``). ``tools/call`` runs a guarded tool through
:meth:`Guard.run` (``_guarded_call.py``) and passes any other one through; either way the call is an exchange
(``_exchange.py``), so the upstream's progress and questions reach the host, and a guarded call runs to its end
whatever the host does. Everything else (resources, prompts, completions, logging) is relayed (``_relay.py``),
and the upstream's notifications reach the hosts (``_hub.py``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.server import Server, ServerRequestContext
from mcp_types import INTERNAL_ERROR, METHOD_NOT_FOUND

from ._config import Config
from ._confirm import client_name
from ._exchange import Exchange, Exchanges, digest
from ._guarded_call import GuardedCall, not_sent
from ._hub import Hub
from ._meta import audit_ids
from ._relay import ProxyServer, Relayer, cleaned
from ._results import (
    error_result,
    failed_unexpectedly,
    outcome_unknown_passed,
    shutting_down,
    task_only,
    upstream_refused,
)
from ._startup import Runtime, open_runtime
from ._tools import listed, needs_task
from ._transports import (
    TargetFactory,
    UpstreamTarget,
    _OutcomeUnknown,
    _Unavailable,
    _Unreachable,
    config_target,
    fixed_target,
)
from ._upstream import Upstream

log = logging.getLogger("agentguard.mcp")


class GuardingProxy:
    """Build with a :class:`Config`; serve ``proxy.server`` (a low-level MCP ``Server``).

    ``upstream`` overrides the config's upstream with any ``Client`` target (an in-process server in tests).
    The store and the upstream are opened, and the config checked against the upstream's tools, before
    anything is served (:meth:`running`); a problem raises :class:`StartupError`.
    """

    def __init__(
        self, config: Config, *, upstream: UpstreamTarget | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        environ = os.environ if environ is None else environ
        self.config = config
        self._store_url = config.store_url(environ)
        self._environ = environ
        self._target: TargetFactory = fixed_target(upstream) if upstream is not None else config_target(config, environ)
        self.inflight = 0
        self._idle = anyio.Event()
        self._idle.set()
        self.draining = False
        self._serving: Runtime | None = None
        self._runtime: Runtime | None = None
        self.exchanges = Exchanges(config.proxy.input_timeout)
        self.hub = Hub(self.exchanges)
        self._relayer = Relayer(self.hub, self.exchanges, self._upstream)
        self.hub.set_upstream_level = self._relayer.set_upstream_level
        self.server = ProxyServer(
            config.proxy.name, version=_version(), lifespan=self._lifespan,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
        )
        self._relayer.register(self.server)
        self.server.upstream_capabilities = lambda: (
            self._runtime.upstream.capabilities if self._runtime is not None else None)

    def _upstream(self) -> Upstream:
        if self._runtime is None:
            raise MCPError(INTERNAL_ERROR, "agentguard proxy: not serving")
        return self._runtime.upstream

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Runtime]:
        """Open the store and connect the upstream, check every guarded tool against the upstream's tools,
        then yield what the server runs on; closed (after the calls in flight) on exit.

        Raises :class:`StartupError` with every problem found, before anything is served: a guard that is
        not in place must not start. The upstream connection made to check the tools is the one served.
        """
        async with open_runtime(self.config, self._store_url, target=self._target,
                                on_change=self._tools_changed, relay=self.hub) as runtime, \
                anyio.create_task_group() as tg:
            self._runtime = runtime
            self.exchanges.bind(tg)
            self.hub.resubscribe = runtime.upstream.subscribe
            self.server.instructions = self.server.instructions or runtime.upstream.instructions
            try:
                yield runtime
            finally:
                # Calls in flight finish (or the process exits without releasing their claims) before the
                # upstream is closed under them.
                with anyio.CancelScope(shield=True):
                    await self.wait_idle(self.config.proxy.grace)
                tg.cancel_scope.cancel()
                self.exchanges.bind(None)
                self.hub.resubscribe = None
                self._runtime = None

    @asynccontextmanager
    async def started(self) -> AsyncIterator[None]:
        """:meth:`running`, entered now rather than with each connection: ``agentguard mcp-proxy`` checks
        everything before it answers the host's handshake, and every connection is served on it."""
        async with self.running() as runtime:
            self._serving = runtime
            try:
                yield
            finally:
                self._serving = None

    @asynccontextmanager
    async def _lifespan(self, _server: Server[Runtime]) -> AsyncIterator[Runtime]:
        if self._serving is not None:  # `agentguard mcp-proxy`: started, and checked, before the handshake
            yield self._serving
            return
        async with self.running() as runtime:  # in-process use (tests): started with each connection
            yield runtime

    async def _tools_changed(self) -> None:
        """Tell the hosts that the proxy's tools changed, so they list them again."""
        await self.hub.changed(types.ToolListChangedNotification)

    async def wait_idle(self, grace: float) -> bool:
        with anyio.move_on_after(grace):
            await self._idle.wait()
        return self.inflight == 0

    # -- tools/list ---------------------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Runtime], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self.hub.seen(ctx)
        upstream = ctx.lifespan_context.upstream
        try:
            conn = await upstream.connect()
            # The upstream's tools as they are now, checked again. The host is not told about a change it is
            # being sent right now (a tool list that differs at every listing must not loop).
            await upstream.refresh(conn, announce=False)
        except _Unreachable as exc:
            raise MCPError(INTERNAL_ERROR, f"agentguard proxy: cannot reach its upstream server ({exc}); a person "
                                           "must fix the proxy's configuration") from None
        except _Unavailable as exc:
            raise MCPError(INTERNAL_ERROR, f"agentguard proxy: the upstream server is not available ({exc})") from None
        # A guarded tool the upstream no longer offers as configured is left out: calls to it are refused.
        return types.ListToolsResult(tools=listed(conn.tools, self.config, conn.problems))

    # -- tools/call ---------------------------------------------------------------------------------------

    async def _call_tool(
        self, ctx: ServerRequestContext[Runtime], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        rt = ctx.lifespan_context
        self.hub.seen(ctx)
        name, arguments = params.name, dict(params.arguments or {})
        if params.task is not None:
            raise MCPError(METHOD_NOT_FOUND, "agentguard proxy: tools are not run as MCP tasks here; call "
                                             f"{name} without `task`")
        cfg = self.config.tools.get(name)
        forward = self.hub.forward_meta(ctx, modern_upstream=rt.upstream.modern)
        if cfg is None:
            async def run(ex: Exchange) -> types.CallToolResult:
                return await self._pass_through(ex, rt, name, arguments, forward)
        else:
            if self.draining and params.request_state is None:
                return error_result(shutting_down(name))
            meta = dict(ctx.meta or {})
            call = GuardedCall(rt, self.config, name, cfg, arguments, meta, forward,
                               audit_ids(meta, ctx.request_id, client_name(ctx), ctx.protocol_version), self._environ)

            async def run(ex: Exchange) -> types.CallToolResult:
                return await self._guarded(ex, call)

        return await self.exchanges.serve(
            ctx, what=f"tools/call {name}", key=digest("tools/call", name, arguments), keep=cfg is not None,
            resume=params.request_state, responses=params.input_responses, run=run)

    async def _guarded(self, ex: Exchange, call: GuardedCall) -> types.CallToolResult:
        self.inflight += 1
        self._idle = anyio.Event()
        try:
            return await call.run(ex)
        except Exception:
            log.exception("unexpected failure in the guarded call of %s", call.name)
            return error_result(failed_unexpectedly(call.name))
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    async def _pass_through(
        self, ex: Exchange, rt: Runtime, name: str, arguments: dict[str, Any], meta: dict[str, Any]
    ) -> types.CallToolResult:
        try:
            conn = await rt.upstream.connect()
            if needs_task(conn.tool(name)):
                return error_result(task_only(name))
            with ex.upstream():
                res = await rt.upstream.call(name, arguments, meta, conn, progress=ex.progress, ask=ex.ask)
        except _Unavailable as exc:
            return not_sent(name, exc)
        except _OutcomeUnknown as exc:
            return error_result(outcome_unknown_passed(name, exc))
        except MCPError as exc:
            return error_result(upstream_refused(name, exc.error.message))
        return cleaned(res)


def _version() -> str:
    from .. import __version__

    return __version__
