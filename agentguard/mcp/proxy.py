"""The guarding MCP proxy: ``agentguard mcp-proxy --config agentguard.toml``.

It sits between a host (Claude Code, Codex, any MCP client) and an upstream MCP server. ``tools/list`` is
relayed; each tool the config names gains a required ``task_id`` argument. A guarded call is claimed in the
store under ``(scope, task, tool + key fields)`` and forwarded upstream at most once, with the downstream key
in ``_meta["dev.agentguard/idempotency_key"]`` (and in ``forward_key_to``); its result is stored and replayed
to every later call, labelled as a replay. Every other tool passes through untouched.

Logs go to stderr only: stdout is the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import stat
import sys
import typing
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client._transport import TransportStreams
from mcp.server import MCPServer, Server, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, REQUEST_TIMEOUT
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from .. import _keys
from .._errors import GuardError, InProgressError, KeyReuseError, LeaseLostError, MissingTaskError, StoreError
from .._guard import Guard
from .._redact import redact_text, redact_url
from ._config import ENV_URL, Config, ConfigError, ToolConfig, load_config, tool_problems
from ._meta import (
    ABSENT,
    META_KEY,
    META_REPLAYED,
    TASK_ID_DESCRIPTION,
    audit_ids,
    clean_meta,
    nothing_executed,
    replay_note,
    resolve_task_id,
    task_refusal,
)

log = logging.getLogger("agentguard.mcp")

UpstreamTarget = Server[Any] | MCPServer | StdioServerParameters | str


class _OutcomeUnknown(Exception):
    """The upstream call was sent but no answer came back (the upstream died or timed out)."""


class _Unavailable(Exception):
    """The upstream could not be reached: the call was certainly not sent."""


class _RetryableError(Exception):
    """The upstream answered with an error that is not final: the claim is released for a retry."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__("upstream error result")
        self.payload = payload


class _FinalError(Exception):
    """An upstream error result the config declares final: stored and replayed like a result."""

    def __init__(self, payload_json: str) -> None:
        super().__init__(payload_json)


class _NotGuarded(Exception):
    """The upstream does not offer a guarded tool as configured (any more): the call is refused, not sent."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class StartupError(Exception):
    """The proxy cannot serve: its store cannot be used or its config does not match the upstream.

    ``problems`` lists each one (store URLs without their passwords); ``agentguard mcp-proxy`` prints them
    on stderr and exits with status 2 before answering anything.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = [redact_text(p) for p in problems]
        super().__init__("; ".join(self.problems))


class _HeldUnknown(Exception):
    """The outcome is unknown and the tool's policy is ``hold``: recorded, never run again."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


# -- the upstream connection ---------------------------------------------------------------------------


@dataclass(eq=False)
class _Connection:
    client: Client
    stop: anyio.Event
    tools: list[types.Tool] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)
    """Guarded tools that this upstream does not offer as configured: refused, never passed through."""
    stale: bool = False
    """The upstream said its tools changed and they were not listed again since."""
    changed: anyio.Event = field(default_factory=anyio.Event)
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    def tool(self, name: str) -> types.Tool | None:
        return next((t for t in self.tools if t.name == name), None)


Checker = Callable[[list[types.Tool]], dict[str, list[str]]]
"""Which guarded tools a tool list breaks, and how (``_config.tool_problems`` over the tools' schemas)."""


TargetFactory = Callable[[anyio.Event], Any]
"""Makes a fresh ``Client`` target for each connection; sets the event when the transport reaches EOF."""


@asynccontextmanager
async def _watched(
    inner: AbstractAsyncContextManager[TransportStreams], eof: anyio.Event
) -> AsyncIterator[TransportStreams]:
    """Relay a transport, setting ``eof`` when the upstream's side closes (it died, or hung up).

    A call made after that must not be sent into a dead connection: reconnecting first is safe, while a
    call that meets a closed connection mid-flight has an unknown outcome.
    """
    async with inner as (read, write):
        send, recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def pump() -> None:
            try:
                async with send:
                    async for item in read:
                        await send.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass
            finally:
                eof.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            try:
                yield recv, write
            finally:
                tg.cancel_scope.cancel()


@asynccontextmanager
async def _http(url: str, headers: Mapping[str, str]) -> AsyncIterator[TransportStreams]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(30.0, read=300.0)
    async with (
        httpx2.AsyncClient(headers=dict(headers), timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


class Upstream:
    """One upstream ``Client`` at a time, held open by a task of the proxy's task group.

    A client is entered and exited in the same task, so each connection lives in its own holder task.
    When the upstream dies, the connection is dropped and the next call reconnects. Every connection lists
    the upstream's tools and checks them against the config; so does every change the upstream announces
    (``notifications/tools/list_changed``, or a ``subscriptions/listen`` event on the 2026-07-28 era). A
    guarded tool the current tools break is refused, never passed through.
    """

    def __init__(
        self, tg: anyio.abc.TaskGroup, target: TargetFactory, *, mode: str, timeout: float, check: Checker,
        on_change: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self._tg = tg
        self._target = target
        self._mode = mode
        self.timeout = timeout
        self._check = check
        self._on_change = on_change
        self._lock = anyio.Lock()
        self._conn: _Connection | None = None
        self._seen: tuple[str, dict[str, list[str]]] | None = None  # the last tools listed, and their problems

    async def _hold(self, ready: anyio.Event, box: dict[str, Any]) -> None:
        conn: _Connection | None = None
        stop = anyio.Event()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification) and conn is not None:
                conn.stale = True  # at once: a guarded call arriving before the relist lists again first
                conn.changed.set()

        try:
            # The timeout bounds the handshake, each listing and a subscription's acknowledgment too: an
            # upstream that never answers fails the startup (or the reconnection) instead of hanging it.
            async with Client(self._target(stop), mode=self._mode, raise_exceptions=False,
                              read_timeout_seconds=self.timeout, message_handler=on_message, cache=None) as client:
                conn = _Connection(client, stop)
                async with anyio.create_task_group() as tg:
                    # Subscribed before the first listing, so no change can fall between the two.
                    await tg.start(self._listen, conn)
                    tg.start_soon(self._follow, conn)
                    async with conn.lock:
                        await self._list(conn)
                    box["conn"] = conn
                    ready.set()
                    await stop.wait()
                    tg.cancel_scope.cancel()
        except Exception as exc:
            box.setdefault("error", exc)
            if conn is not None:
                log.warning("the upstream connection ended: %s", _describe(exc))
        finally:
            stop.set()
            if conn is not None and self._conn is conn:
                self._conn = None
            ready.set()
        if conn is not None:
            log.info("the upstream connection closed; the next call reconnects")

    async def _listen(self, conn: _Connection, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        # On the 2026-07-28 era change notifications come only on a subscriptions/listen stream (the
        # handshake era sends them unasked). Its events reach on_message too.
        caps = conn.client.server_capabilities.tools
        if conn.client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS or caps is None or not caps.list_changed:
            task_status.started()
            return
        started = False
        try:
            async with conn.client.listen(tools_list_changed=True) as events:
                task_status.started()
                started = True
                async for _event in events:
                    conn.stale = True
                    conn.changed.set()
        except Exception as exc:  # the connection ended, or the upstream refused the stream
            if not started:
                log.warning("the upstream does not send its tool changes (%s): they are seen when a host lists "
                            "the tools or the proxy reconnects", _describe(exc))
                task_status.started()
            else:
                log.debug("the upstream's change notifications ended: %s", _describe(exc))

    async def _follow(self, conn: _Connection) -> None:
        while True:
            await conn.changed.wait()
            conn.changed = anyio.Event()
            try:
                await self.refresh(conn)
            except _Unavailable as exc:
                log.warning("could not list the upstream's tools after it announced a change: %s", exc)

    async def _list(self, conn: _Connection, *, announce: bool = True) -> None:
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await conn.client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        problems = self._check(tools)
        conn.tools, conn.problems = tools, problems
        listed = json.dumps([t.model_dump(mode="json", by_alias=True) for t in tools], sort_keys=True)
        seen, self._seen = self._seen, (listed, problems)
        if seen is None:
            return  # the first listing: checked by the proxy's startup, which refuses to serve on a problem
        if problems != seen[1]:
            for name in sorted(problems):
                log.error("%s is not guarded any more, so every call to it is refused: %s", name,
                          "; ".join(problems[name]))
            for name in sorted(set(seen[1]) - set(problems)):
                log.warning("%s matches the config again: it is guarded", name)
        if announce and listed != seen[0] and self._on_change is not None:
            self._tg.start_soon(self._on_change)

    async def refresh(self, conn: _Connection, *, announce: bool = True) -> None:
        """List the upstream's tools again (and check them); ``announce``: tell the host if they changed.
        Raises _Unavailable if the connection failed."""
        async with conn.lock:
            conn.stale = False  # a change announced while listing marks it stale again
            try:
                await self._list(conn, announce=announce)
            except Exception as exc:
                conn.stale = True
                if isinstance(exc, MCPError) and exc.code != CONNECTION_CLOSED:
                    raise _Unavailable(f"it failed to list its tools ({exc.error.message})") from exc
                self.drop(conn)
                raise _Unavailable(f"the connection ended while listing its tools ({_describe(exc)})") from exc

    async def connect(self) -> _Connection:
        conn = self._conn
        if conn is not None and not conn.stop.is_set():
            return conn
        async with self._lock:
            conn = self._conn
            if conn is not None and not conn.stop.is_set():
                return conn
            ready, box = anyio.Event(), dict[str, Any]()
            self._tg.start_soon(self._hold, ready, box)
            await ready.wait()
            if "conn" not in box or box["conn"].stop.is_set():
                raise _Unavailable(_describe(box.get("error")) if "error" in box else "it closed the connection")
            self._conn = box["conn"]
            log.info("connected to the upstream (%d tools)", len(box["conn"].tools))
            return self._conn

    async def ready_for(self, name: str) -> _Connection:
        """The connection to call guarded tool ``name`` on, its tools current. Raises _Unavailable or
        _NotGuarded: either way nothing was sent."""
        conn = await self.connect()
        if conn.stale:
            await self.refresh(conn)
        problems = conn.problems.get(name)
        if problems:
            raise _NotGuarded(problems)
        return conn

    def drop(self, conn: _Connection) -> None:
        conn.stop.set()
        if self._conn is conn:
            self._conn = None

    def close(self) -> None:
        if self._conn is not None:
            self.drop(self._conn)

    async def call(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any], conn: _Connection | None = None
    ) -> types.CallToolResult:
        """Call upstream (on ``conn`` if given). Raises _Unavailable (not sent), _OutcomeUnknown (sent, no
        answer) or MCPError."""
        conn = conn if conn is not None else await self.connect()
        try:
            return await conn.client.call_tool(
                name, arguments, read_timeout_seconds=self.timeout, meta=meta  # type: ignore[arg-type]
            )
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self.drop(conn)
                raise _OutcomeUnknown("the upstream server closed the connection mid-call") from exc
            if exc.code == REQUEST_TIMEOUT:
                raise _OutcomeUnknown(f"the upstream server did not answer within {self.timeout:g}s") from exc
            if exc.code == INTERNAL_ERROR:
                raise _OutcomeUnknown(f"the upstream server failed mid-call ({exc.error.message})") from exc
            raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            self.drop(conn)
            raise _OutcomeUnknown("the upstream server closed the connection mid-call") from exc


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, MCPError | OSError) else text


# -- results ---------------------------------------------------------------------------------------------


def _text(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def _payload(res: types.CallToolResult) -> dict[str, Any]:
    """What is stored for a result: content, structuredContent, isError and a clean _meta."""
    content = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in res.content]
    out: dict[str, Any] = {"content": content}
    if res.structured_content is not None:
        out["structuredContent"] = res.structured_content
    out["isError"] = bool(res.is_error)
    meta = clean_meta(res.meta)
    if meta:
        out["_meta"] = meta
    return out


def _result(payload: Mapping[str, Any], *, key: str | None, replayed: bool, note: str | None = None,
            mark: str | None = None) -> types.CallToolResult:
    res = types.CallToolResult.model_validate(dict(payload))
    meta = dict(res.meta or {})
    meta[META_REPLAYED] = replayed
    if key is not None:
        meta[META_KEY] = key
    update: dict[str, Any] = {"meta": meta}
    if note is not None:
        update["content"] = [types.TextContent(type="text", text=note), *res.content]
    if replayed and mark and isinstance(res.structured_content, dict):
        update["structured_content"] = {**res.structured_content, mark: True}
    return res.model_copy(update=update)


# -- the proxy -------------------------------------------------------------------------------------------


@dataclass
class _Runtime:
    guard: Guard
    upstream: Upstream


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
        self._store_from_env = config.store.url is None
        self._environ = environ
        self._target: TargetFactory = (
            (lambda _eof: upstream) if upstream is not None else self._config_target(environ)
        )
        self.inflight = 0
        self._idle = anyio.Event()
        self._idle.set()
        self.draining = False
        self._serving: _Runtime | None = None
        # The host is told when the tools the proxy offers change: on its connection (handshake era; the
        # session of its latest request sends on the connection's own channel, and over stdio the proxy has
        # one host) and on its subscriptions/listen streams (2026-07-28).
        self._host: ServerSession | None = None
        self._bus = InMemorySubscriptionBus()
        self.server: Server[_Runtime] = Server(
            config.proxy.name, version=_version(), lifespan=self._lifespan,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self._bus),
        )

    def _config_target(self, environ: Mapping[str, str]) -> TargetFactory:
        up = self.config.upstream
        if up.url is not None:
            url, headers = up.url, dict(up.headers)
            return lambda eof: _watched(_http(url, headers), eof)
        cmd, args = self.config.upstream_command()
        params = StdioServerParameters(
            command=cmd, args=args, env=self.config.upstream_env(environ), cwd=self.config.upstream_cwd()
        )
        return lambda eof: _watched(stdio_client(params), eof)

    def _check(self, tools: list[types.Tool]) -> dict[str, list[str]]:
        return tool_problems(self.config, {t.name: t.input_schema for t in tools})

    @asynccontextmanager
    async def running(self) -> AsyncIterator[_Runtime]:
        """Open the store and connect the upstream, check every guarded tool against the upstream's tools,
        then yield what the server runs on; closed (after the calls in flight) on exit.

        Raises :class:`StartupError` with every problem found, before anything is served: a guard that is
        not in place must not start. The upstream connection made to check the tools is the one served.
        """
        cfg = self.config
        try:
            guard = Guard(self._store_url, lease=cfg.store.lease, retention=cfg.store.retention,
                          wait_timeout=cfg.proxy.wait_timeout)
        except (ValueError, TypeError, GuardError) as exc:
            raise StartupError([f"{self._store_field()}: cannot use {redact_url(self._store_url)}: {exc}"]) from None
        problems: list[str] = []
        try:
            async with anyio.create_task_group() as tg:
                upstream = Upstream(tg, self._target, mode=cfg.upstream.mode, timeout=cfg.upstream.timeout,
                                    check=self._check, on_change=self._tools_changed)
                problems = await self._start(guard, upstream)
                if problems:
                    upstream.close()
                    tg.cancel_scope.cancel()
                else:
                    try:
                        yield _Runtime(guard, upstream)
                    finally:
                        # Calls in flight finish (or the process exits without releasing their claims)
                        # before the upstream is closed under them.
                        with anyio.CancelScope(shield=True):
                            await self.wait_idle(cfg.proxy.grace)
                            upstream.close()
                            tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await guard.aclose()
        if problems:
            raise StartupError(problems)

    async def _start(self, guard: Guard, upstream: Upstream) -> list[str]:
        """Every startup problem: the store's and the upstream's, checked side by side."""
        store: list[str] = []
        tools: list[str] = []

        async def open_store() -> None:
            problem = await self._open_store(guard)
            if problem is not None:
                store.append(problem)

        async def check_upstream() -> None:
            try:
                conn = await upstream.connect()
            except _Unavailable as exc:
                tools.append(f"upstream: the upstream server could not be started or reached: {exc}")
                return
            for problems in conn.problems.values():  # in the config's order
                tools.extend(problems)

        async with anyio.create_task_group() as tg:
            tg.start_soon(open_store)
            tg.start_soon(check_upstream)
        if not store and not tools:
            log.info("serving: the store is ready and the upstream offers every guarded tool (%s)",
                     ", ".join(sorted(self.config.tools)) or "none")
        return store + tools

    def _store_field(self) -> str:
        return f"store.url (from ${ENV_URL})" if self._store_from_env else self.config.where("store", "url")

    async def _open_store(self, guard: Guard) -> str | None:
        """None once the store is ready, else why it cannot be used. A store that cannot be reached
        (connection refused, timed out) is retried for ``store.startup_wait`` seconds first."""
        wait = self.config.store.startup_wait
        deadline = anyio.current_time() + wait
        delay = 0.1
        url = redact_url(self._store_url)
        while True:
            try:
                await guard.ensure_schema()
                return None
            except GuardError as exc:
                reason = redact_text(str(exc).removesuffix("; the tool was not run"))
                left = deadline - anyio.current_time()
                if not (isinstance(exc, StoreError) and exc.transient):
                    return f"{self._store_field()}: cannot use the store {url}: {reason}"
                if left <= 0:
                    waited = f" (retried for {wait:g}s: store.startup_wait)" if wait else ""
                    return f"{self._store_field()}: cannot reach the store {url}: {reason}{waited}"
                if delay == 0.1:
                    log.warning("cannot reach the store %s yet (%s); retrying for up to %gs (store.startup_wait)",
                                url, reason, wait)
                await anyio.sleep(min(delay, left))
                delay = min(delay * 2, 2.0)

    @asynccontextmanager
    async def _lifespan(self, _server: Server[_Runtime]) -> AsyncIterator[_Runtime]:
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
        self, ctx: ServerRequestContext[_Runtime], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self._host = ctx.session
        upstream = ctx.lifespan_context.upstream
        try:
            conn = await upstream.connect()
            # The upstream's tools as they are now, checked again. The host is not told about a change it is
            # being sent right now (a tool list that differs at every listing must not loop).
            await upstream.refresh(conn, announce=False)
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
        self, ctx: ServerRequestContext[_Runtime], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        rt = ctx.lifespan_context
        self._host = ctx.session
        meta = dict(ctx.meta or {})
        cfg = self.config.tools.get(params.name)
        if cfg is None:
            return await self._pass_through(rt, params.name, dict(params.arguments or {}), meta)
        if self.draining:
            return _text(nothing_executed(f"the agentguard proxy is shutting down, so {params.name} was not run. "
                                          "Retry the same call shortly."))
        self._enter()
        result: types.CallToolResult | None = None
        try:
            # Shielded: a client timeout cancels this handler, but claim, upstream call and record must stay
            # one unit, so the outcome is recorded and the retry gets it.
            with anyio.CancelScope(shield=True):
                result = await self._guarded(ctx, rt, params.name, cfg, dict(params.arguments or {}), meta)
        except Exception:
            log.exception("unexpected failure in the guarded call of %s", params.name)
            result = _text(f"agentguard failed unexpectedly while guarding {params.name}; the outcome is unknown. "
                           "Retry the same call with the same task_id: it is replayed or run at most once.")
        finally:
            self._leave()
        assert result is not None
        return result

    def _enter(self) -> None:
        self.inflight += 1
        self._idle = anyio.Event()

    def _leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def _pass_through(
        self, rt: _Runtime, name: str, arguments: dict[str, Any], meta: dict[str, Any]
    ) -> types.CallToolResult:
        try:
            res = await rt.upstream.call(name, arguments, clean_meta(meta))
        except _Unavailable as exc:
            return _text(f"the upstream server is not available ({exc}); {name} was not run.")
        except _OutcomeUnknown as exc:
            return _text(f"{exc}; the outcome of {name} is unknown. The proxy reconnects on the next call.")
        except MCPError as exc:
            return _text(f"the upstream server refused {name}: {exc.error.message}")
        return res.model_copy(update={"meta": clean_meta(res.meta) or None})

    async def _guarded(
        self,
        ctx: ServerRequestContext[_Runtime],
        rt: _Runtime,
        name: str,
        cfg: ToolConfig,
        arguments: dict[str, Any],
        meta: dict[str, Any],
    ) -> types.CallToolResult:
        given = arguments.pop("task_id", ABSENT)
        try:
            task_id = resolve_task_id(name, given, meta, self._environ)
        except MissingTaskError as exc:
            return _text(task_refusal(name, exc))
        forward = cfg.forward_key_to
        if forward is not None:
            arguments.pop(forward, None)  # the proxy chooses the key, never the model
        fp_args = {k: v for k, v in arguments.items() if k not in cfg.ignore}
        key_values = {k: arguments.get(k) for k in cfg.key}
        scope = self.config.store.scope
        try:
            operation = _keys.operation_name(name, key_values or None)
        except (TypeError, ValueError) as exc:  # a key value with no canonical form (a lone surrogate)
            return _text(nothing_executed(f"agentguard refused to run {name}: {exc}."))
        key = _keys.derive_key(scope, task_id, operation)
        policy = cfg.unknown_policy
        ran = False

        async def body(downstream_key: str) -> dict[str, Any]:
            nonlocal ran
            # Checked on the connection the call goes out on (it may be new, or its tools may have changed):
            # a tool the upstream no longer offers as configured is refused, never sent unguarded.
            conn = await rt.upstream.ready_for(name)
            send = dict(arguments)
            tool = conn.tool(name)
            if given is not ABSENT and tool is not None and "task_id" in (tool.input_schema.get("properties") or {}):
                send["task_id"] = task_id  # the upstream takes a task_id of its own: it gets the one sent
            if forward:
                send[forward] = downstream_key
            ran = True
            try:
                res = await rt.upstream.call(name, send, {**clean_meta(meta), META_KEY: downstream_key}, conn)
            except _OutcomeUnknown as exc:
                if policy == "hold":
                    raise _HeldUnknown(
                        f"the outcome of {operation} in task {task_id!r} is unknown: {exc}. agentguard will not "
                        "run it again. Check with the provider whether it happened before doing anything else; "
                        "if it did not, use a new task id."
                    ) from None
                raise
            except MCPError as exc:
                raise _RetryableError(_payload(_text(
                    f"the upstream server refused {name}: {exc.error.message}"))) from None
            payload = _payload(res)
            if res.is_error:
                if cfg.errors_final:
                    raise _FinalError(json.dumps(payload))
                raise _RetryableError(payload)
            return payload

        on_conflict: Literal["wait", "raise"] = (
            "raise" if (cfg.on_conflict or self.config.proxy.on_conflict) == "error" else "wait"
        )
        try:
            outcome = await rt.guard.run(
                name, body, arguments=fp_args, key=key_values or None, task_id=task_id, scope=scope,
                cache_errors=(_FinalError, _HeldUnknown), on_conflict=on_conflict,
                wait_timeout=cfg.wait_timeout or self.config.proxy.wait_timeout,
                audit=audit_ids(meta, ctx.request_id, _client_name(ctx), ctx.protocol_version),
            )
        except _RetryableError as exc:
            # Not final: the claim was released, so a retry goes upstream again with the same key.
            return _result(exc.payload, key=key, replayed=False)
        except _FinalError as exc:
            note = None if ran else replay_note(operation, task_id)
            return _result(json.loads(exc.args[0]), key=key, replayed=not ran, note=note, mark=cfg.mark_structured)
        except _HeldUnknown as exc:
            return _text(str(exc) if ran else nothing_executed(f"{exc} (recorded earlier)"))
        except _OutcomeUnknown as exc:
            return _text(
                f"{exc}; the outcome of {operation} is unknown. The claim was released: retry the same call with "
                "the same task_id and it goes upstream with the same idempotency key, so the provider "
                "deduplicates it."
            )
        except _Unavailable as exc:
            return _text(nothing_executed(f"the upstream server is not available ({exc}), so {name} was not run. "
                                          "Retry the same call shortly."))
        except _NotGuarded as exc:
            return _text(nothing_executed(
                f"agentguard refused to run {name}: the upstream server no longer offers it as the proxy's config "
                f"describes it ({exc}), so the call cannot be guarded. It is refused until the upstream offers it "
                "again as configured."
            ))
        except GuardError as exc:
            return _text(redact_text(_refusal(exc, ran)))
        except (TypeError, ValueError) as exc:
            if ran:
                raise
            # Arguments without a canonical form (a lone surrogate, nesting past the limit): refused up front.
            return _text(nothing_executed(f"agentguard refused to run {name}: {exc}."))
        if outcome.replayed:
            return _result(outcome.value, key=outcome.key, replayed=True,
                           note=replay_note(operation, task_id), mark=cfg.mark_structured)
        return _result(outcome.value, key=outcome.key, replayed=False)


def _refusal(exc: GuardError, ran: bool) -> str:
    if isinstance(exc, KeyReuseError):
        differ = ", ".join(exc.differing) or "unknown arguments"
        return nothing_executed(
            f"agentguard refused to run {exc.operation}: in task {exc.task_id!r} it was already called with "
            f"different arguments (differing: {differ}). A different operation needs a different task id or "
            "key field; to repeat the first call, send exactly its arguments."
        )
    if isinstance(exc, InProgressError):
        return nothing_executed(
            f"{exc.operation} in task {exc.task_id!r} is being run by another call right now, so this call did "
            "not run it. Retry the same call shortly to get its result."
        )
    if isinstance(exc, MissingTaskError):
        return nothing_executed(f"agentguard refused to run the tool: {exc}")
    if isinstance(exc, LeaseLostError):
        return (f"{exc.operation}: the upstream call was made, but another worker took the claim over meanwhile, "
                "so this result was not recorded. Retry the same call to get the recorded result.")
    if isinstance(exc, StoreError) and (exc.body_ran or ran):
        return ("the upstream call was made but agentguard could not record its result; the claim stays held "
                "and a retry with the same task_id goes upstream with the same idempotency key after its lease.")
    if ran:
        return f"agentguard failed after the upstream call was made ({exc}); retry the same call with the same task_id."
    return nothing_executed(f"agentguard could not run the call safely ({exc}).")


def _client_name(ctx: ServerRequestContext[Any]) -> str | None:
    try:
        params = ctx.session.client_params
        return None if params is None else f"{params.client_info.name}/{params.client_info.version}"
    except Exception:  # the 2026 era and in-process connections may have no handshake params
        return None


def _version() -> str:
    from .. import __version__

    return __version__


# -- the command -------------------------------------------------------------------------------------------


class _RedactingFormatter(logging.Formatter):
    """Every line the proxy logs, tracebacks included, without a store (or upstream) password."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def _configure_logging() -> None:
    level = os.environ.get("AGENTGUARD_LOG", "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter("agentguard-proxy %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("agentguard")
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))


class _Stdin:
    """The protocol's input: lines from stdin read without a worker thread, so input can be ended at will.

    The SDK reads stdin in a thread blocked in read(); after a signal the host may keep the pipe open, and
    that thread would keep the process alive. Ending our own reader instead is the same as the host hanging
    up: the server loop ends, every answer already produced is flushed, then the lifespan closes.
    """

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    @classmethod
    async def open(cls) -> _Stdin | None:
        loop = asyncio.get_running_loop()
        mode = os.fstat(sys.stdin.fileno()).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or sys.stdin.isatty()):
            # A regular file or a device such as /dev/null: the event loop cannot watch it (asyncio accepts
            # a device, then never reads it), so the SDK's reader thread reads it.
            return None
        reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
        pipe = os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0)
        try:
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        except (OSError, ValueError):  # only pipes, sockets and terminals can be watched
            pipe.close()
            return None
        return cls(reader)

    def end(self) -> None:
        self._reader.feed_eof()

    def __aiter__(self) -> _Stdin:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


async def _serve(proxy: GuardingProxy) -> None:
    # Checked first, served second: a StartupError leaves before a byte is written on stdout.
    async with proxy.running() as runtime:
        proxy._serving = runtime
        try:
            await _serve_stdio(proxy)
        finally:
            proxy._serving = None


async def _serve_stdio(proxy: GuardingProxy) -> None:
    from mcp.server.stdio import stdio_server

    stdin = await _Stdin.open()
    async with anyio.create_task_group() as tg:

        async def on_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    if proxy.draining:
                        log.warning("second signal: exiting now; claims in flight are left to expire")
                        _hard_exit(1)
                    proxy.draining = True
                    log.info("%s: finishing %d call(s) in flight, then exiting",
                             signal.Signals(signum).name, proxy.inflight)
                    tg.start_soon(drain)

        async def drain() -> None:
            if not await proxy.wait_idle(proxy.config.proxy.grace):
                # Never release blind: the upstream may have acted. The claims expire with their lease and the
                # next caller takes over with the same downstream key.
                log.warning("%d call(s) still in flight after %gs; exiting without releasing their claims",
                            proxy.inflight, proxy.config.proxy.grace)
                _hard_exit(1)
            if stdin is not None:
                stdin.end()  # as if the host hung up: answers already produced are still written
            else:
                tg.cancel_scope.cancel()

        tg.start_soon(on_signals)
        async with stdio_server(stdin=typing.cast("anyio.AsyncFile[str] | None", stdin)) as (read, write):
            try:
                options = proxy.server.create_initialization_options(NotificationOptions(tools_changed=True))
                await proxy.server.run(read, write, options)
            finally:
                if proxy.draining and stdin is None:
                    # The SDK's stdin thread stays blocked in read() until the host closes the pipe.
                    _hard_exit(0)
        tg.cancel_scope.cancel()


def _hard_exit(code: int) -> None:
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)


def main(config_path: str) -> int:
    """Entry of ``agentguard mcp-proxy --config FILE``: validate, then serve over stdio. Returns the exit code.

    Exits with 2, having printed every problem on stderr and nothing on stdout, when the config is invalid,
    the store cannot be used, or a guarded tool does not match what the upstream offers.
    """
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        _print_problems(f"invalid config {exc.path}", exc.problems)
        return 2
    _configure_logging()
    try:
        proxy = GuardingProxy(config)
    except (ValueError, TypeError) as exc:
        print(redact_text(f"agentguard mcp-proxy: {exc}"), file=sys.stderr)
        return 2
    try:
        anyio.run(_serve, proxy)
    except StartupError as exc:
        _print_problems(f"cannot serve with {config_path}", exc.problems)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _print_problems(what: str, problems: Sequence[str]) -> None:
    print(f"agentguard mcp-proxy: {what}:", file=sys.stderr)
    for problem in problems:
        print(redact_text(f"  - {problem}"), file=sys.stderr)
    print("nothing was served; fix the config (or the store, or the upstream) and start again.", file=sys.stderr)
