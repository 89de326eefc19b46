"""Group rollouts (n sessions in one request), trajectory pages, and idempotent requests."""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx
import pytest

from tests.conftest import Server
from tests.service.test_api import call, new_session, problem, state

pytestmark = pytest.mark.in_process


def created(client: httpx.Client, headers: dict[str, str] | None = None, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/sessions", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_a_group_of_sessions_shares_the_initial_state_and_diverges(client: httpx.Client) -> None:
    group = created(client, scenario_id="probe-001", n=4)
    ids = group["session_ids"]
    assert len(ids) == len(set(ids)) == 4 and group["session_id"] == ids[0]
    assert group["mode"] == "task" and group["task"].startswith("Add item A1")
    first = state(client, ids[0])
    assert all(state(client, sid) == first for sid in ids)
    call(client, ids[1], "increment", {"by": 5})
    assert state(client, ids[1])["state"]["counter"] == 5
    assert [state(client, sid)["state"]["counter"] for sid in (ids[0], ids[2], ids[3])] == [0, 0, 0]


def test_a_group_larger_than_max_group_is_refused_whole(client: httpx.Client) -> None:
    body = problem(client.post("/v1/sessions", json={"scenario_id": "probe-001", "n": 65}), 422, "invalid-request")
    assert body["limit"] == "max_group" and body["value"] == 64 and body["field"] == "n"
    problem(client.post("/v1/sessions", json={"scenario_id": "probe-001", "n": 0}), 422, "invalid-request")


def test_fork_makes_n_independent_copies(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="probe-001")
    call(client, sid, "increment", {"by": 2})
    response = client.post(f"/v1/sessions/{sid}/fork", json={"n": 3})
    assert response.status_code == 201, response.text
    forks = response.json()["session_ids"]
    assert len(set(forks)) == 3 and sid not in forks
    for fork in forks:
        info = client.get(f"/v1/sessions/{fork}").json()
        assert info["parent_id"] == sid and info["steps"] == 1 and info["mode"] == "task"
        assert state(client, fork)["state"]["counter"] == 2
    call(client, forks[0], "increment", {"by": 1})
    assert [state(client, f)["state"]["counter"] for f in forks] == [3, 2, 2]
    assert state(client, sid)["state"]["counter"] == 2
    # a fork without a body still makes one
    single = client.post(f"/v1/sessions/{sid}/fork")
    assert single.status_code == 201 and len(single.json()["session_ids"]) == 1


def test_trajectory_pages_and_kinds(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="probe-001")
    for by in range(1, 6):
        call(client, sid, "increment", {"by": by})
    whole = client.get(f"/v1/sessions/{sid}/trajectory").json()
    assert whole["total"] == 5 and whole["offset"] == 0 and [s["step"] for s in whole["steps"]] == [1, 2, 3, 4, 5]
    assert all(s["kind"] == "call" and s["observation"] for s in whole["steps"])
    page = client.get(f"/v1/sessions/{sid}/trajectory", params={"offset": 3, "limit": 10}).json()
    assert [s["arguments"]["by"] for s in page["steps"]] == [4, 5] and page["total"] == 5
    problem(client.get(f"/v1/sessions/{sid}/trajectory", params={"limit": 1001}), 422, "invalid-request")


def test_a_retried_call_with_its_key_is_applied_once(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="probe-001")
    key = {"Idempotency-Key": "call-" + secrets.token_hex(8)}
    body = {"name": "increment", "arguments": {"by": 3}}
    first = client.post(f"/v1/sessions/{sid}/calls", json=body, headers=key)
    again = client.post(f"/v1/sessions/{sid}/calls", json=body, headers=key)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert state(client, sid) == {"step": 1, "state": state(client, sid)["state"]}
    assert state(client, sid)["state"]["counter"] == 3
    # the same key with another body is refused and changes nothing
    other = client.post(f"/v1/sessions/{sid}/calls", json={"name": "increment", "arguments": {"by": 4}}, headers=key)
    assert problem(other, 422, "idempotency-key-reused")["field"] == "Idempotency-Key"
    assert state(client, sid)["step"] == 1
    # a failed tool call is a step too, and is replayed like any other
    bad = {"Idempotency-Key": "bad-" + secrets.token_hex(8)}
    failed = client.post(f"/v1/sessions/{sid}/calls", json={"name": "nope"}, headers=bad).json()
    assert failed["ok"] is False and failed["error"]["type"] == "unknown_tool"
    assert client.post(f"/v1/sessions/{sid}/calls", json={"name": "nope"}, headers=bad).json() == failed
    assert state(client, sid)["step"] == 2


def test_a_retried_create_and_fork_with_their_keys_make_nothing_new(client: httpx.Client) -> None:
    key = {"Idempotency-Key": "create-" + secrets.token_hex(8)}
    first = created(client, headers=key, scenario_id="probe-001", n=2)
    again = client.post("/v1/sessions", json={"scenario_id": "probe-001", "n": 2}, headers=key)
    assert again.status_code == 201 and again.json() == first and again.headers["Idempotent-Replayed"] == "true"
    reused = client.post("/v1/sessions", json={"scenario_id": "probe-001", "n": 3}, headers=key)
    problem(reused, 422, "idempotency-key-reused")
    fork_key = {"Idempotency-Key": "fork-" + secrets.token_hex(8)}
    forked = client.post(f"/v1/sessions/{first['session_id']}/fork", json={"n": 2}, headers=fork_key).json()
    replay = client.post(f"/v1/sessions/{first['session_id']}/fork", json={"n": 2}, headers=fork_key).json()
    assert replay == forked


def test_a_retried_create_with_a_large_init_config_is_the_same_byte_for_byte(client: httpx.Client) -> None:
    """A body of 64 KiB or more is fingerprinted by its bytes (dumping megabytes of config again
    for the key cost several parses of it): the same bytes replay, other bytes are refused."""
    key = {"Idempotency-Key": "large-" + secrets.token_hex(8), "content-type": "application/json"}
    config = {"notes": {f"n{i:05d}": "x" * 40 for i in range(2000)}}
    body = json.dumps({"env_id": "probe", "init_config": config}).encode()
    assert len(body) > 64 * 1024
    first = client.post("/v1/sessions", content=body, headers=key)
    assert first.status_code == 201, first.text
    again = client.post("/v1/sessions", content=body, headers=key)
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    config["notes"]["n00000"] = "y"
    other = json.dumps({"env_id": "probe", "init_config": config}).encode()
    problem(client.post("/v1/sessions", content=other, headers=key), 422, "idempotency-key-reused")
    assert state(client, first.json()["session_id"])["state"]["notes"]["n00000"] == "x" * 40


def test_a_malformed_idempotency_key_is_refused(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="probe-001")
    response = client.post(f"/v1/sessions/{sid}/calls", json={"name": "get_counter"},
                           headers={"Idempotency-Key": "x" * 300})
    body = problem(response, 422, "invalid-request")
    assert "Idempotency-Key" in body["detail"]
    assert state(client, sid)["step"] == 0



@pytest.mark.redis
def test_a_retry_on_another_replica_returns_the_first_answer(replicas: tuple[Server, Server]) -> None:
    first, second = replicas
    with first.client() as a, second.client() as b:
        sid = created(a, scenario_id="probe-001", n=2)["session_ids"][1]
        key = {"Idempotency-Key": secrets.token_hex(8)}
        body = {"name": "add_item", "arguments": {"item_id": "A1", "name": "Apple"}}
        answer = a.post(f"/v1/sessions/{sid}/calls", json=body, headers=key).json()
        retried = b.post(f"/v1/sessions/{sid}/calls", json=body, headers=key)
        assert retried.json() == answer and retried.headers["Idempotent-Replayed"] == "true"
        steps = b.get(f"/v1/sessions/{sid}/trajectory").json()
        assert steps["total"] == 1 and steps["steps"][0]["name"] == "add_item"


def test_a_tenant_lists_its_live_sessions(client: httpx.Client) -> None:
    before = client.get("/v1/sessions", params={"limit": 1000}).json()["total"]
    group = created(client, scenario_id="probe-001", n=3)["session_ids"]
    client.delete(f"/v1/sessions/{group[2]}")
    listed = client.get("/v1/sessions", params={"limit": 1000}).json()
    assert listed["total"] == before + 2
    mine = {s["session_id"]: s for s in listed["sessions"]}
    assert set(group[:2]) <= set(mine) and group[2] not in mine
    assert mine[group[0]]["scenario_id"] == "probe-001" and mine[group[0]]["steps"] == 0
    page = client.get("/v1/sessions", params={"offset": 0, "limit": 1}).json()
    assert len(page["sessions"]) == 1 and page["total"] == listed["total"]
