"""A scripted OpenAI-compatible endpoint: a real uvicorn server answering from fixture files.

Answers are routed by the label the client sends in the ``X-Synth-Label``
header when ``llm.label_header`` names it (``template=T env=E item=I turn=N``,
N being the re-ask turn), never by the prompt text and never by call order,
so concurrency cannot scramble the script:

    <root>/<E>/<T>/<I>.<turn>.md   the answer for that turn
    <root>/<E>/<T>/<I>.md          the answer for any turn
    <root>/<E>/<T>/default.md      the answer for any item of that template

An answer file whose first line is ``<!-- finish_reason: length -->`` is sent
as cut off at the token limit. ``<root>/faults.json`` maps ``E/T/I`` to the
faults its first requests get, in order: ``"429"``, ``"500"``, ``"503"``,
``"junk"`` (200 with a body that is not JSON), ``"timeout"`` (an answer later
than the client waits), or ``"always503"``; any other number is answered with that status.

``required_key`` set, a request without ``Authorization: Bearer <required_key>``
is refused with 401, as OpenAI refuses a wrong key; ``delay`` seconds pass
before each chat answer (to interrupt a run while requests are in flight).
``received`` counts requests on arrival, before any answer.

Chat models are ``gen-large`` and ``gen-small``; a missing answer file is a 400
(this request only). Embeddings are hashed bags of words (similar texts get
similar vectors) for the model ``scripted-embed``. Any other model is unknown
(404), as at OpenAI.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.conftest import free_port

LABEL_HEADER = "X-Synth-Label"
LABEL = re.compile(r"^template=(\S+) env=(\S+) item=(\S+) turn=(\d+)$")
EMBED_MODEL = "scripted-embed"
CHAT_MODELS = frozenset({"gen-large", "gen-small"})
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset("a an and are as at be by for from in into is it its of on or that the their this to with".split())


@dataclass
class Logged:
    route: str  # E/T/I, or "embeddings"
    turn: int
    status: int  # 0: answered too late (a timeout fault)


@dataclass
class ScriptedLLM:
    root: Path
    slow_seconds: float = 1.6  # how long a "timeout" fault makes the client wait
    requests: list[Logged] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    conversations: dict[str, list[list[dict[str, str]]]] = field(default_factory=dict)  # route -> messages sent
    authorizations: list[str | None] = field(default_factory=list)
    required_key: str | None = None
    delay: float = 0.0
    received: int = 0
    _seen: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        faults = self.root / "faults.json"
        self.faults: dict[str, list[str]] = json.loads(faults.read_text()) if faults.is_file() else {}
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"]),
                                     Route("/v1/embeddings", self.embeddings, methods=["POST"])])

    # -- bookkeeping --------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every request and restart every fault plan (between tests sharing the server)."""
        with self._lock:
            self.requests.clear()
            self.missing.clear()
            self.conversations.clear()
            self.authorizations.clear()
            self._seen.clear()
            self.required_key, self.delay, self.received = None, 0.0, 0

    def count(self, prefix: str = "") -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.route.startswith(prefix))

    def _log(self, route: str, turn: int, status: int) -> None:
        with self._lock:
            self.requests.append(Logged(route, turn, status))

    def _fault(self, route: str) -> str | None:
        with self._lock:
            n = self._seen[route]
            self._seen[route] += 1
        plan = self.faults.get(route, [])
        if plan == ["always503"]:
            return "503"
        return plan[n] if n < len(plan) else None

    async def _faulted(self, route: str, turn: int) -> Response | None:
        fault = self._fault(route)
        if fault is None:
            return None
        if fault == "timeout":
            self._log(route, turn, 0)  # logged on arrival: the client is gone before the answer
            await asyncio.sleep(self.slow_seconds)
            return PlainTextResponse("too late", status_code=200)
        if fault == "junk":
            self._log(route, turn, 200)
            return PlainTextResponse("<html>502 Bad Gateway</html>", status_code=200)
        status = int(fault)
        self._log(route, turn, status)
        headers = {"retry-after": "0"} if status == 429 else {}
        return JSONResponse({"error": {"message": f"scripted {status}", "type": "server_error"}}, status, headers)

    # -- endpoints ----------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        body = await request.json()
        messages = body["messages"]
        match = LABEL.match(request.headers.get(LABEL_HEADER, ""))
        if match is None:
            return JSONResponse({"error": {"message": f"no {LABEL_HEADER} header"}}, 400)
        template, env, item, turn_text = match.groups()
        route, turn = f"{env}/{template}/{item}", int(turn_text)
        with self._lock:
            self.received += 1
            self.conversations.setdefault(route, []).append(messages)
            self.authorizations.append(request.headers.get("authorization"))
        refused = self._refused(request, route, turn)
        if refused is not None:
            return refused
        if body["model"] not in CHAT_MODELS:
            self._log(route, turn, 404)
            return JSONResponse({"error": {"message": f"The model `{body['model']}` does not exist"}}, 404)
        if self.delay:
            await asyncio.sleep(self.delay)
        faulted = await self._faulted(route, turn)
        if faulted is not None:
            return faulted
        folder = self.root / env / template
        for candidate in (folder / f"{item}.{turn}.md", folder / f"{item}.md", folder / "default.md"):
            if candidate.is_file():
                text = candidate.read_text(encoding="utf-8")
                break
        else:
            with self._lock:
                self.missing.append(f"{route} turn {turn}")
            self._log(route, turn, 400)  # this request only: other items may have their answers
            return JSONResponse({"error": {"message": f"no scripted answer for {route} turn {turn}"}}, 400)
        finish = "stop"
        if text.startswith("<!-- finish_reason: length -->\n"):
            text, finish = text.split("\n", 1)[1], "length"
        self._log(route, turn, 200)
        prompt_tokens = sum(len(m["content"]) for m in messages) // 4
        completion_tokens = len(text) // 4 + 1
        return JSONResponse({
            "id": "chatcmpl-" + hashlib.sha256(f"{route}/{turn}".encode()).hexdigest()[:24],
            "object": "chat.completion", "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })  # fmt: skip

    def _refused(self, request: Request, route: str, turn: int) -> Response | None:
        if self.required_key is None or request.headers.get("authorization") == f"Bearer {self.required_key}":
            return None
        self._log(route, turn, 401)
        return JSONResponse({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                       "code": "invalid_api_key"}}, 401)  # fmt: skip

    async def embeddings(self, request: Request) -> Response:
        body = await request.json()
        with self._lock:
            self.received += 1
        refused = self._refused(request, "embeddings", 0)
        if refused is not None:
            return refused
        faulted = await self._faulted("embeddings", 0)
        if faulted is not None:
            return faulted
        if body.get("model") != EMBED_MODEL:
            self._log("embeddings", 0, 404)
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist"}}, 404)
        self._log("embeddings", 0, 200)
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": bag_of_words(text)} for i, text in enumerate(inputs)]
        tokens = sum(len(t) for t in inputs) // 4
        return JSONResponse({"object": "list", "data": data, "model": EMBED_MODEL,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def bag_of_words(text: str, size: int = 256) -> list[float]:
    vector = [0.0] * size
    for word in _WORD.findall(text.lower()):
        if word not in _STOP:
            vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % size] += 1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [round(x / norm, 6) for x in vector]


class Running:
    """The endpoint served by uvicorn in a thread on a free port."""

    def __init__(self, script: ScriptedLLM) -> None:
        self.script = script
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/v1"
        config = uvicorn.Config(script.app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                ws="none", http="h11", loop="asyncio", timeout_graceful_shutdown=3)  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="scripted-llm", daemon=True)

    def __enter__(self) -> Running:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the scripted LLM server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)
