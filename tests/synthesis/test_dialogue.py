"""Asking for a parseable answer: re-ask with the parse error, bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthesis.errors import AnswerRejected, LLMRejected
from synthesis.llm.cache import ResponseCache
from synthesis.llm.client import LLMClient
from synthesis.llm.dialogue import ask
from synthesis.llm.prompts import render
from synthesis.llm.usage import Ledger
from synthesis.parsing.answers import parse_theme
from tests.scripted_openai import Running
from tests.synthesis.conftest import make_config

pytestmark = pytest.mark.anyio


# These tests count requests, so a transport retry would read as an extra re-ask: the client waits
# long enough that a loaded machine never makes the scripted server look timed out.
PATIENT = 30.0


def client(llm: Running, max_reasks: int = 2) -> LLMClient:
    config = make_config(llm.url, llm={"max_reasks": max_reasks, "timeout": PATIENT})
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
    assert caught.value.template == "theme_judge" and "the answer holds no ```json block" in caught.value.last


async def test_a_cut_off_answer_is_reasked_with_a_smaller_request_asking_for_brevity(llm: Running) -> None:
    c = client(llm)
    prompt = render("theme_judge", env="unit", item="truncated", task="Refund order 7.")
    try:
        theme = await ask(c, "generator", prompt, parse_theme, stage="themes")
    finally:
        await c.aclose()
    assert theme.env_id == "order_desk"
    first, second = llm.script.conversations["unit/theme_judge/truncated"]
    follow_up = second[-1]["content"]
    assert "not closed" in follow_up and "cut off at the length limit" in follow_up
    # the cut text is not sent back: the re-ask is the original prompt plus one short request
    assert second[:-1] == first and all(m["role"] != "assistant" for m in second)


async def test_answers_that_never_parse_are_not_replayed_from_the_cache(llm: Running, tmp_path: Path) -> None:
    config = make_config(llm.url, llm={"max_reasks": 1, "timeout": PATIENT})
    prompt = render("theme_judge", env="unit", item="malformed", task="Refund order 7.")
    for _ in range(2):
        c = LLMClient(config, Ledger(config.prices), cache=ResponseCache(tmp_path))
        try:
            with pytest.raises(AnswerRejected):
                await ask(c, "generator", prompt, parse_theme, stage="themes")
        finally:
            await c.aclose()
        assert c.ledger.of("themes").cached == 0
    assert llm.script.count() == 4 and len(ResponseCache(tmp_path)) == 0


async def test_prompts_carry_no_routing_text_and_the_label_is_not_part_of_the_cache_key(llm: Running, tmp_path: Path) -> None:
    config = make_config(llm.url)
    c = LLMClient(config, Ledger(config.prices), cache=ResponseCache(tmp_path))
    messages = render("theme_judge", env="unit", item="keep", task="Refund order 7.").messages()
    assert not any("[request" in m["content"] or "item=" in m["content"] for m in messages)
    try:
        first = await c.chat("generator", messages, stage="themes", label="template=theme_judge env=unit item=keep turn=0")
        again = await c.chat("generator", messages, stage="themes", label="template=theme_judge env=unit item=other turn=0")
    finally:
        await c.aclose()
    assert first.key == again.key and again.cached and llm.script.count() == 1


async def test_the_label_header_is_sent_only_when_configured(llm: Running) -> None:
    config = make_config(llm.url, llm={"label_header": None})
    c = LLMClient(config, Ledger(config.prices))
    messages = render("theme_judge", env="unit", item="keep", task="Refund order 7.").messages()
    try:
        with pytest.raises(LLMRejected, match="no X-Synth-Label header"):  # the scripted server cannot route it
            await c.chat("generator", messages, stage="themes", label="template=theme_judge env=unit item=keep turn=0")
    finally:
        await c.aclose()


async def test_without_reasks_one_bad_answer_is_final(llm: Running) -> None:
    c = client(llm, max_reasks=0)
    prompt = render("theme_judge", env="unit", item="malformed", task="Refund order 7.")
    try:
        with pytest.raises(AnswerRejected):
            await ask(c, "generator", prompt, parse_theme, stage="themes")
    finally:
        await c.aclose()
    assert llm.script.count() == 1
