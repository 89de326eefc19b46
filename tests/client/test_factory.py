"""Classes for TRL's ``environment_factory``: methods whose schemas are the service's, rollouts that score.

transformers (a test extra) rebuilds each method's schema with ``get_json_schema``, as TRL does;
trl itself is not installed here (it pulls torch), so its discovery is exercised through the same
``inspect`` call on the class it makes (``inspect.getmembers(type(env), inspect.isfunction)``).
"""

from __future__ import annotations

import gc
import inspect
import json
import math
import pickle
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from envfoundry_client import Client
from envfoundry_client.factory import dataset_rows, environment_factory
from envfoundry_client.signatures import described, tool_function
from transformers.utils import get_json_schema

from tests.client.agent_scripts import LIB_001_OPENING, LIB_001_USER
from tests.client.test_rollout import task
from tests.conftest import Server
from tests.scripted_openai import Running


def types_of(schema: dict[str, Any]) -> set[str]:
    """The JSON types a parameter schema admits, however it spells them (type list, anyOf, nullable)."""
    if "anyOf" in schema:
        return set().union(*(types_of(part) for part in schema["anyOf"]))
    kind = schema.get("type")
    found = set(kind) if isinstance(kind, list) else {kind} if kind else set()
    return found | ({"null"} if schema.get("nullable") else set())


def enum_of(schema: dict[str, Any]) -> set[Any]:
    if "anyOf" in schema:
        return set().union(*(enum_of(part) for part in schema["anyOf"]))
    return set(schema.get("enum", []))


def test_every_generated_method_gives_back_the_service_tool_schema(ef: Client, ef_server: Server) -> None:
    compared = defaults = item_fields = tools = 0
    for summary in ef.list_environments():
        env = environment_factory(ef_server.url, summary.env_id, client=ef)()
        for tool in ef.get_environment(summary.env_id).tools:
            want = tool["function"]
            got = get_json_schema(getattr(env, want["name"]))["function"]
            assert (got["name"], got["description"]) == (want["name"], want["description"])
            props, theirs = want["parameters"]["properties"], got["parameters"]["properties"]
            assert list(theirs) == sorted(props, key=lambda p: p not in want["parameters"].get("required", []))
            assert set(got["parameters"].get("required", [])) == set(want["parameters"].get("required", []))
            # the service closes every tool's arguments; get_json_schema cannot say so (documented)
            assert want["parameters"].get("additionalProperties") is False
            assert "additionalProperties" not in got["parameters"]
            tools += 1
            for name, schema in props.items():
                # a parameter the service documents keeps its text; one it does not is described by its name;
                # then, in words, what no hint carries: the default and the fields of nested objects
                assert theirs[name]["description"] == described(schema, name), (want["name"], name)
                assert theirs[name]["description"].startswith(" ".join((schema.get("description") or name).split()))
                if "default" in schema:
                    assert f"Default: {json.dumps(schema['default'])}." in theirs[name]["description"]
                    defaults += 1
                for field in (schema.get("items") or {}).get("properties") or {}:
                    assert f"{field} (" in theirs[name]["description"], (want["name"], name, field)
                    item_fields += 1
                assert "default" not in theirs[name]  # the documented differences
                assert "properties" not in theirs[name].get("items", {})
                assert types_of(theirs[name]) == types_of(schema), (want["name"], name)
                assert enum_of(theirs[name]) == enum_of(schema), (want["name"], name)
                compared += 1
    assert compared >= 151  # the bundled catalog's seven environments hold 151 parameters
    assert tools >= 79 and defaults >= 21 and item_fields >= 2  # as issue 32 counted them


def test_trainer_sees_one_tool_per_method_and_reset_and_get_reward(ef: Client, ef_server: Server) -> None:
    Library = environment_factory(ef_server.url, "library_circulation", client=ef)
    public = {name for name, _ in inspect.getmembers(Library, predicate=inspect.isfunction) if not name.startswith("_")}
    tools = {t["function"]["name"] for t in ef.get_environment("library_circulation").tools}
    assert public == tools | {"reset", "get_reward"}


def test_a_scripted_episode_through_the_methods_scores_one(ef: Client, ef_server: Server) -> None:
    Library = environment_factory(ef_server.url, "library_circulation", client=ef)
    env = Library()
    rows = dataset_rows(ef_server.url, "library_circulation")
    row = next(r for r in rows if r["scenario_id"] == "lib-001")
    assert env.reset(**row) == task(ef_server, "lib-001")
    first = env.session_id
    assert env.get_reward() < 1.0
    wrong = env.return_book(loan_id="L9999")
    assert wrong.startswith('{"success": false') or wrong.startswith("Error")
    for call in ef.get_scenario("lib-001").reference_solution or []:
        getattr(env, call.name)(**call.arguments)
    assert env.get_reward() == 1.0
    env.reset(scenario_id="lib-002")  # a new rollout closes the previous session
    second = env.session_id
    assert httpx.get(f"{ef_server.url}/v1/sessions/{first}").status_code == 404
    del env
    gc.collect()  # a collected instance closes its session too
    assert httpx.get(f"{ef_server.url}/v1/sessions/{second}").status_code == 404
    with pytest.raises(ValueError, match="store-001"):
        Library().reset(scenario_id="store-001")


def test_conversation_mode_talks_to_the_simulated_user(ef: Client, ef_server: Server, chat: Running) -> None:
    chat.script.reset({}, users={task(ef_server, "lib-001"): LIB_001_USER})
    env = environment_factory(ef_server.url, "library_circulation", mode="conversation", client=ef)()
    assert env.reset(scenario_id="lib-001") == LIB_001_OPENING
    assert get_json_schema(env.talk_to_user)["function"]["parameters"]["required"] == ["content"]
    assert env.talk_to_user("Kindred is returned. Anything else?") == LIB_001_USER[1]
    assert math.isfinite(env.get_reward())


def test_names_python_cannot_carry_are_refused_with_the_tool_named() -> None:
    def forward(*_: Any) -> None:
        return None

    with pytest.raises(ValueError, match="'class'"):
        tool_function({"name": "lookup", "parameters": {"properties": {"class": {"type": "string"}}}}, forward)
    with pytest.raises(ValueError, match="'bad-name'"):
        tool_function({"name": "bad-name"}, forward)


def test_a_rollout_made_with_an_idle_ttl_is_reaped_after_it_when_nobody_closes_it(ef: Client,
                                                                                 ef_server: Server) -> None:
    Library = environment_factory(ef_server.url, "library_circulation", client=ef, idle_ttl_seconds=1)
    env = pickle.loads(pickle.dumps(Library))()  # (a class rebuilt in another process keeps it too)
    env.reset(scenario_id="lib-001")
    # what a SIGKILL leaves: a session nobody closes, reaped once idle for a second, not for the hour
    assert httpx.get(f"{ef_server.url}/v1/sessions/{env.session_id}").status_code == 200
    time.sleep(1.5)
    assert httpx.get(f"{ef_server.url}/v1/sessions/{env.session_id}").status_code == 404


def test_the_idle_ttl_comes_from_the_environment_when_not_given(ef: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVFOUNDRY_SESSION_IDLE_SECONDS", "2")
    session = ef.create_session("lib-001")
    left = (ef.get_session(session.session_id).expires_at - datetime.now(UTC)).total_seconds()
    assert 0 < left <= 2
    explicit = ef.create_session("lib-001", idle_ttl_seconds=60)
    left = (ef.get_session(explicit.session_id).expires_at - datetime.now(UTC)).total_seconds()
    assert 2 < left <= 60
    monkeypatch.setenv("ENVFOUNDRY_SESSION_IDLE_SECONDS", "soon")
    with pytest.raises(ValueError, match="ENVFOUNDRY_SESSION_IDLE_SECONDS"):
        ef.create_session("lib-001")
