"""The command: open the store, make the token, listen, print the URL with the token, serve until stopped.

The socket is bound and listening before the URL is printed, so whoever reads the URL (a person, a test) can
connect at once; ``--port 0`` picks a free port and the URL names it. Nothing is printed before the store
answered a read: a console on a store it cannot read refuses to start. uvicorn's access log is off (an
address opened with ``?token=`` would put the token in it); SIGINT and SIGTERM stop the server gracefully.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import TextIO

import uvicorn

from .._errors import StoreError
from .._redact import redact_url
from ..stores import _console as views
from ._app import Console
from ._auth import Gate, is_loopback, new_token


class ServeError(Exception):
    """The console could not start (the address is taken, the store cannot be read): said on stderr, exit 1."""


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(url: str, *, host: str = "127.0.0.1", port: int = 8765, out: TextIO | None = None) -> int:
    """Serve the console of the store at ``url`` on ``host:port`` until interrupted; returns the exit status."""
    out = out or sys.stdout
    sock = _listen(host, port)
    bound = sock.getsockname()[1]
    token = new_token()
    console = Console(url, Gate(token, host, bound))
    server = uvicorn.Server(uvicorn.Config(console.app(), log_level="warning", access_log=False, lifespan="on",
                                           timeout_graceful_shutdown=5))
    shown = f"[{host}]" if ":" in host else host
    address = f"http://{shown}:{bound}/"

    async def run() -> None:
        try:
            await views.tasks(console.store, limit=1)  # the store answers, or the console does not start
        except StoreError as exc:
            await console.guard.aclose()
            raise ServeError(f"cannot read the store: {exc}") from None
        print(f"agentguard console on {redact_url(url)}", file=out)
        if not is_loopback(host):
            print(f"  listening on {host}, not only this machine: anyone who reaches it can read the page",
                  file=out)
        print(f"  to act (settle held outcomes, see values), open: {address}?token={token}", file=out)
        print(f"  read-only: {address}", file=out, flush=True)
        await server.serve(sockets=[sock])

    try:
        asyncio.run(run())
    finally:
        sock.close()
    return 0
