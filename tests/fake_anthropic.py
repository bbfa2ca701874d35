"""A fake of Anthropic's Messages API on 127.0.0.1, for the frameworks that speak it: the Anthropic SDK's
tool runner and the Claude Code CLI under the Claude Agent SDK. No network, no API key.

Every ``POST /v1/messages`` is answered by ``script(body)``, a function of the request's JSON body returning
the content blocks of the assistant's reply (``[{"type": "tool_use", ...}]`` or ``[{"type": "text", ...}]``);
the stop reason follows from them. A request that continues a thread the server holds (the SDK's message
threads: only the new messages are sent, with ``thread.previous_message_id``) is handed to ``script`` with the
whole conversation. A request with ``"stream": true`` gets the same reply as server-sent
events, the way the real API streams it. Every request body is kept in ``requests``; other paths get a 404
in the API's error shape (a client that needs one of them says so in its error).

    with FakeMessagesAPI(script) as api:
        client = anthropic.Anthropic(api_key="test", base_url=api.url)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

Script = Callable[[dict[str, Any]], list[dict[str, Any]]]


def tool_results(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every ``tool_result`` block in a request's messages, by ``tool_use_id``."""
    out: dict[str, dict[str, Any]] = {}
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    out[block["tool_use_id"]] = block
    return out


def result_text(block: dict[str, Any]) -> str:
    """The text of a ``tool_result`` block, whether its content is a string or a list of text blocks."""
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))


class FakeMessagesAPI:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []  # with the whole conversation, also when a thread held it
        self._threads: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the fake API is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeMessagesAPI:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                if self.path.split("?")[0] != "/v1/messages":
                    return self._not_found(self.path)
                body = json.loads(raw or b"{}")
                with api._lock:
                    thread = body.get("thread") or {}
                    if thread.get("type") == "continue":  # the server holds the conversation: only new messages came
                        before = api._threads.get(thread.get("previous_message_id"))
                        if before is None:
                            return self._not_found("thread not found")
                        body["messages"] = [*before, *body.get("messages", [])]
                    api.requests.append(body)
                    n = len(api.requests)
                    content = api.script(body)
                    api._threads[f"msg_{n}"] = [*body.get("messages", []), {"role": "assistant", "content": content}]
                message = {
                    "id": f"msg_{n}", "type": "message", "role": "assistant", "model": body.get("model", "fake"),
                    "content": content,
                    "stop_reason": "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn",
                    "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
                }
                if body.get("stream"):
                    return self._stream(message)
                return self._json(200, message)

            def do_GET(self) -> None:
                self._not_found(self.path)

            def _not_found(self, what: str) -> None:
                self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": what}})

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def _json(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("request-id", "req_fake")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, message: dict[str, Any]) -> None:
                events: list[tuple[str, dict[str, Any]]] = [
                    ("message_start", {"type": "message_start", "message": {
                        **message, "content": [], "stop_reason": None,
                        "usage": {"input_tokens": 1, "output_tokens": 0},
                    }}),
                ]
                for i, block in enumerate(message["content"]):
                    if block["type"] == "tool_use":
                        start = {**block, "input": {}}
                        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                    else:
                        start = {"type": "text", "text": ""}
                        delta = {"type": "text_delta", "text": block["text"]}
                    events += [
                        ("content_block_start", {"type": "content_block_start", "index": i, "content_block": start}),
                        ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}),
                        ("content_block_stop", {"type": "content_block_stop", "index": i}),
                    ]
                events += [
                    ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 1},
                                       "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None}}),
                    ("message_stop", {"type": "message_stop"}),
                ]
                data = b"".join(f"event: {name}\ndata: {json.dumps(ev)}\n\n".encode() for name, ev in events)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("request-id", "req_fake")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-messages-api", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
