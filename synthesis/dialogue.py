"""Asking for a parseable answer: send a prompt, parse strictly, re-ask with the parse error, give up."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from synthesis.config import Role
from synthesis.errors import AnswerRejected, ParseError
from synthesis.llm import LLMClient
from synthesis.prompts import Prompt, reask

T = TypeVar("T")


async def ask(client: LLMClient, role: Role, prompt: Prompt, parse: Callable[[str], T], *, stage: str) -> T:
    """Return ``parse(answer)`` for the first answer that parses.

    The conversation grows by the bad answer and the parse error each time, so the
    model sees what to fix; each turn is cached, so a rerun replays it for free.

    Raises:
        AnswerRejected: ``1 + llm.max_reasks`` answers failed to parse.
        LLMGaveUp, LLMRejected: from the client.
    """
    messages = prompt.messages()
    attempts = client.config.llm.max_reasks + 1
    problem = ""
    for _ in range(attempts):
        completion = await client.chat(role, messages, stage=stage)
        try:
            return parse(completion.text)
        except ParseError as exc:
            problem = exc.reason
        follow_up = reask(problem, truncated=completion.finish_reason == "length")
        messages = [*messages, {"role": "assistant", "content": completion.text}, {"role": "user", "content": follow_up}]
    raise AnswerRejected(prompt.template, attempts, problem)
