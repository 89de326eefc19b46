"""A scripted OpenAI-compatible chat endpoint over real HTTP (no LLM is reachable from tests).

Each POST /v1/chat/completions takes the next answer of the script: a string is
sent as the assistant's message; ``("status", 500)`` answers that status;
``("raw", b"...")`` sends the bytes as they are; ``("sleep", s)`` waits ``s``
seconds before answering 200 with "late". Every request body is recorded.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ChatServer:
    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _next(self, body: dict[str, Any]) -> Any:
        with self._lock:
            self.requests.append(body)
            return self.script.pop(0) if self.script else ("status", 500)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                answer = server._next(body)
                if isinstance(answer, tuple) and answer[0] == "status":
                    self._send(answer[1], b'{"error": {"message": "scripted failure"}}')
                elif isinstance(answer, tuple) and answer[0] == "raw":
                    self._send(200, answer[1])
                elif isinstance(answer, tuple) and answer[0] == "sleep":
                    time.sleep(answer[1])
                    self._send(200, _completion("late"))
                else:
                    self._send(200, _completion(str(answer)))

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        return Handler


def _completion(content: str) -> bytes:
    return json.dumps({
        "id": "chatcmpl-scripted", "object": "chat.completion", "model": "scripted",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }).encode()
