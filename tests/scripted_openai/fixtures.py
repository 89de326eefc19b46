"""The synthesis script: answers from fixture files, routed by the label the client sends.

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

Chat models are ``gen-large`` and ``gen-small``; a missing answer file is a 400
(this request only). Embeddings are hashed bags of words (similar texts get
similar vectors) for the model ``scripted-embed``. Any other model is unknown
(404), as at OpenAI. Usage: a quarter token per character sent and received.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.scripted_openai import Answer, Json, Late, Raw, Reply, ScriptedOpenAI, Status

LABEL_HEADER = "X-Synth-Label"
LABEL = re.compile(r"^template=(\S+) env=(\S+) item=(\S+) turn=(\d+)$")
EMBED_MODEL = "scripted-embed"
CHAT_MODELS = frozenset({"gen-large", "gen-small"})
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset("a an and are as at be by for from in into is it its of on or that the their this to with".split())


class ScriptedLLM(ScriptedOpenAI):
    def __init__(self, root: Path, slow_seconds: float = 1.6) -> None:
        super().__init__()
        self.root = root
        self.slow_seconds = slow_seconds  # how long a "timeout" fault makes the client wait
        self.missing: list[str] = []
        self.conversations: dict[str, list[list[dict[str, str]]]] = {}  # route -> messages sent
        self._seen: Counter[str] = Counter()
        faults = root / "faults.json"
        self.faults: dict[str, list[str]] = json.loads(faults.read_text()) if faults.is_file() else {}

    def reset(self) -> None:
        """Also restart every fault plan."""
        super().reset()
        with self._lock:
            self.missing.clear()
            self.conversations.clear()
            self._seen.clear()

    def answer(self, body: dict[str, Any], headers: Mapping[str, str]) -> tuple[str, int, Reply]:
        messages = body["messages"]
        match = LABEL.match(headers.get(LABEL_HEADER, ""))
        if match is None:
            return "", 0, Status(400, f"no {LABEL_HEADER} header")
        template, env, item, turn_text = match.groups()
        route, turn = f"{env}/{template}/{item}", int(turn_text)
        with self._lock:
            self.conversations.setdefault(route, []).append(messages)
        if body["model"] not in CHAT_MODELS:
            return route, turn, Status(404, f"The model `{body['model']}` does not exist")
        fault = self._fault(route)
        if fault is not None:
            return route, turn, fault
        folder = self.root / env / template
        for candidate in (folder / f"{item}.{turn}.md", folder / f"{item}.md", folder / "default.md"):
            if candidate.is_file():
                text = candidate.read_text(encoding="utf-8")
                break
        else:
            with self._lock:
                self.missing.append(f"{route} turn {turn}")
            return route, turn, Status(400, f"no scripted answer for {route} turn {turn}")  # this request only
        finish = "stop"
        if text.startswith("<!-- finish_reason: length -->\n"):
            text, finish = text.split("\n", 1)[1], "length"
        prompt_tokens = sum(len(m["content"]) for m in messages) // 4
        return route, turn, Answer({"role": "assistant", "content": text}, finish, (prompt_tokens, len(text) // 4 + 1))

    def embed(self, body: dict[str, Any]) -> tuple[str, Reply]:
        fault = self._fault("embeddings")
        if fault is not None:
            return "embeddings", fault
        if body.get("model") != EMBED_MODEL:
            return "embeddings", Status(404, f"The model `{body.get('model')}` does not exist")
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": bag_of_words(text)} for i, text in enumerate(inputs)]
        tokens = sum(len(t) for t in inputs) // 4
        return "embeddings", Json({"object": "list", "data": data, "model": EMBED_MODEL,
                                   "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})  # fmt: skip

    def _fault(self, route: str) -> Reply | None:
        with self._lock:
            n = self._seen[route]
            self._seen[route] += 1
        plan = self.faults.get(route, [])
        fault = "503" if plan == ["always503"] else plan[n] if n < len(plan) else None
        if fault is None:
            return None
        if fault == "timeout":
            return Late(self.slow_seconds, Raw(b"too late"))
        if fault == "junk":
            return Raw(b"<html>502 Bad Gateway</html>")
        status = int(fault)
        return Status(status, f"scripted {status}", {"retry-after": "0"} if status == 429 else {})


def bag_of_words(text: str, size: int = 256) -> list[float]:
    vector = [0.0] * size
    for word in _WORD.findall(text.lower()):
        if word not in _STOP:
            vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % size] += 1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [round(x / norm, 6) for x in vector]
