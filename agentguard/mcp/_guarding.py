"""The guarding proxy's two handlers: ``tools/list`` and ``tools/call``.

``tools/list`` relays the upstream's tools; each guarded one gains a required ``task_id`` and loses the
argument the proxy fills in with the downstream key. ``tools/call`` passes an unguarded tool through, and runs
a guarded one through :meth:`Guard.run`: the engine derives the key, claims it, and calls the upstream at most
once, with the downstream key in ``_meta`` (and in ``forward_key_to``); its result is stored and replayed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.server import Server, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types import INTERNAL_ERROR

from .._errors import GuardError, MissingTaskError
from .._refusals import refusal, unusable_arguments
from ._config import Config, ToolConfig
from ._meta import (
    ABSENT,
    META_KEY,
    TASK_ID_DESCRIPTION,
    TASK_ID_FIX,
    audit_ids,
    clean_meta,
    replay_note,
    resolve_task_id,
)
from ._results import (
    error_result,
    failed_unexpectedly,
    held_replay,
    not_guarded,
    outcome_unknown_held,
    outcome_unknown_passed,
    outcome_unknown_retry,
    payload,
    result,
    shutting_down,
    upstream_refused,
    upstream_unavailable,
    upstream_unreachable,
)
from ._startup import Runtime, open_runtime
from ._upstream import (
    TargetFactory,
    UpstreamTarget,
    _NotGuarded,
    _OutcomeUnknown,
    _Unavailable,
    _Unreachable,
    config_target,
    fixed_target,
)

log = logging.getLogger("agentguard.mcp")

# Stored records name the class of a cached error (``module:qualname``): these two keep the name they had
# before the proxy was split into modules, so records written earlier, or by an older proxy sharing the
# store, still replay.
_STORED_AS = "agentguard.mcp.proxy"


class _RetryableError(Exception):
    """The upstream answered with an error that is not final: the claim is released for a retry."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__("upstream error result")
        self.payload = payload


class _FinalError(Exception):
    """An upstream error result the config declares final: stored and replayed like a result."""

    def __init__(self, payload_json: str) -> None:
        super().__init__(payload_json)


class _HeldUnknown(Exception):
    """The outcome is unknown and the tool's policy is ``hold``: recorded, never run again."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


_FinalError.__module__ = _HeldUnknown.__module__ = _STORED_AS


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
        # The host is told when the tools the proxy offers change: on its connection (handshake era; the
        # session of its latest request sends on the connection's own channel, and over stdio the proxy has
        # one host) and on its subscriptions/listen streams (2026-07-28).
        self._host: ServerSession | None = None
        self._bus = InMemorySubscriptionBus()
        self.server: Server[Runtime] = Server(
            config.proxy.name, version=_version(), lifespan=self._lifespan,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self._bus),
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Runtime]:
        """Open the store and connect the upstream, check every guarded tool against the upstream's tools,
        then yield what the server runs on; closed (after the calls in flight) on exit.

        Raises :class:`StartupError` with every problem found, before anything is served: a guard that is
        not in place must not start. The upstream connection made to check the tools is the one served.
        """
        async with open_runtime(self.config, self._store_url, target=self._target,
                                on_change=self._tools_changed) as runtime:
            try:
                yield runtime
            finally:
                # Calls in flight finish (or the process exits without releasing their claims) before the
                # upstream is closed under them.
                with anyio.CancelScope(shield=True):
                    await self.wait_idle(self.config.proxy.grace)

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
        await self._bus.publish(ToolsListChanged())
        if self._host is not None:
            with contextlib.suppress(Exception):  # a host that hung up
                await self._host.send_tool_list_changed()

    async def wait_idle(self, grace: float) -> bool:
        with anyio.move_on_after(grace):
            await self._idle.wait()
        return self.inflight == 0

    # -- tools/list ---------------------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Runtime], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self._host = ctx.session
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
        return types.ListToolsResult(tools=[self._relay_tool(t) for t in conn.tools if t.name not in conn.problems])

    def _relay_tool(self, tool: types.Tool) -> types.Tool:
        cfg = self.config.tools.get(tool.name)
        if cfg is None:
            return tool
        schema = json.loads(json.dumps(tool.input_schema))
        props: dict[str, Any] = schema.setdefault("properties", {})
        required: list[str] = [r for r in schema.get("required", []) if r != cfg.forward_key_to]
        if cfg.forward_key_to:
            props.pop(cfg.forward_key_to, None)  # the proxy fills it in: the model never chooses the key
        props["task_id"] = {"type": "string", "minLength": 1, "description": TASK_ID_DESCRIPTION}
        if "task_id" not in required:
            required.append("task_id")
        schema["required"] = required
        update: dict[str, Any] = {
            "input_schema": schema,
            "description": ((tool.description or "").rstrip() + "\n\n" if tool.description else "")
            + "Guarded by agentguard: safe to retry with the same task_id; a repeat returns the first result.",
        }
        if cfg.mark_structured and tool.output_schema is not None:
            out = json.loads(json.dumps(tool.output_schema))
            out.setdefault("properties", {})[cfg.mark_structured] = {
                "type": "boolean", "description": "true when this result is a replay of an earlier call",
            }
            update["output_schema"] = out
        return tool.model_copy(update=update)

    # -- tools/call ---------------------------------------------------------------------------------------

    async def _call_tool(
        self, ctx: ServerRequestContext[Runtime], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        rt = ctx.lifespan_context
        self._host = ctx.session
        meta = dict(ctx.meta or {})
        cfg = self.config.tools.get(params.name)
        if cfg is None:
            return await self._pass_through(rt, params.name, dict(params.arguments or {}), meta)
        if self.draining:
            return error_result(shutting_down(params.name))
        self._enter()
        res: types.CallToolResult | None = None
        try:
            # Shielded: a client timeout cancels this handler, but claim, upstream call and record must stay
            # one unit, so the outcome is recorded and the retry gets it.
            with anyio.CancelScope(shield=True):
                res = await self._guarded(ctx, rt, params.name, cfg, dict(params.arguments or {}), meta)
        except Exception:
            log.exception("unexpected failure in the guarded call of %s", params.name)
            res = error_result(failed_unexpectedly(params.name))
        finally:
            self._leave()
        assert res is not None
        return res

    def _enter(self) -> None:
        self.inflight += 1
        self._idle = anyio.Event()

    def _leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def _pass_through(
        self, rt: Runtime, name: str, arguments: dict[str, Any], meta: dict[str, Any]
    ) -> types.CallToolResult:
        try:
            res = await rt.upstream.call(name, arguments, clean_meta(meta))
        except _Unavailable as exc:
            return _not_sent(name, exc)
        except _OutcomeUnknown as exc:
            return error_result(outcome_unknown_passed(name, exc))
        except MCPError as exc:
            return error_result(upstream_refused(name, exc.error.message))
        return res.model_copy(update={"meta": clean_meta(res.meta) or None})

    async def _guarded(
        self,
        ctx: ServerRequestContext[Runtime],
        rt: Runtime,
        name: str,
        cfg: ToolConfig,
        arguments: dict[str, Any],
        meta: dict[str, Any],
    ) -> types.CallToolResult:
        given = arguments.pop("task_id", ABSENT)
        try:
            task_id = resolve_task_id(name, given, meta, self._environ)
        except MissingTaskError as exc:
            return error_result(refusal(exc, fix=TASK_ID_FIX))
        forward = cfg.forward_key_to
        if forward is not None:
            arguments.pop(forward, None)  # the proxy chooses the key, never the model
        sent: str | None = None  # the downstream key, once the call went upstream

        async def body(downstream_key: str) -> dict[str, Any]:
            nonlocal sent
            # Checked on the connection the call goes out on (it may be new, or its tools may have changed):
            # a tool the upstream no longer offers as configured is refused, never sent unguarded.
            conn = await rt.upstream.ready_for(name)
            send = dict(arguments)
            tool = conn.tool(name)
            if given is not ABSENT and tool is not None and "task_id" in (tool.input_schema.get("properties") or {}):
                send["task_id"] = task_id  # the upstream takes a task_id of its own: it gets the one sent
            if forward:
                send[forward] = downstream_key
            sent = downstream_key
            try:
                res = await rt.upstream.call(name, send, {**clean_meta(meta), META_KEY: downstream_key}, conn)
            except _OutcomeUnknown as exc:
                if cfg.unknown_policy == "hold":
                    raise _HeldUnknown(outcome_unknown_held(name, task_id, exc)) from None
                raise
            except MCPError as exc:
                raise _RetryableError(payload(error_result(upstream_refused(name, exc.error.message)))) from None
            if res.is_error and cfg.errors_final:
                # Stored with its key: a replay of a cached error gets no Outcome to take the key from.
                raise _FinalError(json.dumps(payload(res, key=downstream_key)))
            if res.is_error:
                raise _RetryableError(payload(res))
            return payload(res)

        on_conflict: Literal["wait", "raise"] = (
            "raise" if (cfg.on_conflict or self.config.proxy.on_conflict) == "error" else "wait"
        )
        try:
            outcome = await rt.guard.run(
                name, body, arguments={k: v for k, v in arguments.items() if k not in cfg.ignore},
                key={k: arguments.get(k) for k in cfg.key} or None, task_id=task_id, scope=self.config.store.scope,
                cache_errors=(_FinalError, _HeldUnknown), on_conflict=on_conflict,
                wait_timeout=cfg.wait_timeout or self.config.proxy.wait_timeout,
                audit=audit_ids(meta, ctx.request_id, _client_name(ctx), ctx.protocol_version),
            )
        except _RetryableError as exc:
            # Not final: the claim was released, so a retry goes upstream again with the same key.
            return result(exc.payload, key=sent, replayed=False)
        except _FinalError as exc:
            stored = json.loads(exc.args[0])
            if sent is not None:
                return result(stored, key=sent, replayed=False)
            return result(stored, key=None, replayed=True, note=replay_note(name, task_id), mark=cfg.mark_structured)
        except _HeldUnknown as exc:
            return error_result(str(exc) if sent is not None else held_replay(str(exc)))
        except _OutcomeUnknown as exc:
            return error_result(outcome_unknown_retry(name, exc))
        except _Unavailable as exc:
            return _not_sent(name, exc)
        except _NotGuarded as exc:
            return error_result(not_guarded(name, exc))
        except GuardError as exc:
            return error_result(refusal(exc, ran=sent is not None))
        except (TypeError, ValueError) as exc:
            if sent is not None:
                raise
            # Raised by the engine before the body ran: arguments without a canonical form (a lone surrogate,
            # nesting past the limit) cannot be keyed or fingerprinted.
            return error_result(unusable_arguments(name, exc))
        note = replay_note(outcome.operation, task_id) if outcome.replayed else None
        return result(outcome.value, key=outcome.key, replayed=outcome.replayed, note=note, mark=cfg.mark_structured)


def _not_sent(tool: str, exc: _Unavailable) -> types.CallToolResult:
    """The upstream was not reached: a set-up error a person must fix, or a connection that just failed."""
    if isinstance(exc, _Unreachable):
        return error_result(upstream_unreachable(tool, exc))
    return error_result(upstream_unavailable(tool, exc))


def _client_name(ctx: ServerRequestContext[Any]) -> str | None:
    try:
        params = ctx.session.client_params
        return None if params is None else f"{params.client_info.name}/{params.client_info.version}"
    except Exception:  # the 2026 era and in-process connections may have no handshake params
        return None


def _version() -> str:
    from .. import __version__

    return __version__
