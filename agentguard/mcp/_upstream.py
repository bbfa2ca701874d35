"""The proxy's upstream: one MCP ``Client`` at a time, its transports, and the watch on its end of file.

The upstream is the real MCP server the proxy guards, started as a stdio subprocess or reached over
Streamable HTTP (or, in tests, an in-process server). Every connection lists the upstream's tools and checks
them against the config; so does every change the upstream announces. Failures are told apart by what they
mean for a call: it was certainly not sent (:class:`_Unavailable`, and :class:`_Unreachable` when no
connection can be made at all), or it was sent and no answer came back (:class:`_OutcomeUnknown`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client._transport import TransportStreams
from mcp.server import MCPServer, Server
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, REQUEST_TIMEOUT
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from ._config import Config

log = logging.getLogger("agentguard.mcp")

UpstreamTarget = Server[Any] | MCPServer | StdioServerParameters | str


class _OutcomeUnknown(Exception):
    """The upstream call was sent but no answer came back (the upstream died or timed out)."""


class _Unavailable(Exception):
    """The upstream could not be reached: the call was certainly not sent."""


class _Unreachable(_Unavailable):
    """No connection to the upstream could be made: its command cannot be started, it exits (or hangs up)
    at once, or it does not answer. Retrying does not help until a person fixes the proxy's configuration."""


class _NotGuarded(Exception):
    """The upstream does not offer a guarded tool as configured (any more): the call is refused, not sent."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


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


def config_target(config: Config, environ: Mapping[str, str]) -> TargetFactory:
    """The config's upstream: its command over stdio, or its URL over Streamable HTTP."""
    up = config.upstream
    if up.url is not None:
        url, headers = up.url, dict(up.headers)
        return lambda eof: _watched(_http(url, headers), eof)
    cmd, args = config.upstream_command()
    params = StdioServerParameters(command=cmd, args=args, env=config.upstream_env(environ), cwd=config.upstream_cwd())
    return lambda eof: _watched(stdio_client(params), eof)


def fixed_target(target: UpstreamTarget) -> TargetFactory:
    """Any ``Client`` target (an in-process server in tests), the same for every connection."""
    return lambda _eof: target


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
        """The live connection, or a new one. Raises _Unreachable if none can be made."""
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
                raise _Unreachable(_unreachable(box.get("error")))
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


def _unreachable(exc: BaseException | None) -> str:
    """Why no connection could be made (the upstream's own stderr, passed on to the proxy's, says more)."""
    if exc is None or (isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED):
        return "it closed the connection before it was ready: it may have exited at once (see its stderr)"
    return _describe(exc)


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, MCPError | OSError) else text
