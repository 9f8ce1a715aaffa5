"""A loopback OpenAI-compatible server that records the headers of every request it receives.

It serves `GET /v1/models` and `POST /v1/chat/completions` with a fixed reply, so an eval run through
`--server URL` is a real HTTP exchange (the openai SDK in a subprocess talking to a socket), and a test
can then read which `Authorization` header, if any, reached the server.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.loopback_server import LoopbackServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format, *args) -> None:  # noqa: A002 - quiet; `requests` tells the story
        pass

    def _record(self, body: bytes | None) -> None:
        with self.server.lock:
            self.server.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": body,
                }
            )

    def _json(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._record(None)
        self._json(
            {"object": "list", "data": [{"id": self.server.model, "object": "model", "owned_by": "test"}]}
        )

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._record(body)
        reply = self.server.reply
        self._json(
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.server.model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


class _Server(ThreadingHTTPServer):
    model: str
    reply: str
    lock: threading.Lock
    requests: list[dict]


class RecordingServer(LoopbackServer):
    """`with RecordingServer(reply="... \\boxed{4}") as srv:` then point a client at `srv.base_url`;
    `srv.requests` lists {method, path, headers, body} in arrival order."""

    _server: _Server

    def __init__(self, reply: str = "The answer is \\boxed{0}.", model: str = "recorder") -> None:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.model, server.reply = model, reply
        server.lock, server.requests = threading.Lock(), []
        super().__init__(server)
        self.model = model

    @property
    def requests(self) -> list[dict]:
        with self._server.lock:
            return list(self._server.requests)

    def auth_headers(self) -> set[str]:
        """Every distinct credential header value received (Authorization, x-api-key, api-key)."""
        names = ("authorization", "x-api-key", "api-key")
        return {v for r in self.requests for k, v in r["headers"].items() if k.lower() in names}
