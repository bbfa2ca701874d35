"""The provider of the chaos run: a local HTTP payment API that honours idempotency keys and counts charges.

``POST /charge`` with an ``Idempotency-Key`` header and a JSON body ``{"order": ..., "amount": ...}``: the
first request with a key creates a charge (``ch_<n>``) and stores its response; a later request with the same
key and body gets the stored response again, marked as a replay, and creates nothing; the same key with
another body is refused (400); a request whose key is still being processed is refused (409). ``GET /stats``
returns what happened: the charges created per order, the keys each order was charged under, the requests.

Also the clients the workers use: ``charge`` (async tools: one HTTP/1.0 request on asyncio's streams) and
``charge_sync`` (sync tools: the same request on ``http.client``), no dependency.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ProviderError(Exception):
    """The provider refused or failed a request (the guard releases the claim: the call may be retried)."""


class Provider:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[str, dict[str, Any]] = {}  # key -> {"body": ..., "response": ... | None}
        self.charges: dict[str, list[str]] = {}  # order -> charge ids created
        self.keys: dict[str, set[str]] = {}  # order -> idempotency keys seen
        self.requests = 0
        self.replayed = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Provider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                status, answer = provider.charge(self.headers.get("Idempotency-Key") or "", body)
                self._send(status, answer)

            def do_GET(self) -> None:
                self._send(200, provider.stats())

            def _send(self, status: int, answer: dict[str, Any]) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def charge(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if not key:
            return 400, {"error": "an Idempotency-Key is required"}
        order = str(body.get("order"))
        with self.lock:
            self.requests += 1
            self.keys.setdefault(order, set()).add(key)
            seen = self.by_key.get(key)
            if seen is not None:
                if seen["body"] != body:
                    return 400, {"error": "idempotency_error: the key was used with other parameters"}
                self.replayed += 1
                return 200, {**seen["response"], "replayed": True}
            created = f"ch_{sum(len(c) for c in self.charges.values()) + 1}"
            self.charges.setdefault(order, []).append(created)
            response = {"id": created, "order": order, "amount": body.get("amount")}
            self.by_key[key] = {"body": body, "response": response}
            return 200, {**response, "replayed": False}

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "charges": {o: list(c) for o, c in self.charges.items()},
                "keys": {o: sorted(k) for o, k in self.keys.items()},
                "requests": self.requests,
                "replayed": self.replayed,
            }


def _request(key: str, order: str, amount: int) -> tuple[bytes, dict[str, str]]:
    data = json.dumps({"order": order, "amount": amount}).encode()
    return data, {"Content-Type": "application/json", "Idempotency-Key": key, "Content-Length": str(len(data))}


def _answer(status: int, payload: bytes) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(payload)
    if status != 200:
        raise ProviderError(f"provider answered {status}: {answer.get('error')}")
    return answer


async def charge(url: str, key: str, order: str, amount: int) -> dict[str, Any]:
    """``POST /charge`` with ``key``; the provider's JSON answer, or ``ProviderError``."""
    host, port = url.removeprefix("http://").split(":")
    data, headers = _request(key, order, amount)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"POST /charge HTTP/1.0\r\nHost: provider\r\n"
                     + "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode() + b"\r\n" + data)
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return _answer(int(head.split(b" ", 2)[1]), payload)


def charge_sync(url: str, key: str, order: str, amount: int) -> dict[str, Any]:
    """``charge`` for sync tools: the same request, in the calling thread."""
    host, port = url.removeprefix("http://").split(":")
    data, headers = _request(key, order, amount)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/charge", body=data, headers=headers)
        response = conn.getresponse()
        return _answer(response.status, response.read())
    finally:
        conn.close()
