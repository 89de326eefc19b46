"""The measured denial-of-service requests: each now gets a small, named answer and changes nothing."""

from __future__ import annotations

import json
import secrets
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from service.catalog.analysis import Analysis
from service.catalog.arguments import MAX_VALUES, ArgumentChecker
from service.catalog.model import CatalogError
from tests.service.test_api import new_session, problem, state

BIG_LITERAL = "class Picky:\n    def __init__(self):\n        self.picked = []\n\n" \
    "    def pick(self, values: 'List[Literal[{}]]') -> dict:\n".format(", ".join(map(str, range(50_000)))) + \
    '        """Pick values."""\n        self.picked = values\n        return {"success": True}\n'


def test_a_million_argument_values_are_refused_before_parsing(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="store-001")
    before = state(client, sid)
    response = client.post(f"/v1/sessions/{sid}/calls", json={"name": "place_order", "arguments": {
        "customer_id": "C001", "items": [1] * 10**6}})
    body = problem(response, 413, "payload-too-large")
    assert body["limit"] == "max_body_values" and body["value"] == 200_000
    assert state(client, sid) == before


def test_argument_values_past_the_bound_are_refused_by_name(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="store-001")
    before = state(client, sid)
    items = [1] * 50_000
    response = client.post(f"/v1/sessions/{sid}/calls", json={"name": "place_order",
                                                               "arguments": {"customer_id": "C001", "items": items}})
    body = problem(response, 422, "limit-exceeded")
    assert body["limit"] == "max_argument_values" and body["value"] == MAX_VALUES
    assert len(response.content) < 2000
    assert state(client, sid) == before


def test_deeply_nested_arguments_are_refused_by_name(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="probe-001")
    nested: object = "x"
    for _ in range(100):
        nested = [nested]
    body = problem(client.post(f"/v1/sessions/{sid}/calls", json={"name": "tag", "arguments": {"tag": nested}}),
                   422, "limit-exceeded")
    assert body["limit"] == "max_argument_depth"
    assert state(client, sid)["step"] == 0


def test_a_huge_enum_costs_a_set_lookup_and_a_short_message() -> None:
    schema = {"type": "object", "properties": {"values": {"type": "array", "items": {"enum": list(range(50_000))}}}}
    checker = ArgumentChecker(schema)
    assert checker.problem({"values": [49_999] * 5_000}) is None
    message = checker.problem({"values": [1, 2, 50_000]})
    assert message is not None and "argument 'values/2'" in message and "50000 allowed values" in message
    assert len(message) < 200
    # JSON Schema equality: true is not 1, 1.0 is 1
    flags = ArgumentChecker({"type": "object", "properties": {"v": {"enum": [1, "a"]}}})
    assert flags.problem({"v": 1.0}) is None and flags.problem({"v": True}) is not None


def test_a_tool_typed_with_a_huge_literal_answers_calls_normally(client: httpx.Client) -> None:
    env_id = f"picky-{secrets.token_hex(3)}"
    created = client.post("/v1/environments", json={"env_id": env_id, "class_name": "Picky",
                                                     "code": "from typing import List, Literal\n" + BIG_LITERAL})
    assert created.status_code == 201, created.text[:500]
    sid = new_session(client, env_id=env_id)
    ok = client.post(f"/v1/sessions/{sid}/calls", json={"name": "pick", "arguments": {"values": [7] * 100}}).json()
    assert ok["ok"] is True
    bad = client.post(f"/v1/sessions/{sid}/calls", json={"name": "pick", "arguments": {"values": [-1]}}).json()
    assert bad["error"]["type"] == "invalid_arguments" and len(bad["error"]["message"]) < 200
    assert state(client, sid)["state"]["picked"] == [7] * 100


def test_a_scenario_with_two_million_checks_is_refused_before_parsing(client: httpx.Client) -> None:
    payload = json.dumps({"env_id": "probe", "task": "t", "checklist": [1] * 2_000_000})
    response = client.post("/v1/scenarios", content=payload, headers={"content-type": "application/json"})
    assert problem(response, 413, "payload-too-large")["limit"] == "max_body_values"
    assert len(response.content) < 2000


def test_a_checklist_over_its_bound_gets_a_small_422(client: httpx.Client) -> None:
    payload = json.dumps({"env_id": "probe", "task": "t", "checklist": [1] * 150_000})
    response = client.post("/v1/scenarios", content=payload, headers={"content-type": "application/json"})
    body = problem(response, 422, "invalid-request")
    assert len(response.content) < 20_000
    assert body["errors"][0]["field"] == "checklist" and "at most 100" in body["errors"][0]["message"]


def test_a_validation_error_lists_at_most_twenty_problems(client: httpx.Client) -> None:
    checks = [{"item": 1, "check": 2, "extra": 3}] * 90
    response = client.post("/v1/scenarios", json={"env_id": "probe", "task": "t", "checklist": checks})
    body = problem(response, 422, "invalid-request")
    assert len(body["errors"]) == 20 and body["errors_omitted"] > 0


BIG_SET = '''
class Big:
    def __init__(self):
        self.seen = set(range(1_000_000))

    def size(self) -> int:
        """How many values are held."""
        return len(self.seen)
'''


def test_a_million_value_state_is_viewed_while_other_requests_are_answered(client: httpx.Client) -> None:
    env_id = f"big-{secrets.token_hex(3)}"
    assert client.post("/v1/environments", json={"env_id": env_id, "class_name": "Big",
                                                  "code": BIG_SET}).status_code == 201
    sid = new_session(client, env_id=env_id)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.get, f"/v1/sessions/{sid}/state")
        answered_meanwhile = 0
        while not pending.done():
            if client.get("/healthz").status_code == 200 and not pending.done():
                answered_meanwhile += 1
        response = pending.result()
    assert response.status_code == 200
    view = response.json()
    assert view["step"] == 0 and set(view["state"]["seen"]) == set(range(1_000_000))
    assert answered_meanwhile > 0  # the view was built off the event loop


def test_a_class_with_too_many_tools_is_refused_by_name(client: httpx.Client) -> None:
    methods = "".join(f"    def tool_{i}(self) -> int:\n        \"\"\"Tool {i}.\"\"\"\n        return {i}\n"
                      for i in range(300))
    code = "class Wide:\n    def __init__(self):\n        self.n = 0\n" + methods
    body = problem(client.post("/v1/environments", json={"env_id": "wide", "class_name": "Wide", "code": code}),
                   422, "invalid-environment")
    assert body["reason"] == "max_tools" and "at most 256" in body["detail"]


@pytest.mark.anyio
async def test_analysis_past_its_time_limit_is_killed_and_named() -> None:
    analysis = Analysis(timeout=0.001)
    with pytest.raises(CatalogError) as failure:
        await analysis.environment(env_id="slow", class_name="Slow", code="class Slow:\n    pass\n", summary="",
                                   introduction="", rules=[])
    assert failure.value.reason == "analysis_timeout"
    done = await Analysis().environment(env_id="ok", class_name="Ok", code="class Ok:\n    def go(self) -> int:\n"
                                        "        \"\"\"Go.\"\"\"\n        return 1\n", summary="", introduction="",
                                        rules=[])
    assert [t["function"]["name"] for t in done.tools] == ["go"]


@pytest.mark.anyio
async def test_the_code_analysis_bounds_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.server.app import make_analysis
    from service.server.settings import Settings

    monkeypatch.setenv("ENVFOUNDRY_ANALYSIS_MAX_TOOLS", "2")
    analysis = make_analysis(Settings())
    methods = "".join(f"    def tool_{i}(self) -> int:\n        \"\"\"Tool {i}.\"\"\"\n        return {i}\n" for i in range(3))
    with pytest.raises(CatalogError) as refused:
        await analysis.environment(env_id="three", class_name="Three", code="class Three:\n" + methods, summary="",
                                   introduction="", rules=[])
    assert refused.value.reason == "max_tools" and "at most 2 tools" in str(refused.value)
    with pytest.raises(CatalogError) as slow:
        await make_analysis(Settings(analysis_timeout=0.001)).environment(
            env_id="slow", class_name="Slow", code="class Slow:\n    pass\n", summary="", introduction="", rules=[])
    assert slow.value.reason == "analysis_timeout"
