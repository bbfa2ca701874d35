"""A fake payment provider on 127.0.0.1 that deduplicates like Stripe, for tests and examples.

It records every request with its ``Idempotency-Key`` and honours the key the way Stripe documents it:

- the first request with a key runs and its response (status and body) is stored;
- a later request with the same key and the same parameters gets the stored response again, with
  ``Idempotent-Replayed: true``, and creates nothing;
- the same key with different parameters is refused with 400 ``idempotency_error``;
- the same key while the first request is still being processed is refused with 409.

It speaks enough of Stripe's API for the official ``stripe`` client (form-encoded ``POST
/v1/payment_intents``, ``GET /v1/payment_intents/<id>``) and a JSON ``POST /v1/charges`` for plain httpx.

    with FakeProvider() as provider:
        client = stripe.StripeClient("sk_test_x", base_addresses={"api": provider.url}, max_network_retries=0)
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    idempotency_key: str | None
    params: dict[str, Any]
    replayed: bool
    status: int


@dataclass
class _Stored:
    params: dict[str, Any]
    status: int = 0
    body: bytes = b""
    done: threading.Event = field(default_factory=threading.Event)


class FakeProvider:
    def __init__(self, *, delay: float = 0.0) -> None:
        self.delay = delay
        self.requests: list[Seen] = []
        self.objects: dict[str, dict[str, Any]] = {}
        self._by_key: dict[tuple[str, str], _Stored] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "the provider is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeProvider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                provider._handle(self, "GET")

            def do_POST(self) -> None:
                provider._handle(self, "POST")

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-provider", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- what tests look at ------------------------------------------------------------------------------

    @property
    def charges(self) -> list[dict[str, Any]]:
        """Every object that was really created (money that moved)."""
        with self._lock:
            return list(self.objects.values())

    def keys(self, path: str | None = None) -> list[str | None]:
        with self._lock:
            return [r.idempotency_key for r in self.requests if path is None or r.path == path]

    # -- the server --------------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = urllib.parse.urlsplit(h.path).path
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        if "json" in (h.headers.get("Content-Type") or ""):
            params: dict[str, Any] = json.loads(raw or b"{}")
        else:
            params = {k: v[-1] for k, v in urllib.parse.parse_qs(raw.decode(), keep_blank_values=True).items()}
        key = h.headers.get("Idempotency-Key")
        status, body, replayed = self._respond(method, path, key, params)
        with self._lock:
            self.requests.append(Seen(method, path, key, params, replayed, status))
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Request-Id", f"req_{len(self.requests)}")
        if replayed:
            h.send_header("Idempotent-Replayed", "true")
        if key is not None:
            h.send_header("Idempotency-Key", key)
        h.end_headers()
        h.wfile.write(body)

    def _respond(self, method: str, path: str, key: str | None, params: dict[str, Any]) -> tuple[int, bytes, bool]:
        if method == "GET":
            obj = self.objects.get(path.rsplit("/", 1)[-1])
            return (200, _json(obj), False) if obj else (404, _error("invalid_request_error", "No such object"), False)
        if key is None or method != "POST":
            return (*self._create(path, params), False)
        with self._lock:
            stored = self._by_key.get((path, key))
            first = stored is None
            if first:
                stored = self._by_key[(path, key)] = _Stored(params)
        assert stored is not None
        if not first:
            if stored.params != params:
                return 400, _error("idempotency_error", "Keys for idempotent requests can only be used with "
                                   "the same parameters they were first used with."), False
            if not stored.done.is_set():
                return 409, _error("idempotency_error", "There is currently another in-progress request "
                                   "using this Idempotent Key."), False
            return stored.status, stored.body, True
        if self.delay:
            threading.Event().wait(self.delay)
        stored.status, stored.body = self._create(path, params)
        stored.done.set()
        return stored.status, stored.body, False

    def _create(self, path: str, params: dict[str, Any]) -> tuple[int, bytes]:
        try:
            amount = int(params.get("amount", 0))
        except (TypeError, ValueError):
            return 400, _error("invalid_request_error", "Invalid integer: amount")
        if amount <= 0:
            return 400, _error("invalid_request_error", "Amount must be positive")
        with self._lock:
            n = len(self.objects) + 1
            if path == "/v1/payment_intents":
                obj: dict[str, Any] = {
                    "id": f"pi_{n:06d}", "object": "payment_intent", "amount": amount,
                    "currency": params.get("currency", "usd"), "status": "succeeded", "livemode": False,
                    "metadata": {k[9:-1]: v for k, v in params.items() if k.startswith("metadata[")},
                }
            else:
                obj = {"id": f"ch_{n:06d}", "object": "charge", "amount": amount, "paid": True,
                       "order_id": params.get("order_id")}
            self.objects[obj["id"]] = obj
        return 200, _json(obj)


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _error(kind: str, message: str) -> bytes:
    return _json({"error": {"type": kind, "message": message}})
