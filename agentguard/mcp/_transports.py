"""How the proxy reaches its upstream: a stdio subprocess, Streamable HTTP, or (in tests) an in-process server.

Each connection gets a fresh transport, watched for its end of file: a call made after the upstream's side
closed must not be sent into a dead connection (reconnecting first is safe), while a call that meets a closed
connection mid-flight has an unknown outcome. Failures are told apart by what they mean for a call: it was
certainly not sent (:class:`_Unavailable`, and :class:`_Unreachable` when no connection can be made at all),
or it was sent and no answer came back (:class:`_OutcomeUnknown`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
from mcp import MCPError, StdioServerParameters, stdio_client
from mcp.client._transport import TransportStreams
from mcp.server import MCPServer, Server
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED

from .._errors import NotStarted
from ._config import Config

UpstreamTarget = Server[Any] | MCPServer | StdioServerParameters | str

TargetFactory = Callable[[anyio.Event], Any]
"""Makes a fresh ``Client`` target for each connection; sets the event when the transport reaches EOF."""


class _OutcomeUnknown(Exception):
    """The upstream call was sent but no answer came back (the upstream died or timed out)."""


class _Unavailable(NotStarted):
    """The upstream could not be reached: the call was certainly not sent (so it binds no arguments)."""


class _Unreachable(_Unavailable):
    """No connection to the upstream could be made: its command cannot be started, it exits (or hangs up)
    at once, or it does not answer. Retrying does not help until a person fixes the proxy's configuration."""


class _NotGuarded(NotStarted):
    """The upstream does not offer a guarded tool as configured (any more): the call is refused, not sent."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@asynccontextmanager
async def _watched(
    inner: AbstractAsyncContextManager[TransportStreams], eof: anyio.Event
) -> AsyncIterator[TransportStreams]:
    """Relay a transport, setting ``eof`` when the upstream's side closes (it died, or hung up)."""
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
async def http_transport(url: str, headers: Mapping[str, str]) -> AsyncIterator[TransportStreams]:
    """Streamable HTTP with fixed headers (an ``Authorization`` one, say) on every request."""
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
        return lambda eof: _watched(http_transport(url, headers), eof)
    cmd, args = config.upstream_command()
    params = StdioServerParameters(command=cmd, args=args, env=config.upstream_env(environ), cwd=config.upstream_cwd())
    return lambda eof: _watched(stdio_client(params), eof)


def fixed_target(target: UpstreamTarget) -> TargetFactory:
    """Any ``Client`` target (an in-process server in tests), the same for every connection."""
    return lambda _eof: target


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
