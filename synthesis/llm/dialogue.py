"""Asking for a parseable answer: send a prompt, parse strictly, re-ask with the parse error, give up."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from synthesis.errors import AnswerRejected, ParseError
from synthesis.llm.client import LLMClient, Message
from synthesis.llm.prompts import Prompt, cut_off, reask
from synthesis.run.config import Role

T = TypeVar("T")

# The re-asks of the item being worked on (``Context.run_items`` gives each item a list), for its provenance.
REASKS: ContextVar[list[dict[str, Any]] | None] = ContextVar("reasks", default=None)


async def ask(client: LLMClient, role: Role, prompt: Prompt, parse: Callable[[str], T], *, stage: str) -> T:
    """Return ``parse(answer)`` for the first answer that parses (see ``converse``)."""
    value, _ = await converse(client, role, prompt.messages(), parse, stage=stage, label=prompt.label,
                              template=prompt.template)  # fmt: skip
    return value


async def converse(
    client: LLMClient, role: Role, messages: list[Message], parse: Callable[[str], T], *, stage: str, label: str,
    template: str,
) -> tuple[T, str]:  # fmt: skip
    """``parse(answer)`` and the answer's text, for the first answer to ``messages`` that parses.

    A malformed answer is sent back with the parse error, so the model sees what to
    fix. An answer cut off at the length limit is not: the next request is the
    original conversation plus a request for brevity, smaller than sending the cut
    text back. Each turn is cached, so a rerun replays a successful exchange for
    free; when every answer fails, their cache entries are forgotten, so a rerun
    asks again instead of replaying the same failure.

    Raises:
        AnswerRejected: ``1 + llm.max_reasks`` answers failed to parse.
        LLMGaveUp, LLMRejected: from the client.
    """
    attempts = client.config.llm.max_reasks + 1
    problem = ""
    sent = messages
    keys: list[str] = []
    for turn in range(attempts):
        completion = await client.chat(role, sent, stage=stage, label=f"{label} turn={turn}")
        keys.append(completion.key)
        try:
            return parse(completion.text), completion.text
        except ParseError as exc:
            problem = exc.reason
        reasks = REASKS.get()
        if reasks is not None:
            reasks.append({"template": template, "item": label.split(" item=", 1)[-1].split(" ", 1)[0], "turn": turn,
                           "problem": problem, "cut_off": completion.finish_reason == "length"})  # fmt: skip
        if completion.finish_reason == "length":
            sent = [*messages, {"role": "user", "content": cut_off(problem)}]
        else:
            sent = [*sent, {"role": "assistant", "content": completion.text}, {"role": "user", "content": reask(problem)}]
    for key in keys:
        client.forget(key)
    raise AnswerRejected(template, attempts, problem)
