"""The LLM client against the scripted endpoint: retries, giving up, caching, sharing, usage and cost."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from synthesis.errors import EndpointUnusable, LLMGaveUp, LLMRejected
from synthesis.llm.cache import ResponseCache
from synthesis.llm.client import LLMClient
from synthesis.llm.prompts import render
from synthesis.llm.usage import Ledger
from tests.scripted_openai import Running
from tests.synthesis.conftest import make_config

pytestmark = pytest.mark.anyio


def client(llm: Running, cache: Path | None = None, api_key: str | None = None, **llm_options: Any) -> LLMClient:
    config = make_config(llm.url, llm=llm_options)
    return LLMClient(config, Ledger(config.prices), api_key=api_key, cache=ResponseCache(cache) if cache else None)


def messages(item: str) -> list[dict[str, str]]:
    return render("theme_judge", env="unit", item=item, task="Change the delivery address of order 1042.").messages()


def label(item: str) -> str:
    return f"template=theme_judge env=unit item={item} turn=0"


async def test_retries_429_500_and_a_junk_body_then_answers(llm: Running) -> None:
    c = client(llm, max_attempts=4)
    try:
        completion = await c.chat("generator", messages("flaky"), stage="themes", label=label("flaky"))
    finally:
        await c.aclose()
    assert '"decision": "keep"' in completion.text and completion.finish_reason == "stop"
    assert [r.status for r in llm.script.requests] == [429, 500, 200, 200]  # the third is junk
    usage = c.ledger.of("themes")
    assert (usage.requests, usage.answers, usage.cached) == (4, 1, 0)


async def test_gives_up_after_max_attempts_with_a_clear_error(llm: Running) -> None:
    c = client(llm, max_attempts=3)
    try:
        with pytest.raises(LLMGaveUp) as caught:
            await c.chat("generator", messages("down"), stage="themes", label=label("down"))
    finally:
        await c.aclose()
    assert caught.value.attempts == 3 and llm.script.count("unit/theme_judge/down") == 3
    assert "gave up after 3 attempts; last error: HTTP 503" in caught.value.message
    assert c.ledger.of("themes").requests == 3  # the counter advances: EnvScaler's never did


async def test_a_slow_answer_times_out_and_is_retried(llm: Running) -> None:
    c = client(llm)
    try:
        completion = await c.chat("generator", messages("slow"), stage="themes", label=label("slow"))
    finally:
        await c.aclose()
    assert "order_desk" in completion.text and c.ledger.of("themes").requests == 2


async def test_a_timeout_on_every_attempt_gives_up_naming_the_timeout(llm: Running) -> None:
    c = client(llm, max_attempts=1)
    try:
        with pytest.raises(LLMGaveUp, match=r"no answer within 1 s"):
            await c.chat("generator", messages("slow"), stage="themes", label=label("slow"))
    finally:
        await c.aclose()


async def test_a_refused_request_is_not_retried_and_other_requests_still_go(llm: Running) -> None:
    c = client(llm, max_attempts=5)
    try:
        with pytest.raises(LLMRejected) as caught:
            await c.chat("generator", messages("bad-request"), stage="themes", label=label("bad-request"))
        await c.chat("generator", messages("keep"), stage="themes", label=label("keep"))
    finally:
        await c.aclose()
    assert caught.value.status == 400 and llm.script.count("unit/theme_judge/bad-request") == 1
    assert llm.script.count() == 2


async def test_a_refused_key_costs_one_request_and_stops_every_other(llm: Running) -> None:
    llm.script.required_key = "sk-right"
    c = client(llm, api_key="sk-wrong", max_attempts=5)
    try:
        outcomes = await asyncio.gather(*(c.chat("generator", messages(item), stage="themes", label=label(item))
                                          for item in ("keep", "flaky", "concurrent", "slow")), return_exceptions=True)
        with pytest.raises(EndpointUnusable):  # later requests are not sent either
            await c.chat("generator", messages("keep") + [{"role": "user", "content": "again"}], stage="themes",
                         label=label("keep"))  # fmt: skip
    finally:
        await c.aclose()
    assert all(isinstance(o, EndpointUnusable) for o in outcomes), outcomes
    assert llm.script.received == 1 and c.ledger.of("themes").requests == 1
    cause = outcomes[0].cause  # type: ignore[union-attr]
    assert isinstance(cause, LLMRejected) and cause.status == 401
    assert "the endpoint cannot serve this run" in str(outcomes[0]) and "Incorrect API key provided" in str(outcomes[0])


async def test_a_forbidden_request_stops_the_run_too(llm: Running) -> None:
    c = client(llm)
    try:
        with pytest.raises(EndpointUnusable, match="HTTP 403"):
            await c.chat("generator", messages("forbidden"), stage="themes", label=label("forbidden"))
        with pytest.raises(EndpointUnusable):
            await c.chat("generator", messages("keep"), stage="themes", label=label("keep"))
    finally:
        await c.aclose()
    assert llm.script.received == 1


async def test_an_unknown_model_stops_the_run_but_a_missing_embedding_model_does_not(llm: Running) -> None:
    config = make_config(llm.url, llm={"embedding_model": "text-embedding-missing"}, models={"generator": "gen-huge"})
    c = LLMClient(config, Ledger(config.prices))
    try:
        with pytest.raises(LLMRejected, match="404"):
            await c.embed(["x"], stage="dedup")
        with pytest.raises(EndpointUnusable, match="The model `gen-huge` does not exist"):
            await c.chat("generator", messages("keep"), stage="themes", label=label("keep"))
    finally:
        await c.aclose()


async def test_an_unreachable_server_is_given_its_retries_then_stops_the_run() -> None:
    from tests.conftest import free_port

    config = make_config(f"http://127.0.0.1:{free_port()}/v1", llm={"max_attempts": 3})
    c = LLMClient(config, Ledger(config.prices))
    try:
        outcomes = await asyncio.gather(*(c.chat("generator", messages(item), stage="themes", label=label(item))
                                          for item in ("keep", "flaky", "concurrent")), return_exceptions=True)
    finally:
        await c.aclose()
    assert all(isinstance(o, EndpointUnusable) for o in outcomes), outcomes
    assert "gave up after 3 attempts; last error: connection failed: ConnectError" in str(outcomes[0])
    assert c.ledger.of("themes").requests == 3  # one request's retries, not one per request


async def test_cached_answers_cost_no_request_and_survive_a_new_client(llm: Running, tmp_path: Path) -> None:
    first = client(llm, cache=tmp_path)
    try:
        answer = await first.chat("generator", messages("keep"), stage="themes", label=label("keep"))
    finally:
        await first.aclose()
    second = client(llm, cache=tmp_path)
    try:
        again = await second.chat("generator", messages("keep"), stage="themes", label=label("keep"))
    finally:
        await second.aclose()
    assert again.text == answer.text and again.cached and not answer.cached
    assert llm.script.count() == 1
    assert (second.ledger.of("themes").requests, second.ledger.of("themes").cached) == (0, 1)


async def test_a_different_prompt_or_model_misses_the_cache(llm: Running, tmp_path: Path) -> None:
    c = client(llm, cache=tmp_path)
    try:
        await c.chat("generator", messages("keep"), stage="themes", label=label("keep"))
        await c.chat("tester", messages("keep"), stage="themes", label=label("keep"))  # another model
        await c.chat("generator", messages("keep") + [{"role": "user", "content": "again"}], stage="themes", label=label("keep"))
    finally:
        await c.aclose()
    assert llm.script.count() == 3


async def test_identical_requests_in_flight_are_sent_once(llm: Running) -> None:
    c = client(llm)
    try:
        answers = await asyncio.gather(*(c.chat("generator", messages("concurrent"), stage="themes", label=label("concurrent")) for _ in range(3)))
    finally:
        await c.aclose()
    assert len({a.text for a in answers}) == 1 and llm.script.count() == 1
    assert c.ledger.of("themes").cached == 2


async def test_usage_and_cost_are_booked_per_stage_and_role(llm: Running) -> None:
    c = client(llm)
    try:
        await c.chat("generator", messages("keep"), stage="themes", label=label("keep"))
        await c.chat("tester", messages("keep"), stage="assess", label=label("keep"))
    finally:
        await c.aclose()
    themes, assess = c.ledger.of("themes"), c.ledger.of("assess")
    assert themes.prompt_tokens > 100 and themes.completion_tokens > 50
    assert themes.cost == pytest.approx((themes.prompt_tokens * 0.002 + themes.completion_tokens * 0.008) / 1000)
    assert assess.cost == pytest.approx((assess.prompt_tokens * 0.0004 + assess.completion_tokens * 0.0016) / 1000)
    assert c.ledger.total().tokens == themes.tokens + assess.tokens


async def test_the_api_key_is_sent_as_a_bearer_token(llm: Running) -> None:
    c = client(llm, api_key="sk-test-123")
    try:
        await c.chat("generator", messages("keep"), stage="themes", label=label("keep"))
    finally:
        await c.aclose()
    assert llm.script.authorizations == ["Bearer sk-test-123"]


async def test_embeddings_come_back_in_input_order(llm: Running) -> None:
    c = client(llm)
    try:
        vectors = await c.embed(["blue ceramic mug stock", "vet appointment book", "blue ceramic mug stock"], stage="dedup")
    finally:
        await c.aclose()
    assert len(vectors) == 3 and vectors[0] == vectors[2] and vectors[0] != vectors[1]


async def test_an_unknown_embedding_model_is_refused(llm: Running) -> None:
    c = client(llm, embedding_model="text-embedding-missing")
    try:
        with pytest.raises(LLMRejected, match="404"):
            await c.embed(["x"], stage="dedup")
    finally:
        await c.aclose()
