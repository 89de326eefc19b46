"""Asking for a parseable answer: re-ask with the parse error, bounded."""

from __future__ import annotations

import pytest

from synthesis.answers import parse_theme
from synthesis.dialogue import ask
from synthesis.errors import AnswerRejected
from synthesis.llm import LLMClient
from synthesis.prompts import render
from synthesis.usage import Ledger
from tests.synthesis.conftest import make_config
from tests.synthesis.scripted_llm import Running

pytestmark = pytest.mark.anyio


def client(llm: Running, max_reasks: int = 2) -> LLMClient:
    config = make_config(llm.url, llm={"max_reasks": max_reasks})
    return LLMClient(config, Ledger(config.prices))


async def test_a_malformed_answer_is_reasked_with_the_parse_error(llm: Running) -> None:
    c = client(llm)
    prompt = render("theme_judge", env="corpus", item="t02", task="What is the capital of Australia?")
    try:
        theme = await ask(c, "generator", prompt, parse_theme, stage="themes")
    finally:
        await c.aclose()
    assert (theme.decision, theme.category) == ("drop", "open_qa")
    first, second = llm.script.conversations["corpus/theme_judge/t02"]
    assert len(first) == 2 and len(second) == 4
    assert second[2]["role"] == "assistant" and '"general knowledge"' in second[2]["content"]
    assert second[3]["content"].startswith('Your previous answer could not be used: answer.category must be one of open_qa')


async def test_reasks_are_bounded_and_the_error_says_what_was_wrong(llm: Running) -> None:
    c = client(llm, max_reasks=2)
    prompt = render("theme_judge", env="unit", item="malformed", task="Refund order 7.")
    try:
        with pytest.raises(AnswerRejected) as caught:
            await ask(c, "generator", prompt, parse_theme, stage="themes")
    finally:
        await c.aclose()
    assert caught.value.attempts == 3 and llm.script.count() == 3
    assert caught.value.template == "theme_judge" and "invalid JSON" in caught.value.last


async def test_a_cut_off_answer_is_reasked_asking_for_brevity(llm: Running) -> None:
    c = client(llm)
    prompt = render("theme_judge", env="unit", item="truncated", task="Refund order 7.")
    try:
        theme = await ask(c, "generator", prompt, parse_theme, stage="themes")
    finally:
        await c.aclose()
    assert theme.env_id == "order_desk"
    follow_up = llm.script.conversations["unit/theme_judge/truncated"][1][-1]["content"]
    assert "not closed" in follow_up and "cut off at the length limit" in follow_up


async def test_without_reasks_one_bad_answer_is_final(llm: Running) -> None:
    c = client(llm, max_reasks=0)
    prompt = render("theme_judge", env="unit", item="malformed", task="Refund order 7.")
    try:
        with pytest.raises(AnswerRejected):
            await ask(c, "generator", prompt, parse_theme, stage="themes")
    finally:
        await c.aclose()
    assert llm.script.count() == 1
