"""A small round-robin HTTP balancer on loopback, in front of replicas of ``agentguard mcp-proxy --http``.

Each request goes to the next replica, in turn per ``Mcp-Method`` (so that the calls of a test rotate over the
replicas whatever else is sent); a replica that refuses the connection (killed) is skipped, as a health check
would. A handshake-era session (``Mcp-Session-Id``) stays on the replica that opened it: it is state held in
that replica's memory. 2026-07-28 requests carry no session and go anywhere. Responses are streamed back as
they come (Server-Sent Events included). ``routed`` records where each request went.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx2

_HOP = {b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding"}


@dataclass
class Route:
    method: str | None
    replica: int
    session: str | None


@dataclass
class Balancer:
    replicas: list[str]
    """Each replica's base URL (``http://127.0.0.1:PORT``)."""
    routed: list[Route] = field(default_factory=list)
    _turn: dict[str | None, int] = field(default_factory=dict)
    _sessions: dict[str, int] = field(default_factory=dict)
    _http: httpx2.AsyncClient | None = None

    def calls(self) -> list[int]:
        """The replica each ``tools/call`` went to, in order."""
        return [r.replica for r in self.routed if r.method == "tools/call"]

    def _order(self, method: str | None, session: str | None) -> list[int]:
        if session is not None and session in self._sessions:
            return [self._sessions[session]]
        first = self._turn.get(method, 0)
        self._turn[method] = first + 1
        n = len(self.replicas)
        return [(first + i) % n for i in range(n)]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self._http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120))
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if self._http is not None:
                        await self._http.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        assert scope["type"] == "http" and self._http is not None
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k.lower() not in _HOP}
        method, session = headers.get("mcp-method"), headers.get("mcp-session-id")
        path = scope["path"] + (f"?{scope['query_string'].decode()}" if scope["query_string"] else "")
        for replica in self._order(method, session):
            request = self._http.build_request(scope["method"], self.replicas[replica] + path, headers=headers,
                                               content=body)
            route = Route(method, replica, session)
            self.routed.append(route)  # (before its answer: a test may look while it is in flight)
            try:
                response = await self._http.send(request, stream=True)
            except httpx2.ConnectError:
                self.routed.remove(route)
                continue  # a replica that is gone: the next one
            except httpx2.HTTPError:  # it went away with the request: it may have acted, so never sent twice
                break
            if (issued := response.headers.get("mcp-session-id")) is not None:
                self._sessions[issued] = replica
            try:
                await send({"type": "http.response.start", "status": response.status_code, "headers": [
                    (k.encode(), v.encode()) for k, v in response.headers.multi_items()
                    if k.lower().encode() not in _HOP or k.lower() == "content-length"]})
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            finally:
                await response.aclose()
            return
        await send({"type": "http.response.start", "status": 502, "headers": []})
        await send({"type": "http.response.body", "body": b"502 Bad Gateway: no answer from a replica\n"})
