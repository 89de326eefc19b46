"""Bearer-token auth against a server with API keys: missing, under-scoped and admin keys."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from envfoundry_client import Client, Forbidden, NotFound, Unauthorized

from service.api.auth import new_key
from tests.client.test_client import PROBE_CODE
from tests.client.test_rollout import records, rollout
from tests.conftest import Server, start_server
from tests.scripted_openai import Running

RUN_KEY, RUN_LINE = new_key("client-tests", ["run"])
ADMIN_KEY, ADMIN_LINE = new_key("client-tests", ["run", "admin"])


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("keyed"), extra_env={"ENVFOUNDRY_API_KEYS": f"{RUN_LINE};{ADMIN_LINE}"})
    yield server
    server.stop()


def test_a_missing_or_unknown_key_is_unauthorized(keyed: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVFOUNDRY_API_KEY", raising=False)
    with Client(keyed.url) as ef, pytest.raises(Unauthorized) as raised:
        ef.list_environments()
    assert raised.value.status == 401
    with Client(keyed.url, api_key="efk_not-a-key") as ef, pytest.raises(Unauthorized):
        ef.list_environments()


def test_scopes_decide_who_may_add_and_delete(keyed: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    with Client(keyed.url, api_key=RUN_KEY) as ef:
        assert "lib-001" in [s.scenario_id for s in ef.list_scenarios("library_circulation")]
        with pytest.raises(Forbidden):
            ef.create_environment("keyed-counter", "Counter", PROBE_CODE)
    monkeypatch.setenv("ENVFOUNDRY_API_KEY", ADMIN_KEY)
    with Client(keyed.url) as ef:
        ef.create_environment("keyed-counter", "Counter", PROBE_CODE)
        ef.delete_environment("keyed-counter")
        with pytest.raises(NotFound):
            ef.get_environment("keyed-counter")


def test_rollout_sends_its_key(keyed: Server, chat: Running, tmp_path: Path) -> None:
    chat.script.reset({})  # no script: the episode ends with the LLM's 404, after the session was made
    out = tmp_path / "keyed.jsonl"
    done = rollout(keyed, chat, out, "--scenario", "lib-001", "--api-key", RUN_KEY)
    assert done.returncode == 1 and "error: the only episode failed outside the agent (llm_error 1)" in done.stderr
    (record,) = records(out)
    assert record["finish_reason"] == "llm_error" and record["total"] == 3
