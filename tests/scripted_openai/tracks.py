"""The client script: conversations routed by their first user message, each following one of its tracks.

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
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from tests.scripted_openai import Answer, Logged, Reply, ScriptedOpenAI, Status

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
            "function": {"name": call["name"], "arguments": call["arguments"]}}]}  # fmt: skip
    calls = turn.get("tool_calls") or []
    content = turn.get("content")
    if not calls:
        return {"role": "assistant", "content": content or ""}
    if native:
        return {"role": "assistant", "content": content, "tool_calls": [
            {"id": f"call_t{track}_{index}_{n}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for n, c in enumerate(calls)]}  # fmt: skip
    blocks = "\n".join(f'<tool_call>\n{json.dumps({"name": c["name"], "arguments": c["arguments"]})}\n</tool_call>'
                       for c in calls)  # fmt: skip
    return {"role": "assistant", "content": f"{content}\n{blocks}" if content else blocks}


class ScriptedChat(ScriptedOpenAI):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: dict[str, list[list[Turn]]] = {}  # first user message -> tracks
        self.users: dict[str, list[str]] = {}  # a scenario's task -> the user's replies
        self._openings: Counter[str] = Counter()
        # called with each agent request's first user message before it is answered (a test acts on the run there)
        self.before_answer: Callable[[str], None] | None = None

    def reset(self, scripts: dict[str, list[list[Turn]]] | None = None, users: dict[str, list[str]] | None = None) -> None:
        super().reset()
        with self._lock:
            self.scripts = scripts or {}
            self.users = users or {}
            self._openings.clear()

    def agent_requests(self) -> list[Logged]:
        return self.logged(other_than=USER_MODEL)

    def user_requests(self) -> list[Logged]:
        return self.logged(USER_MODEL)

    def answer(self, body: dict[str, Any], headers: Mapping[str, str]) -> tuple[str, int, Reply]:
        messages: list[dict[str, Any]] = body["messages"]
        native = bool(body.get("tools"))
        if body["model"] == USER_MODEL:
            reply = self._user_reply(messages)
            if reply is None:
                return "user", 0, Status(404, "no simulated user has this goal")
            return "user", 0, self._answer({"role": "assistant", "content": reply}, len(messages))
        first_user = next((m["content"] for m in messages if m["role"] == "user"), None)
        if self.before_answer is not None:
            self.before_answer(str(first_user))
        if first_user not in self.scripts:
            return "", 0, Status(404, f"no script for the conversation {str(first_user)[:80]!r}")
        history = [m for m in messages if m["role"] == "assistant"]
        track = self._track(first_user, history, native)
        if track is None:
            return first_user, len(history), Status(404, "the conversation left every scripted track")
        turn = self.scripts[first_user][track][len(history)]
        return first_user, len(history), self._answer(render(turn, native, track, len(history)), len(messages))

    @staticmethod
    def _answer(message: dict[str, Any], sent: int) -> Answer:
        return Answer(message, usage=(10 * sent, 5))

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
                                                      for i in range(len(history))]:  # fmt: skip
                return t
        return None
