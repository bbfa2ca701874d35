"""``agentguard mcp-proxy --http`` as the tests run it: the real command as a subprocess (its stderr read all
along, its URL taken from it), a host connected to it with the real ``mcp`` Client, and any ASGI app (an HTTP
upstream, an authorization server, a balancer) served on a loopback port of the test's own."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

import agentguard

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_ROOT = Path(agentguard.__file__).resolve().parent.parent
TOKEN = "test-token-" + "x" * 24
URL = re.compile(r"serving Streamable HTTP on (\S+)")


@dataclass
class Proxy:
    process: anyio.abc.Process
    url: str
    stderr: list[str]

    def said(self, text: str) -> int:
        """How many lines of its stderr so far contain ``text``."""
        return sum(text in line for line in self.stderr)

    async def saying(self, text: str, times: int = 1) -> None:
        """Until its stderr said ``text`` (``times`` times): what another process logs is polled, no event
        crosses that boundary."""
        while self.said(text) < times:  # noqa: ASYNC110
            await anyio.sleep(0.02)


def env(**more: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENTGUARD_")}
    return {**base, "PYTHONPATH": str(PACKAGE_ROOT), **more}


@contextlib.asynccontextmanager
async def http_proxy(config: Path, *, address: str = "127.0.0.1:0", token: str | None = TOKEN,
                     log_level: str | None = None) -> AsyncIterator[Proxy]:
    """The command, serving; its stderr is read all along (and kept) so that it never blocks on a full pipe.
    ``log_level``: its ``AGENTGUARD_LOG`` (``DEBUG`` logs the guard's events, a duplicate's wait among them)."""
    async with http_proxies([config], address=address, token=token, log_level=log_level) as (proxy,):
        yield proxy


@contextlib.asynccontextmanager
async def http_proxies(configs: list[Path], *, address: str = "127.0.0.1:0", token: str | None = TOKEN,
                       log_level: str | None = None) -> AsyncIterator[tuple[Proxy, ...]]:
    """:func:`http_proxy` for several commands at once (replicas), started side by side."""
    extra = {"AGENTGUARD_PROXY_TOKEN": token} if token is not None else {}
    if log_level is not None:
        extra["AGENTGUARD_LOG"] = log_level
    async with contextlib.AsyncExitStack() as stack, anyio.create_task_group() as tg:
        proxies: list[Proxy] = []
        readies: list[anyio.Event] = []
        for config in configs:
            cmd = [sys.executable, "-m", "agentguard.cli", "mcp-proxy", "--config", str(config), "--http", address]
            proc = await stack.enter_async_context(
                await anyio.open_process(cmd, env=env(**extra), cwd=config.parent, stdin=subprocess.DEVNULL))
            proxies.append(Proxy(proc, "", []))
            readies.append(anyio.Event())
            tg.start_soon(_drain, proxies[-1], readies[-1])
        with anyio.fail_after(60):
            for ready in readies:
                await ready.wait()
        for proxy in proxies:
            assert proxy.url, "\n".join(proxy.stderr)
        try:
            yield tuple(proxies)
        finally:
            for proxy in proxies:
                if proxy.process.returncode is None:
                    proxy.process.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                for proxy in proxies:
                    await proxy.process.wait()
            tg.cancel_scope.cancel()


async def _drain(proxy: Proxy, ready: anyio.Event) -> None:
    """Its stderr, line by line, until it ends; ``ready`` once it said where it serves (or ended)."""
    assert proxy.process.stderr is not None
    buffer = b""
    async for chunk in proxy.process.stderr:
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            proxy.stderr.append(line.decode())
            if (match := URL.search(proxy.stderr[-1])) is not None:
                proxy.url = match.group(1)
                ready.set()
    ready.set()


@contextlib.asynccontextmanager
async def host(url: str, mode: str, *, token: str | None = TOKEN, **options: Any) -> AsyncIterator[Client]:
    """A host connected to the proxy over HTTP, with the bearer token on every request."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http, \
            Client(streamable_http_client(url, http_client=http), mode=mode, **options) as client:
        yield client


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.asynccontextmanager
async def serve_asgi(app: Any, *, path: str = "/mcp") -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a loopback port of its own until the block ends; yields its URL + ``path``."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # the test's signals are the test's
            yield

    sock = free_socket()
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=1)
    config.load()
    server = Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.main_loop)
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}{path}"
            finally:
                server.should_exit = True
    finally:
        with anyio.CancelScope(shield=True):
            await server.shutdown(sockets=[sock])
        sock.close()
