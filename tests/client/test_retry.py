"""Retries only where a repeat cannot apply anything twice; bearer-token auth on every request."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from envfoundry_client import AsyncClient, Client, QuotaExceeded, Retry, TransportError, Unavailable
from envfoundry_client.endpoints import call, create_environment, get_scenario, score
from envfoundry_client.exchange import should_retry

from tests.client.flaky_proxy import FlakyProxy, Running
from tests.conftest import Server, free_port

FAST = Retry(attempts=3, backoff=0.01)


@pytest.fixture
def proxy(ef_server: Server) -> Iterator[FlakyProxy]:
    with Running(FlakyProxy(ef_server.url)) as running:
        yield running.proxy


def client_for(proxy: FlakyProxy, api_key: str | None = None) -> Client:
    return Client(proxy.url, api_key=api_key, retry=FAST)


def test_a_read_is_retried_after_503(proxy: FlakyProxy) -> None:
    proxy.faults[("GET", "/v1/scenarios/lib-001")] = [503]
    with client_for(proxy) as ef:
        assert ef.get_scenario("lib-001").scenario_id == "lib-001"
    assert proxy.count("GET", "/v1/scenarios/lib-001") == 2


def test_a_call_is_retried_with_the_same_idempotency_key(proxy: FlakyProxy) -> None:
    with client_for(proxy) as ef:
        sid = ef.create_session("lib-001").session_id
        proxy.faults[("POST", "/calls")] = [429, 503]
        assert ef.call(sid, "return_book", {"loan_id": "L0003"}).ok
        keys = [s.headers.get("idempotency-key") for s in proxy.seen if s.path.endswith("/calls")]
        assert len(keys) == 3 and keys[0] and len(set(keys)) == 1
        assert ef.get_session(sid).steps == 1
        ef.call(sid, "renew_loan", {"loan_id": "L0001"})
        later = [s.headers.get("idempotency-key") for s in proxy.seen if s.path.endswith("/calls")][-1]
        assert later != keys[0]  # one key per logical call


def test_a_write_without_idempotency_key_is_not_retried(proxy: FlakyProxy) -> None:
    proxy.faults[("POST", "/v1/environments")] = [503]
    with client_for(proxy) as ef, pytest.raises(Unavailable) as raised:
        ef.create_environment("never-made", "X", "class X:\n    pass\n")
    assert raised.value.retry_after == 0.0
    assert proxy.count("POST", "/v1/environments") == 1


def test_retries_stop_after_the_configured_attempts(proxy: FlakyProxy) -> None:
    proxy.faults[("GET", "/v1/environments")] = [429, 429, 429, 429]
    with client_for(proxy) as ef, pytest.raises(QuotaExceeded):
        ef.list_environments()
    assert proxy.count("GET", "/v1/environments") == 3


def test_bearer_token_from_argument_or_environment(proxy: FlakyProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    with client_for(proxy, api_key="k-arg") as ef:
        ef.health()
    monkeypatch.setenv("ENVFOUNDRY_API_KEY", "k-env")
    with client_for(proxy) as ef:
        ef.health()
    assert [s.headers.get("authorization") for s in proxy.seen] == ["Bearer k-arg", "Bearer k-env"]


def test_no_server_is_a_transport_error_after_retries() -> None:
    with Client(f"http://127.0.0.1:{free_port()}", retry=FAST) as ef, pytest.raises(TransportError) as raised:
        ef.health()
    assert "/healthz" in str(raised.value)


def test_retry_policy_honours_retry_after_and_knows_what_is_safe() -> None:
    policy = Retry(attempts=4, backoff=1.0, max_delay=30.0)
    busy = httpx.Response(503, headers={"Retry-After": "7"})
    assert should_retry(get_scenario("x"), busy, 0, policy) == 7.0
    assert should_retry(score("s"), httpx.Response(429, headers={"Retry-After": "120"}), 0, policy) == 30.0
    assert should_retry(call("s", "t", {}), busy, 0, policy) == 7.0  # carries an Idempotency-Key
    assert should_retry(call("s", "t", {}), busy, 3, policy) is None  # attempts used up
    assert should_retry(create_environment("e", "C", "code"), busy, 0, policy) is None
    assert should_retry(call("s", "t", {}), httpx.Response(409, headers={"Retry-After": "1"}), 0, policy) == 1.0
    assert should_retry(call("s", "t", {}), httpx.Response(409), 0, policy) is None  # a conflict to resolve
    assert should_retry(call("s", "t", {}), httpx.Response(502, headers={"Retry-After": "1"}), 0, policy) == 1.0
    assert should_retry(get_scenario("x"), httpx.Response(500), 0, policy) is None
    unconfigured = httpx.Response(503, json={"type": "urn:envfoundry:problem:user-llm-unavailable", "status": 503})
    assert should_retry(call("s", "t", {}), unconfigured, 0, policy) is None  # no wait mends a missing user LLM
    assert should_retry(get_scenario("x"), httpx.Response(404), 0, policy) is None
    assert 0.5 <= (should_retry(get_scenario("x"), None, 1, policy) or 0) <= 2.0  # backoff with jitter


@pytest.mark.anyio
async def test_the_async_client_retries_the_same_way(proxy: FlakyProxy) -> None:
    async with AsyncClient(proxy.url, retry=FAST) as ef:
        sid = (await ef.create_session("lib-001")).session_id
        proxy.faults[("POST", "/calls")] = [503]
        proxy.faults[("DELETE", sid)] = [503]
        assert (await ef.call(sid, "return_book", {"loan_id": "L0003"})).ok
        with pytest.raises(Unavailable):
            await ef.delete_session(sid)  # no idempotency key: not repeated
    assert proxy.count("POST", "/calls") == 2 and proxy.count("DELETE", sid) == 1


def test_the_retry_budget_is_time_and_the_environment_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = Retry(backoff=1.0, seconds=10.0)  # no count: as many attempts as ten seconds allow
    assert policy.attempts is None
    assert 1.0 <= (should_retry(get_scenario("x"), None, 50, policy, elapsed=5.0) or 0) <= 2.0  # backoff capped
    assert should_retry(get_scenario("x"), None, 3, policy, elapsed=9.5) == pytest.approx(0.5, abs=0.01)  # cut
    assert should_retry(get_scenario("x"), None, 3, policy, elapsed=10.0) is None  # spent
    assert should_retry(create_environment("e", "C", "code"), None, 0, policy) is None  # never safe to repeat
    assert Retry().seconds == 30.0
    monkeypatch.setenv("ENVFOUNDRY_RETRY_SECONDS", "90")
    assert Retry().seconds == 90.0 and Client("http://127.0.0.1:1").config.retry.seconds == 90.0
    monkeypatch.setenv("ENVFOUNDRY_RETRY_SECONDS", "0")
    assert should_retry(get_scenario("x"), None, 0, Retry()) is None  # 0: no retry
    for wrong in ("soon", "-1"):
        monkeypatch.setenv("ENVFOUNDRY_RETRY_SECONDS", wrong)
        with pytest.raises(ValueError, match="ENVFOUNDRY_RETRY_SECONDS"):
            Retry()
    with pytest.raises(ValueError, match="needs a limit"):
        Retry(seconds=None)  # no time limit and no count would retry forever
