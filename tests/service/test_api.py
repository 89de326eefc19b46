"""REST API v1, against the real app (in this process: tests/in_process.py) on each session store."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from service.api.problems import MEDIA_TYPE
from tests.conftest import per_store
from tests.in_process import AppServer, start_app


@pytest.fixture(scope="module", params=["memory", "redis"])
def server(request: pytest.FixtureRequest) -> Iterator[AppServer]:
    """The app in this process on each store. Checks stop after 1 s, not the default 5: the looping check
    of test_misbehaving_checks_fail_with_reasons waits it out (as tests/test_fuzz.py's server's do)."""
    yield from per_store(request, start_app, {"ENVFOUNDRY_CHECK_TIMEOUT": "1"})


def problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(MEDIA_TYPE)
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:envfoundry:problem:{slug}"
    assert body["status"] == status and body["detail"]
    return body


def new_session(client: httpx.Client, **body: Any) -> str:
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


def call(client: httpx.Client, sid: str, name: str, arguments: Any = None) -> dict[str, Any]:
    response = client.post(f"/v1/sessions/{sid}/calls", json={"name": name, "arguments": arguments or {}})
    assert response.status_code == 200, response.text
    return dict(response.json())


def state(client: httpx.Client, sid: str) -> dict[str, Any]:
    return dict(client.get(f"/v1/sessions/{sid}/state").json())


def test_healthz(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_lists_environments_with_counts(client: httpx.Client) -> None:
    envs = {e["env_id"]: e for e in client.get("/v1/environments").json()["environments"]}
    assert {"library_circulation", "online_store_orders", "probe"} <= set(envs)
    lib = envs["library_circulation"]
    assert lib["class_name"] == "LibraryCirculationSystem" and lib["tool_count"] >= 8 and lib["scenario_count"] >= 3


def test_environment_detail_has_openai_tool_schemas(client: httpx.Client) -> None:
    detail = client.get("/v1/environments/probe").json()
    assert detail["rules"] == ["Item ids are unique."]
    names = {t["function"]["name"] for t in detail["tools"]}
    assert "add_item" in names and "_private_helper" not in names and "total" not in names
    add = next(t for t in detail["tools"] if t["function"]["name"] == "add_item")
    assert add["type"] == "function"
    assert add["function"]["parameters"]["required"] == ["item_id", "name"]


def test_unknown_environment_scenario_and_session_are_404(client: httpx.Client) -> None:
    problem(client.get("/v1/environments/nope"), 404, "not-found")
    problem(client.get("/v1/environments/nope/scenarios"), 404, "not-found")
    problem(client.get("/v1/scenarios/nope"), 404, "not-found")
    problem(client.post("/v1/sessions", json={"scenario_id": "nope"}), 404, "not-found")
    problem(client.post("/v1/sessions", json={"env_id": "nope"}), 404, "not-found")
    for method, path in [("GET", ""), ("GET", "/tools"), ("GET", "/state"), ("GET", "/trajectory"),
                         ("POST", "/score"), ("POST", "/fork"), ("DELETE", "")]:
        problem(client.request(method, f"/v1/sessions/ses_missing{path}"), 404, "not-found")
    problem(client.post("/v1/sessions/ses_missing/calls", json={"name": "x"}), 404, "not-found")


def test_whole_episode_with_the_reference_solution_scores_one(client: httpx.Client) -> None:
    scenarios = client.get("/v1/environments/library_circulation/scenarios").json()["scenarios"]
    assert scenarios
    for summary in scenarios:
        scenario = client.get(f"/v1/scenarios/{summary['scenario_id']}").json()
        created = client.post("/v1/sessions", json={"scenario_id": scenario["scenario_id"]}).json()
        assert created["task"] == scenario["task"] and created["tools"]
        sid = created["session_id"]
        before = client.post(f"/v1/sessions/{sid}/score").json()
        assert before["reward"] < 1.0
        for i, step in enumerate(scenario["reference_solution"], start=1):
            result = call(client, sid, step["name"], step["arguments"])
            assert result["ok"] and result["step"] == i and result["error"] is None
            assert isinstance(result["observation"], str)
        score = client.post(f"/v1/sessions/{sid}/score").json()
        assert score == {**score, "reward": 1.0, "passed": score["total"]}
        info = client.get(f"/v1/sessions/{sid}").json()
        assert info["steps"] == len(scenario["reference_solution"]) and info["expires_at"] > info["created_at"]
        trajectory = client.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]
        assert [s["name"] for s in trajectory] == [s["name"] for s in scenario["reference_solution"]]


def test_scoring_does_not_end_or_change_the_session(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="probe-001")
    call(client, sid, "add_item", {"item_id": "A1", "name": "Apple", "qty": 2})
    before = state(client, sid)
    first = client.post(f"/v1/sessions/{sid}/score").json()
    assert (first["passed"], first["total"]) == (2, 3)
    assert state(client, sid) == before
    call(client, sid, "increment", {"by": 3})
    assert client.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0


def test_a_scenario_without_checks_scores_null(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="probe-no-checks")
    scored = client.post(f"/v1/sessions/{sid}/score").json()
    versions = client.get("/v1/scenarios/probe-no-checks").json()["version"], client.get(
        "/v1/environments/probe").json()["version"]
    assert scored == {"reward": None, "passed": 0, "total": 0, "checks": [],
                      "scenario_version": versions[0], "env_version": versions[1]}


def test_misbehaving_checks_fail_with_reasons(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="probe-bad-checks")
    score = client.post(f"/v1/sessions/{sid}/score").json()
    outcome = {c["item"]: (c["passed"], c["error"]) for c in score["checks"]}
    assert outcome["passes"] == (True, None)
    assert outcome["returns non-bool"][0] is False and "expected bool" in outcome["returns non-bool"][1]
    assert outcome["raises"][0] is False and "KeyError" in outcome["raises"][1]
    assert outcome["no check_func"][0] is False and "check_func" in outcome["no check_func"][1]
    assert outcome["loops"][0] is False and "timeout" in outcome["loops"][1]
    assert outcome["sees mutation?"] == (True, None)  # a check cannot change what the next one sees
    assert score["passed"] == 3 and score["total"] == 7


def test_session_from_env_and_init_config(client: httpx.Client) -> None:
    created = client.post("/v1/sessions", json={"env_id": "probe", "init_config": {"counter": 10}}).json()
    assert created["scenario_id"] is None and created["task"] is None
    assert state(client, created["session_id"])["state"]["counter"] == 10


def test_tool_failures_are_observations_and_lose_nothing(client: httpx.Client) -> None:
    sid = new_session(client, env_id="probe", init_config={"counter": 1})
    before = state(client, sid)["state"]
    cases = [
        ("no_such_tool", {}, "unknown_tool"),
        ("_private_helper", {}, "unknown_tool"),
        ("increment", {"by": "three"}, "invalid_arguments"),
        ("increment", {"step": 1}, "invalid_arguments"),
        ("add_item", {"item_id": "x"}, "invalid_arguments"),
        ("increment", "{not json", "invalid_arguments"),
        ("increment", "[1, 2]", "invalid_arguments"),
        ("fail_after_change", {}, "tool_exception"),
        ("store_unserializable", {}, "tool_exception"),
    ]
    for step, (name, arguments, kind) in enumerate(cases, start=1):
        result = call(client, sid, name, arguments)
        assert result["ok"] is False and result["error"]["type"] == kind, (name, result)
        assert result["step"] == step and result["observation"].startswith(f"Error ({kind})")
        assert state(client, sid)["state"] == before
    wrong_type = call(client, sid, "increment", {"by": "three"})
    assert "by" in wrong_type["error"]["message"]
    assert call(client, sid, "increment", '{"by": 2}')["ok"]  # a JSON string, as OpenAI tool calls carry
    assert state(client, sid)["state"]["counter"] == 3


def test_a_misspelt_argument_is_named_with_the_one_it_is_probably_meant_to_be(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="lib-001")
    result = call(client, sid, "renew_loan", {"loan": "L0001"})
    assert result["ok"] is False and result["error"]["type"] == "invalid_arguments"
    assert result["error"]["message"] == ("renew_loan: unexpected argument 'loan' (did you mean 'loan_id'?); "
                                          "the tool takes 'loan_id'; 'loan_id' is a required property")
    extra = call(client, sid, "renew_loan", {"loan_id": "L0001", "note": "x"})["error"]["message"]
    assert extra == "renew_loan: unexpected argument 'note'; the tool takes 'loan_id'"
    # A failed call is a step of the trajectory (it counts toward ENVFOUNDRY_MAX_STEPS) and changes nothing.
    assert client.get(f"/v1/sessions/{sid}").json()["steps"] == 2
    assert state(client, sid)["state"]["loans"]["L0001"]["renewals"] == 0


def test_non_json_results_and_rich_state_have_json_views(client: httpx.Client) -> None:
    sid = new_session(client, env_id="probe")
    assert call(client, sid, "return_odd", {"kind": "set"})["result"] == ["a", "b"]
    assert call(client, sid, "return_odd", {"kind": "object"})["result"] == {"__type__": "Note", "text": "n"}
    assert call(client, sid, "store_rich")["ok"]
    rich = state(client, sid)["state"]["rich"]
    assert rich["set"] == [1, 2, 3] and rich["tuple"] == [1, "a"] and rich["when"] == "2024-05-01T12:30:00"
    assert rich["note"] == {"__type__": "Note", "text": "hello"} and rich["7"] == "int key"
    assert call(client, sid, "inspect_rich")["result"]["equal"] is True


def test_trajectory_records_diffs(client: httpx.Client) -> None:
    sid = new_session(client, env_id="probe", init_config={"counter": 0, "items": {}})
    call(client, sid, "add_item", {"item_id": "A", "name": "a"})
    call(client, sid, "increment", {"by": 5})
    call(client, sid, "get_counter")
    steps = client.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert steps[0]["diff"]["added"] == [{"path": "/items/A", "value": {"name": "a", "qty": 1}}]
    assert steps[1]["diff"]["changed"] == [{"path": "/counter", "old": 0, "new": 5}]
    assert steps[2]["diff"] == {"added": [], "removed": [], "changed": []} and steps[2]["result"] == 5


def test_fork_copies_state_and_trajectory_then_diverges(client: httpx.Client) -> None:
    sid = new_session(client, env_id="probe", init_config={"counter": 0})
    call(client, sid, "increment", {"by": 1})
    fork = client.post(f"/v1/sessions/{sid}/fork")
    assert fork.status_code == 201
    child = fork.json()["session_id"]
    assert child != sid
    assert client.get(f"/v1/sessions/{child}").json()["parent_id"] == sid
    assert len(client.get(f"/v1/sessions/{child}/trajectory").json()["steps"]) == 1
    call(client, child, "increment", {"by": 10})
    call(client, sid, "increment", {"by": 100})
    assert state(client, child)["state"]["counter"] == 11
    assert state(client, sid)["state"]["counter"] == 101
    assert call(client, child, "get_counter")["step"] == 3


def test_delete_then_404(client: httpx.Client) -> None:
    sid = new_session(client, env_id="probe")
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    problem(client.get(f"/v1/sessions/{sid}"), 404, "not-found")
    problem(client.delete(f"/v1/sessions/{sid}"), 404, "not-found")


def test_concurrent_calls_on_one_session_apply_exactly_once(client: httpx.Client, server: Any) -> None:
    sid = new_session(client, env_id="probe", init_config={"counter": 0})

    def one(_: int) -> dict[str, Any]:
        with server.client() as own:
            return call(own, sid, "increment", {"by": 1})

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(one, range(24)))
    assert all(r["ok"] for r in results)
    assert sorted(r["step"] for r in results) == list(range(1, 25))
    assert sorted(r["result"]["data"] for r in results) == list(range(1, 25))
    assert state(client, sid) == {"step": 24, "state": {**state(client, sid)["state"], "counter": 24}}


def test_malformed_bodies_name_the_field(client: httpx.Client) -> None:
    sid = new_session(client, env_id="probe")
    body = problem(client.post(f"/v1/sessions/{sid}/calls", json={"arguments": {}}), 422, "invalid-request")
    assert body["errors"][0]["field"] == "name"
    body = problem(client.post(f"/v1/sessions/{sid}/calls", json={"name": "x", "arguments": 5}), 422,
                   "invalid-request")
    assert any(e["field"].startswith("arguments") for e in body["errors"])
    problem(client.post("/v1/sessions", json={"scenario_id": "probe-001", "env_id": "probe"}), 422,
            "invalid-request")
    problem(client.post("/v1/sessions", json={}), 422, "invalid-request")
    problem(client.post("/v1/sessions", content=b"{not json", headers={"content-type": "application/json"}), 422,
            "invalid-request")
    body = problem(client.post("/v1/environments", json={"env_id": "x y", "class_name": "A", "code": "x"}), 422,
                   "invalid-request")
    assert body["errors"][0]["field"] == "env_id"


def test_oversized_body_is_413_and_the_service_keeps_working(client: httpx.Client) -> None:
    sid = new_session(client, env_id="probe")
    payload = b'{"name": "increment", "arguments": {"by": "' + b"9" * (50 << 20) + b'"}}'
    body = problem(client.post(f"/v1/sessions/{sid}/calls", content=payload,
                               headers={"content-type": "application/json"}), 413, "payload-too-large")
    assert body["limit"] == "max_body_bytes" and body["value"] == 8 << 20
    assert client.get(f"/v1/sessions/{sid}").json()["steps"] == 0
    assert call(client, sid, "increment")["ok"]


ENV_CODE = '''
class Wallet:
    def __init__(self):
        self.balance = 0

    def deposit(self, amount: int) -> dict:
        """Deposit money.

        Args:
            amount: Positive amount.
        """
        if amount <= 0:
            return {"success": False, "error": "amount must be positive"}
        self.balance += amount
        return {"success": True, "data": self.balance}
'''


def test_create_environment_and_scenario_then_play(client: httpx.Client, server: Any) -> None:
    env_id = f"wallet-{server.url.rsplit(':', 1)[-1]}"
    created = client.post("/v1/environments", json={"env_id": env_id, "class_name": "Wallet", "code": ENV_CODE,
                                                     "summary": "A wallet", "rules": ["No overdrafts."]})
    assert created.status_code == 201, created.text
    assert [t["function"]["name"] for t in created.json()["tools"]] == ["deposit"]
    again = client.post("/v1/environments", json={"env_id": env_id, "class_name": "Wallet", "code": ENV_CODE})
    assert again.status_code == 201
    changed = client.post("/v1/environments", json={"env_id": env_id, "class_name": "Wallet",
                                                     "code": ENV_CODE + "\n# changed\n"})
    assert changed.status_code == 201, changed.text  # other code under the id: its new version
    assert changed.json()["version"] != created.json()["version"]
    assert client.get(f"/v1/environments/{env_id}").json()["version"] == changed.json()["version"]
    scenario = client.post("/v1/scenarios", json={
        "env_id": env_id, "task": "Deposit 5.", "init_config": {"balance": 1},
        "checklist": [{"item": "balance is 6", "check": "def check_func(final_state):\n"
                       "    return final_state['balance'] == 6", "kind": "change"},
                      {"item": "no overdraft", "check": "def check_func(final_state):\n"
                       "    return final_state['balance'] >= 0", "kind": "keep"}],
    })
    assert scenario.status_code == 201, scenario.text
    scenario_id = scenario.json()["scenario_id"]
    checklist = client.get(f"/v1/scenarios/{scenario_id}").json()["checklist"]
    assert [(c["item"], c["kind"]) for c in checklist] == [("balance is 6", "change"), ("no overdraft", "keep")]
    sid = new_session(client, scenario_id=scenario_id)
    assert call(client, sid, "deposit", {"amount": 5})["result"] == {"success": True, "data": 6}
    assert client.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0


def test_sessions_of_a_deleted_environment_are_gone_even_after_the_id_is_added_again(client: httpx.Client,
                                                                                    server: Any) -> None:
    env_id = f"wallet-gone-{server.url.rsplit(':', 1)[-1]}"
    body = {"env_id": env_id, "class_name": "Wallet", "code": ENV_CODE}
    assert client.post("/v1/environments", json=body).status_code == 201
    first = new_session(client, env_id=env_id, init_config={"balance": 1})
    untouched = new_session(client, env_id=env_id, init_config={"balance": 1})
    fork = client.post(f"/v1/sessions/{first}/fork").json()["session_id"]
    assert call(client, fork, "deposit", {"amount": 1})["result"] == {"success": True, "data": 2}  # a fork goes on
    assert client.delete(f"/v1/environments/{env_id}").status_code == 204
    # The same id and code again: a new registration, which the old sessions were not made from.
    assert client.post("/v1/environments", json=body).status_code == 201
    problem(client.get(f"/v1/sessions/{first}"), 404, "not-found")
    detail = problem(client.post(f"/v1/sessions/{untouched}/calls", json={"name": "deposit",
                                                                         "arguments": {"amount": 5}}), 404, "not-found")
    assert f"environment '{env_id}' was deleted" in detail["detail"]
    fresh = new_session(client, env_id=env_id, init_config={"balance": 1})
    listed = [s["session_id"] for s in client.get("/v1/sessions", params={"limit": 1000}).json()["sessions"]]
    assert fresh in listed and not {first, untouched, fork} & set(listed)
    for sid in (first, untouched, fork):  # gone for every route, not only calls and score
        for response in (client.get(f"/v1/sessions/{sid}"), client.get(f"/v1/sessions/{sid}/state"),
                         client.get(f"/v1/sessions/{sid}/trajectory"), client.post(f"/v1/sessions/{sid}/score")):
            problem(response, 404, "not-found")
    assert call(client, fresh, "deposit", {"amount": 5})["result"] == {"success": True, "data": 6}
    assert client.delete(f"/v1/environments/{env_id}").status_code == 204


def test_reading_a_session_of_a_deleted_environment_does_not_keep_it_alive(client: httpx.Client,
                                                                           server: Any) -> None:
    env_id = f"wallet-idle-{server.url.rsplit(':', 1)[-1]}"
    assert client.post("/v1/environments", json={"env_id": env_id, "class_name": "Wallet",
                                                 "code": ENV_CODE}).status_code == 201
    sid = new_session(client, env_id=env_id)
    before = client.get("/v1/sessions", params={"limit": 1000}).json()["total"]
    assert client.delete(f"/v1/environments/{env_id}").status_code == 204
    problem(client.get(f"/v1/sessions/{sid}"), 404, "not-found")  # no expires_at pushed forward: no session
    assert client.get("/v1/sessions", params={"limit": 1000}).json()["total"] == before - 1  # nor counted


def test_a_get_never_deletes_a_session_it_finds_unusable(client: httpx.Client, server: Any,
                                                         request: pytest.FixtureRequest) -> None:
    """Reads read: GETs of a session whose environment was deleted answer 404 and leave it stored;
    the next write to it removes it."""
    env_id = f"wallet-read-{server.url.rsplit(':', 1)[-1]}"
    assert client.post("/v1/environments", json={"env_id": env_id, "class_name": "Wallet",
                                                 "code": ENV_CODE}).status_code == 201
    sid = new_session(client, env_id=env_id)
    assert client.delete(f"/v1/environments/{env_id}").status_code == 204
    for path in ("", "/state", "/trajectory", "/tools", "/turns"):
        problem(client.get(f"/v1/sessions/{sid}{path}"), 404, "not-found")
    assert sid not in [s["session_id"] for s in client.get("/v1/sessions", params={"limit": 1000}).json()["sessions"]]
    redis_url = request.getfixturevalue("redis_url") if request.node.callspec.params["server"] == "redis" else None

    def stored() -> bool:
        if redis_url is None:
            return True  # (the memory store is in the server's process: the write below tells instead)
        return any(redis.Redis.from_url(redis_url).scan_iter(match=f"*:session:{{{sid}}}:meta", count=1000))

    assert stored()
    # Still stored: the write finds the session and says why it cannot go on, then removes it.
    write = {"name": "deposit", "arguments": {"amount": 1}}
    detail = problem(client.post(f"/v1/sessions/{sid}/calls", json=write), 404, "not-found")["detail"]
    assert f"environment '{env_id}' was deleted" in detail
    assert redis_url is None or not stored()
    detail = problem(client.post(f"/v1/sessions/{sid}/calls", json=write), 404, "not-found")["detail"]
    assert "may have expired" in detail


@pytest.mark.parametrize(
    ("code", "reason", "fragment"),
    [
        ("class Bad:\n    def f(self)\n        pass\n", "syntax_error", "line 2"),
        ("class Other:\n    pass\n", "missing_class", "Bad"),
        ("class Bad:\n    def __init__(self, config=None):\n        raise ValueError('no')\n", "init_error", "no"),
        ("import no_such_module_qq\nclass Bad:\n    pass\n", "undeclared_import", "no_such_module_qq"),
        # an import by computed name is not seen before the sandbox loads the code, which finds nothing
        ("import importlib\nimportlib.import_module('no_such_' + 'module_qq')\nclass Bad:\n    pass\n",
         "import_error", "no_such_module_qq"),
    ],
)
def test_invalid_environment_code_is_422_with_the_reason(client: httpx.Client, code: str, reason: str,
                                                         fragment: str) -> None:
    body = problem(client.post("/v1/environments", json={"env_id": f"bad-{reason}", "class_name": "Bad",
                                                         "code": code}), 422, "invalid-environment")
    assert body["reason"] == reason and fragment in body["detail"]
    problem(client.get(f"/v1/environments/bad-{reason}"), 404, "not-found")


def test_scenario_creation_errors(client: httpx.Client) -> None:
    problem(client.post("/v1/scenarios", json={"env_id": "nope", "task": "t"}), 404, "not-found")
    body = problem(client.post("/v1/scenarios", json={
        "env_id": "probe", "task": "t",
        "checklist": [{"item": "bad", "check": "def check_func(final_state)\n    return True"}],
    }), 422, "invalid-request")
    assert "checklist[0]" in body["detail"] and "line 1" in body["detail"]
    problem(client.post("/v1/scenarios", json={"scenario_id": "probe-001", "env_id": "probe", "task": "other"}),
            409, "conflict")


FRAGILE = """
class Fragile:
    def __init__(self, config=None):
        if (config or {}).get("explode"):
            raise RuntimeError("exploded on init")
        self.value = 1

    def read(self) -> int:
        return self.value
"""


def test_an_init_config_that_breaks_the_environment_is_422(client: httpx.Client) -> None:
    created = client.post("/v1/environments", json={"env_id": "fragile", "class_name": "Fragile", "code": FRAGILE})
    assert created.status_code == 201, created.text
    body = problem(client.post("/v1/sessions", json={"env_id": "fragile", "init_config": {"explode": True}}), 422,
                   "invalid-environment")
    assert "exploded on init" in body["detail"]
    assert client.post("/v1/sessions", json={"env_id": "fragile"}).status_code == 201


def test_openapi_served(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    assert "/v1/sessions/{session_id}/calls" in spec["paths"]
    assert json.dumps(spec)


def test_lone_surrogates_are_refused_without_harm(client: httpx.Client) -> None:
    sid = new_session(client, env_id="probe")
    raw = b'{"name": "add_item", "arguments": {"item_id": "\\ud800", "name": "x"}}'
    response = client.post(f"/v1/sessions/{sid}/calls", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 200 and response.json()["error"]["type"] == "invalid_arguments"
    body = problem(client.post("/v1/sessions", content=b'{"env_id": "probe", "init_config": {"a": "\\udfff"}}',
                               headers={"content-type": "application/json"}), 422, "invalid-request")
    assert "init_config" in body["detail"]
    assert call(client, sid, "increment")["ok"]


def test_chunked_oversized_body_is_413(client: httpx.Client) -> None:
    sid = new_session(client, env_id="probe")

    def chunks() -> Any:
        yield b'{"name": "increment", "arguments": {"by": "'
        for _ in range(40):
            yield b"9" * (1 << 20)
        yield b'"}}'

    response = client.post(f"/v1/sessions/{sid}/calls", content=chunks(), headers={"content-type": "application/json"})
    problem(response, 413, "payload-too-large")
    assert client.get(f"/v1/sessions/{sid}").json()["steps"] == 0


def test_unparseable_bodies_are_422(client: httpx.Client) -> None:
    deep = b'{"name": "x", "arguments": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    sid = new_session(client, env_id="probe")
    response = client.post(f"/v1/sessions/{sid}/calls", content=deep, headers={"content-type": "application/json"})
    assert response.status_code == 422
    body = problem(client.post("/v1/scenarios", json={
        "env_id": "probe", "task": "t", "checklist": [{"item": "deep", "check": "x = " + "-" * 60000 + "1"}]}),
        422, "invalid-request")
    assert "checklist[0]" in body["detail"]


def test_a_full_sandbox_answers_503_and_applies_nothing() -> None:
    server = start_app(workers=1, extra_env={"ENVFOUNDRY_CALL_TIMEOUT": "4", "ENVFOUNDRY_SANDBOX_WAIT": "1"})
    try:
        with server.client() as http:
            busy = new_session(http, env_id="probe")
            other = new_session(http, env_id="probe")
            def spin() -> httpx.Response:
                with server.client() as own:
                    return own.post(f"/v1/sessions/{busy}/calls", json={"name": "spin"})

            with ThreadPoolExecutor(1) as pool:
                hang = pool.submit(spin)
                time.sleep(0.5)
                problem(http.post(f"/v1/sessions/{other}/calls", json={"name": "increment"}), 503, "unavailable")
                assert hang.result().json()["error"]["type"] == "timeout"
            assert http.get(f"/v1/sessions/{other}").json()["steps"] == 0
            assert call(http, other, "increment")["step"] == 1
    finally:
        server.stop()


def test_422s_name_the_field_as_a_client_wrote_it(client: httpx.Client) -> None:
    sid = new_session(client, env_id="probe")
    not_json = client.post(f"/v1/sessions/{sid}/calls", content=b'{"name": "increment", ',
                           headers={"content-type": "application/json"})
    assert problem(not_json, 422, "invalid-request")["errors"][0]["field"] == "body"
    keyed = client.post(f"/v1/sessions/{sid}/calls", json={"name": "increment"}, headers={"Idempotency-Key": "x" * 300})
    assert problem(keyed, 422, "invalid-request")["errors"][0]["field"] == "Idempotency-Key"
    paged = client.get(f"/v1/sessions/{sid}/trajectory", params={"limit": 0})
    assert problem(paged, 422, "invalid-request")["errors"][0]["field"] == "limit"
    typed = problem(client.post(f"/v1/sessions/{sid}/calls", json={"name": "increment", "arguments": 5}), 422,
                    "invalid-request")
    assert {e["field"] for e in typed["errors"]} <= {"arguments", "arguments.str"}
    assert all("[" not in e["field"] for e in typed["errors"])


def test_environment_detail_has_the_source_and_what_synthesis_recorded(client: httpx.Client) -> None:
    detail = client.get("/v1/environments/library_circulation").json()
    assert "class LibraryCirculationSystem" in detail["source"] and detail["provenance"] is None


def test_a_package_provenance_is_served(tmp_path: Any) -> None:
    import shutil

    from tests.conftest import BUNDLED

    package = tmp_path / "cat" / "lib"
    shutil.copytree(BUNDLED / "library_circulation", package)
    manifest = json.loads((package / "env.json").read_text())
    manifest["provenance"] = {"assessment": {"rounds": 30, "counts": {"pass": 29, "warning": 1}, "removed": ["x"]}}
    (package / "env.json").write_text(json.dumps(manifest))
    server = start_app(catalogs=(tmp_path / "cat",))
    try:
        with server.client() as http:
            detail = http.get("/v1/environments/library_circulation").json()
        assert detail["provenance"] == manifest["provenance"]
    finally:
        server.stop()


def test_a_session_made_with_an_idle_ttl_is_gone_after_it_and_a_busy_one_stays(client: httpx.Client) -> None:
    idle = new_session(client, env_id="probe", idle_ttl_seconds=1)
    busy = new_session(client, env_id="probe", idle_ttl_seconds=1)
    for _ in range(5):  # ~2 s of calls every ~0.4 s on one of them
        call(client, busy, "increment")
        time.sleep(0.4)
    problem(client.get(f"/v1/sessions/{idle}"), 404, "not-found")
    info = client.get(f"/v1/sessions/{busy}").json()
    assert info["steps"] == 5
    fork = client.post(f"/v1/sessions/{busy}/fork", json={}).json()["session_id"]
    time.sleep(1.5)
    problem(client.get(f"/v1/sessions/{fork}"), 404, "not-found")  # a fork keeps its parent's idle TTL


@pytest.mark.parametrize("seconds", [0, 0.5, 3600 * 24 * 365])
def test_an_idle_ttl_out_of_range_is_refused_naming_the_field(client: httpx.Client, seconds: float) -> None:
    body = problem(client.post("/v1/sessions", json={"env_id": "probe", "idle_ttl_seconds": seconds}), 422,
                   "invalid-request")
    assert [e["field"] for e in body["errors"]] == ["idle_ttl_seconds"]
