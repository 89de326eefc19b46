"""A scripted OpenAI-compatible chat endpoint: a real uvicorn server answering from a script.

A script maps the first user message of a conversation (a scenario's task, or a simulated user's
opening message) to one or more *tracks*, each a list of assistant turns:

    {"tool_calls": [{"name": ..., "arguments": {...}}, ...]}   calls (rendered per tool format)
    {"content": "..."}                                          a plain answer
    {"raw": "..."}                                              this exact text (e.g. a broken call)
    {"raw_tool_call": {"name": ..., "arguments": "<not json"}}  a native call with raw argument text

The turn answered is the number of assistant messages already in the request. A conversation's
track is the one whose earlier turns match the assistant messages it holds; at turn 0 tracks are
handed out in turn (the k-th opening request of a script gets track k mod the number of tracks).
A request that carries ``tools`` gets native ``tool_calls``; one without gets the calls written
as ``<tool_call>`` blocks in the text, as prompt-mode models do.

Usage is counted so tests can check totals by hand: ``prompt_tokens`` is 10 per message sent,
``completion_tokens`` is 5.

Requests for ``model == USER_MODEL`` come from the envfoundry service asking its simulated user
(conversation mode). They are answered from ``users``: the replies of the user whose goal (a
scenario's task) the system prompt holds, the n-th reply when the request holds n assistant
messages (the user's own earlier words); past the last reply the user stops.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.client.served import Served

Turn = dict[str, Any]
USER_MODEL = "scripted-user"


def _canonical(message: dict[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        raw = fn.get("arguments")
        try:
            args = json.dumps(json.loads(raw), sort_keys=True) if isinstance(raw, str) else json.dumps(raw)
        except json.JSONDecodeError:
            args = str(raw)
        calls.append((str(fn.get("name")), args))
    return (message.get("content") or "").strip(), tuple(calls)


def render(turn: Turn, native: bool, track: int, index: int) -> dict[str, Any]:
    """The assistant message for one scripted turn."""
    if "raw" in turn:
        return {"role": "assistant", "content": turn["raw"]}
    if "raw_tool_call" in turn:
        call = turn["raw_tool_call"]
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_t{track}_{index}_0", "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]}}]}
    calls = turn.get("tool_calls") or []
    content = turn.get("content")
    if not calls:
        return {"role": "assistant", "content": content or ""}
    if native:
        return {"role": "assistant", "content": content, "tool_calls": [
            {"id": f"call_t{track}_{index}_{n}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for n, c in enumerate(calls)]}
    blocks = "\n".join(f'<tool_call>\n{json.dumps({"name": c["name"], "arguments": c["arguments"]})}\n</tool_call>'
                       for c in calls)
    return {"role": "assistant", "content": f"{content}\n{blocks}" if content else blocks}


@dataclass
class Logged:
    model: str
    native: bool
    messages: list[dict[str, Any]]
    authorization: str | None


@dataclass
class ScriptedChat:
    scripts: dict[str, list[list[Turn]]] = field(default_factory=dict)  # first user message -> tracks
    users: dict[str, list[str]] = field(default_factory=dict)  # a scenario's task -> the user's replies
    requests: list[Logged] = field(default_factory=list)
    _openings: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    def reset(self, scripts: dict[str, list[list[Turn]]], users: dict[str, list[str]] | None = None) -> None:
        with self._lock:
            self.scripts = scripts
            self.users = users or {}
            self.requests.clear()
            self._openings.clear()

    def agent_requests(self) -> list[Logged]:
        with self._lock:
            return [r for r in self.requests if r.model != USER_MODEL]

    def user_requests(self) -> list[Logged]:
        with self._lock:
            return [r for r in self.requests if r.model == USER_MODEL]

    def _user_reply(self, messages: list[dict[str, Any]]) -> str | None:
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        for goal, replies in self.users.items():
            if goal in system:
                turn = sum(1 for m in messages if m["role"] == "assistant")
                return replies[turn] if turn < len(replies) else "Nothing more, thanks.\n###STOP###"
        return None

    def _track(self, key: str, history: list[dict[str, Any]], native: bool) -> int | None:
        tracks = self.scripts[key]
        if not history:
            with self._lock:
                n = self._openings[key]
                self._openings[key] += 1
            return n % len(tracks)
        said = [_canonical(m) for m in history]
        for t, turns in enumerate(tracks):
            if len(turns) > len(history) and said == [_canonical(render(turns[i], native, t, i))
                                                      for i in range(len(history))]:
                return t
        return None

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        messages: list[dict[str, Any]] = body["messages"]
        native = bool(body.get("tools"))
        with self._lock:
            self.requests.append(Logged(body["model"], native, messages, request.headers.get("authorization")))
        if body["model"] == USER_MODEL:
            reply = self._user_reply(messages)
            if reply is None:
                return JSONResponse({"error": {"message": "no simulated user has this goal"}}, 404)
            return self._answer(body["model"], {"role": "assistant", "content": reply}, len(messages))
        first_user = next((m["content"] for m in messages if m["role"] == "user"), None)
        if first_user not in self.scripts:
            return JSONResponse({"error": {"message": f"no script for the conversation {str(first_user)[:80]!r}"}},
                                404)
        history = [m for m in messages if m["role"] == "assistant"]
        track = self._track(first_user, history, native)
        if track is None:
            return JSONResponse({"error": {"message": "the conversation left every scripted track"}}, 404)
        turn = self.scripts[first_user][track][len(history)]
        return self._answer(body["model"], render(turn, native, track, len(history)), len(messages))

    @staticmethod
    def _answer(model: str, message: dict[str, Any], sent: int) -> Response:
        usage = {"prompt_tokens": 10 * sent, "completion_tokens": 5, "total_tokens": 10 * sent + 5}
        return JSONResponse({"id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                             "model": model, "usage": usage,
                             "choices": [{"index": 0, "message": message,
                                          "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}]})


class Running(Served):
    """The endpoint served on a free port; ``url`` ends in ``/v1``, as OpenAI base URLs do."""

    def __init__(self, script: ScriptedChat) -> None:
        super().__init__(script.app, "scripted-chat")
        self.script = script
        self.url += "/v1"

    def __enter__(self) -> Running:
        super().__enter__()
        return self
