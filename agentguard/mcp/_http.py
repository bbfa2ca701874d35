"""``agentguard mcp-proxy --config FILE --http [HOST:]PORT``: one guarding proxy, one upstream, many hosts.

The MCP endpoint is ``/mcp`` (Streamable HTTP): handshake-era sessions (``Mcp-Session-Id``) and the
2026-07-28 era's self-contained requests alike. Every request must carry ``Authorization: Bearer <token>``
(``[proxy] token``, else ``$AGENTGUARD_PROXY_TOKEN``), or, with ``[proxy.oauth]``, an OAuth 2.1 access token
meant for this proxy (``_oauth.py``); without either the proxy does not start. Any other request is answered
401 before it reaches the MCP server, let alone the upstream. The proxy binds to 127.0.0.1 unless
the address names another interface; on a loopback address it also refuses requests whose ``Host`` or
``Origin`` is not a loopback one (DNS rebinding). A host that disconnects mid-call does not split the call:
calls run in the proxy's own tasks (``_exchange.py``), and a guarded one runs to its end and is recorded.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import socket
from collections.abc import Iterator, Mapping
from typing import Any

import anyio
import anyio.abc

from ._config import Config
from ._oauth import AccessTokens, KeysUnavailable, oauth_app
from ._server import GuardingProxy
from ._startup import StartupError

log = logging.getLogger("agentguard.mcp")

ENV_TOKEN = "AGENTGUARD_PROXY_TOKEN"
MIN_TOKEN = 16


def http_token(config: Config, environ: Mapping[str, str]) -> str | None:
    """The bearer token HTTP requests must carry (None: access tokens only); ValueError if there is none and no
    ``[proxy.oauth]`` (or it is too short to guess)."""
    token = config.proxy.token or environ.get(ENV_TOKEN, "")
    if not token and config.proxy.oauth is not None:
        return None
    if not token:
        raise ValueError(f"serving over HTTP needs a bearer token: set `token` under [proxy] in the config, or "
                         f"${ENV_TOKEN} (or accept OAuth access tokens: [proxy.oauth])")
    if len(token) < MIN_TOKEN or token != token.strip():
        raise ValueError(f"the bearer token (${ENV_TOKEN}) must be at least {MIN_TOKEN} characters, without "
                         "surrounding blanks")
    return token


def parse_address(text: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[IPv6]:PORT``; the host defaults to 127.0.0.1."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") if sep else "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535 or (sep and not host):
        raise ValueError(f"--http takes [HOST:]PORT (e.g. 127.0.0.1:8765), not {text!r}")
    return host, int(port)


def url_of(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/mcp"


class BearerAuth:
    """ASGI middleware: an HTTP request without one ``Authorization: Bearer <token>`` header carrying exactly the
    token gets 401 and goes no further (the scheme's case does not matter, RFC 9110)."""

    def __init__(self, app: Any, token: str) -> None:
        self._app = app
        self._token = token.encode()

    def _allows(self, headers: list[tuple[bytes, bytes]]) -> bool:
        given = [v for k, v in headers if k.lower() == b"authorization"]
        scheme, _, token = given[0].partition(b" ") if len(given) == 1 else (b"", b"", b"")
        # Compared in constant time, whatever the scheme: the time taken says nothing of the token.
        return hmac.compare_digest(token, self._token) and scheme.lower() == b"bearer"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self._allows(scope["headers"]):
            log.warning("refused an HTTP request to %s without the right bearer token", scope.get("path"))
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"www-authenticate", b'Bearer realm="agentguard-proxy"'), (b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"401 Unauthorized: a bearer token is required\n"})
            return
        await self._app(scope, receive, send)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, reuse_port=False)


async def _app(proxy: GuardingProxy, host: str, url: str, token: str | None) -> Any:
    """The proxy's ASGI app behind its bearer token, or (``[proxy.oauth]``) as a resource server. Raises
    StartupError if the issuer's signing keys cannot be had."""
    oauth = proxy.config.proxy.oauth
    if oauth is None:
        assert token is not None
        return BearerAuth(proxy.server.streamable_http_app(host=host), token)
    verifier = AccessTokens(oauth, oauth.resource or url, token)
    try:
        await verifier.load()
    except KeysUnavailable as exc:
        raise StartupError([f"{proxy.config.where('proxy', 'oauth')}: {exc}"]) from None
    log.info("accepting OAuth access tokens of %s meant for %s%s", oauth.issuer, verifier.resource,
             " (and the bearer token)" if token else "")
    return oauth_app(proxy.server, host, oauth, verifier)


async def serve_http(
    proxy: GuardingProxy, host: str, port: int, token: str | None, *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``proxy`` (already started) over Streamable HTTP until cancelled; ``task_status`` gets its URL.
    Raises OSError if the address cannot be bound, StartupError if ``[proxy.oauth]``'s keys cannot be had."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # the proxy handles SIGINT/SIGTERM itself
            yield

    sock = _bind(host, port)
    try:
        app = await _app(proxy, host, url_of(host, sock.getsockname()[1]), token)
    except BaseException:
        sock.close()
        raise
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=2)
    config.load()
    server = Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    url = url_of(host, sock.getsockname()[1])
    log.info("serving Streamable HTTP on %s (every request needs %s)", url,
             "an access token" if proxy.config.proxy.oauth is not None else "the bearer token")
    task_status.started(url)
    try:
        await server.main_loop()
    finally:
        with anyio.CancelScope(shield=True):
            await server.shutdown(sockets=[sock])
