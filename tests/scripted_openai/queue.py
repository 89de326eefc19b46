"""The service script: each chat request takes the next answer of a queue, whatever it asks.

An answer is a string (sent as the assistant's message), ``("status", 500)`` (that status),
``("raw", b"...")`` (these bytes, as they are) or ``("sleep", s)`` (200 with "late", ``s``
seconds later). Past the end of the queue every request gets a 500.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tests.scripted_openai import Late, Raw, Reply, ScriptedOpenAI, Status, text


class ChatQueue(ScriptedOpenAI):
    def __init__(self, answers: Iterable[Any] = ()) -> None:
        super().__init__()
        self.answers: list[Any] = list(answers)

    def extend(self, answers: Iterable[Any]) -> None:
        with self._lock:
            self.answers.extend(answers)

    def answer(self, body: dict[str, Any], headers: Mapping[str, str]) -> tuple[str, int, Reply]:
        with self._lock:
            answer = self.answers.pop(0) if self.answers else ("status", 500)
        if isinstance(answer, tuple) and answer[0] == "status":
            return "queue", 0, Status(answer[1])
        if isinstance(answer, tuple) and answer[0] == "raw":
            return "queue", 0, Raw(answer[1])
        if isinstance(answer, tuple) and answer[0] == "sleep":
            return "queue", 0, Late(answer[1], text("late"))
        return "queue", 0, text(str(answer))
