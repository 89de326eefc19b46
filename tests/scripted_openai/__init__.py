"""The one scripted OpenAI-compatible endpoint of the tests: a real uvicorn server answering from a script.

No LLM is reachable from the tests, so every test that needs one talks HTTP to
this server. The server does what every user needs alike: it serves
``/v1/chat/completions`` and ``/v1/embeddings``, logs each request (model,
messages, whether it carried tools, the Authorization header, the status
answered), counts requests on arrival, refuses a wrong key with 401 when
``required_key`` is set, waits ``delay`` seconds before each chat answer, and
renders replies in the OpenAI wire format. What to answer is the script's
business: a subclass implements ``answer`` (and ``embed`` if it serves
embeddings) and returns a route name, for the log, and one of the replies:

    Answer(message, usage=...)   200 with that assistant message
    Status(code, ...)            an error status with an OpenAI-style error body
    Raw(body)                    these bytes as they are (a junk 200, say)
    Json(body)                   200 with this JSON body (an embeddings list)
    Late(seconds, then)          ``then``, after the client has probably given up

The scripts: ``fixtures.ScriptedLLM`` (synthesis: answer files routed by a
label header, fault plans), ``tracks.ScriptedChat`` (clients: conversations
routed by their first user message, tool calls native or as text, a
simulated user), ``queue.ChatQueue`` (service: the next answer in order).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.served import Served


@dataclass(frozen=True)
class Answer:
    message: dict[str, Any]  # the assistant message: role, content, tool_calls
    finish_reason: str | None = None  # None: "tool_calls" when the message has calls, else "stop"
    usage: tuple[int, int] = (10, 5)  # prompt and completion tokens


@dataclass(frozen=True)
class Status:
    status: int
    message: str = "scripted failure"
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Raw:
    body: bytes
    status: int = 200


@dataclass(frozen=True)
class Json:
    body: dict[str, Any]


@dataclass(frozen=True)
class Late:
    seconds: float
    then: Reply


Reply = Union[Answer, Status, Raw, Json, Late]  # noqa: UP007 (a runtime alias: the dataclasses above refer to it)


@dataclass
class Logged:
    route: str  # what the script routed the request to
    model: str
    native: bool  # the request carried ``tools``
    messages: list[dict[str, Any]]
    authorization: str | None
    status: int = 200  # 0: answered later than the client waited (a ``Late`` reply)
    turn: int = 0  # the re-ask turn, for scripts that route by it


class ScriptedOpenAI:
    """The HTTP side shared by every script. Subclasses implement ``answer`` (and ``embed``)."""

    def __init__(self) -> None:
        self.requests: list[Logged] = []
        self.received = 0  # requests that arrived, counted before any answer
        self.required_key: str | None = None
        self.delay = 0.0
        self._lock = threading.Lock()
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                     Route("/v1/embeddings", self._embeddings, methods=["POST"])])  # fmt: skip

    # -- what a script implements ------------------------------------------------------------
    def answer(self, body: dict[str, Any], headers: Mapping[str, str]) -> tuple[str, int, Reply]:
        """The route (for the log), the re-ask turn, and the reply to a chat request."""
        raise NotImplementedError

    def embed(self, body: dict[str, Any]) -> tuple[str, Reply]:
        return "embeddings", Status(404, f"The model `{body.get('model')}` does not exist")

    # -- bookkeeping -------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every request, the key and the delay (between tests sharing the server)."""
        with self._lock:
            self.requests.clear()
            self.received = 0
            self.required_key, self.delay = None, 0.0

    def count(self, prefix: str = "") -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.route.startswith(prefix))

    @property
    def authorizations(self) -> list[str | None]:
        with self._lock:
            return [r.authorization for r in self.requests]

    def logged(self, model: str | None = None, *, other_than: str | None = None) -> list[Logged]:
        with self._lock:
            return [r for r in self.requests if (model is None or r.model == model) and r.model != other_than]

    # -- endpoints ---------------------------------------------------------------------------
    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        with self._lock:
            self.received += 1
        entry = Logged("", str(body.get("model")), bool(body.get("tools")), list(body.get("messages") or []),
                       request.headers.get("authorization"))  # fmt: skip
        if self.required_key is not None and entry.authorization != f"Bearer {self.required_key}":
            return self._send(entry, Status(401, "Incorrect API key provided"), str(body.get("model")))
        entry.route, entry.turn, reply = self.answer(body, request.headers)
        if self.delay:
            await asyncio.sleep(self.delay)
        return await self._reply(entry, reply, str(body.get("model")))

    async def _embeddings(self, request: Request) -> Response:
        body = await request.json()
        with self._lock:
            self.received += 1
        entry = Logged("embeddings", str(body.get("model")), False, [], request.headers.get("authorization"))
        if self.required_key is not None and entry.authorization != f"Bearer {self.required_key}":
            return self._send(entry, Status(401, "Incorrect API key provided"), entry.model)
        entry.route, reply = self.embed(body)
        return await self._reply(entry, reply, entry.model)

    async def _reply(self, entry: Logged, reply: Reply, model: str) -> Response:
        if isinstance(reply, Late):
            entry.status = 0
            self._log(entry)  # logged on arrival: the client is gone before the answer
            await asyncio.sleep(reply.seconds)
            return _render(reply.then, model)
        return self._send(entry, reply, model)

    def _send(self, entry: Logged, reply: Reply, model: str) -> Response:
        entry.status = reply.status if isinstance(reply, (Status, Raw)) else 200
        self._log(entry)
        return _render(reply, model)

    def _log(self, entry: Logged) -> None:
        with self._lock:
            self.requests.append(entry)


def _render(reply: Reply, model: str) -> Response:
    if isinstance(reply, Late):
        return _render(reply.then, model)
    if isinstance(reply, Status):
        error = {"error": {"message": reply.message, "type": "server_error" if reply.status >= 500 else "invalid_request_error"}}
        return JSONResponse(error, reply.status, dict(reply.headers))
    if isinstance(reply, Raw):
        return Response(reply.body, reply.status, media_type="application/json")
    if isinstance(reply, Json):
        return JSONResponse(reply.body)
    prompt, completion = reply.usage
    finish = reply.finish_reason or ("tool_calls" if reply.message.get("tool_calls") else "stop")
    return JSONResponse({
        "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": reply.message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    })  # fmt: skip


def text(content: str, **options: Any) -> Answer:
    """A plain assistant answer."""
    return Answer({"role": "assistant", "content": content}, **options)


class Running(Served):
    """``script`` served on a free port; ``url`` ends in ``/v1``, as OpenAI base URLs do."""

    def __init__(self, script: ScriptedOpenAI) -> None:
        super().__init__(script.app, f"scripted-openai-{type(script).__name__}")
        self.script = script
        self.url += "/v1"

    def __enter__(self) -> Running:
        super().__enter__()
        return self


__all__ = ["Answer", "Json", "Late", "Logged", "Raw", "Reply", "Running", "ScriptedOpenAI", "Status", "text"]
