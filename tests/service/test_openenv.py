"""OpenEnv's protocol at /openenv/{env_id}, driven by OpenEnv's released clients against a real server.

The clients (openenv 0.10.0 from PyPI) live in .venv-openenv (scripts/peer-venvs): their
dependencies conflict with the service's, and a trainer runs them in a process of its own anyway.
HTTP, error cases and keys are driven from here with httpx and a plain WebSocket client.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from service.api.auth import new_key
from tests.conftest import ROOT, Server, start_server
from tests.service import proctree

PEER = Path(__file__).with_name("openenv_peer.py")
ENV = "library_circulation"


@pytest.fixture(scope="session")
def openenv_python() -> Path:
    """The peer venv's interpreter (scripts/peer-venvs builds it once; scripts/test runs it first)."""
    subprocess.run([str(ROOT / "scripts" / "peer-venvs"), "openenv"], check=True, timeout=600)
    return ROOT / ".venv-openenv" / "bin" / "python"


@pytest.fixture(scope="module")
def solution(server: Server) -> list[dict[str, Any]]:
    """lib-001's reference solution, as the service publishes it."""
    steps: list[dict[str, Any]] = httpx.get(f"{server.url}/v1/scenarios/lib-001").json()["reference_solution"]
    return steps


def base(server: Server, env_id: str = ENV) -> str:
    return f"{server.url}/openenv/{env_id}"


@pytest.fixture(scope="module")
def played(server: Server, openenv_python: Path, solution: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """What OpenEnv's clients got playing lib-001 on this server, by part (ws, mcp, validate)."""
    done = subprocess.run([str(openenv_python), str(PEER), "play", base(server), json.dumps(solution)],
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    parts: dict[str, list[dict[str, Any]]] = {}
    for line in map(json.loads, done.stdout.splitlines()):
        if line["kind"] == "part":
            current = parts.setdefault(line["part"], [])
        else:
            current.append(line)
    return parts


def test_generic_client_over_the_websocket_solves_lib_001(server: Server, played: dict[str, Any]) -> None:
    reset, tools, *steps, state = played["ws"]
    episode = reset["observation"]["episode_id"]
    assert reset["observation"]["scenario_id"] == "lib-001" and "Priya" in reset["observation"]["task"]
    assert {t["function"]["name"] for t in reset["observation"]["tool_schemas"]} == set(tools["names"])
    assert [s["observation"]["step"] for s in steps] == [1, 2, 3]
    assert all(s["observation"]["ok"] and s["observation"]["error"] is None for s in steps)
    rewards = [s["reward"] for s in steps]
    assert rewards[-1] == 1.0 and rewards == sorted(rewards) and rewards[0] < 1.0
    assert state["state"]["episode_id"] == episode and state["state"]["step_count"] == 3
    assert state["state"]["state"]["loans"]["L0003"]["returned"] is True
    # close ended the episode; the calls were counted and logged as REST ones are
    assert httpx.get(f"{server.url}/v1/sessions/{episode}").status_code == 404
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'method="WS",route="/openenv/{env_id}/ws step",status="ok"' in metrics
    assert 'envfoundry_tool_calls_total{outcome="ok"}' in metrics


def test_mcp_tool_client_solves_lib_001_over_http_mcp_and_the_websocket(
        server: Server, played: dict[str, Any], solution: list[dict[str, Any]]) -> None:
    reset, tools, *calls, step, state = played["mcp"]
    episode = reset["observation"]["episode_id"]
    assert reset["observation"]["scenario_id"] == "lib-001"  # openenv/session/create without params: seed 0
    assert "return_book" in tools["names"]
    assert [c["record"]["step"] for c in calls] == [1, 2] and all(c["record"]["ok"] for c in calls)
    # the WebSocket bound to the episode /mcp opened sees the calls made over HTTP
    assert step["observation"]["tool_name"] == solution[-1]["name"] and step["reward"] == 1.0
    assert state["state"] == {"episode_id": episode, "step_count": 3}
    assert httpx.get(f"{server.url}/v1/sessions/{episode}").status_code == 404  # openenv/session/close


def test_mcp_tool_client_reads_the_reward_from_call_tool_as_from_openenvs_own_mcp_environments(
        played: dict[str, Any], solution: list[dict[str, Any]]) -> None:
    *calls, state = played["mcp_calls"]
    records = [c["record"] for c in calls]
    assert [r["step"] for r in records] == list(range(1, len(solution) + 1)) and all(r["ok"] for r in records)
    rewards = [r["reward"] for r in records]
    assert rewards[-1] == 1.0 and rewards == sorted(rewards) and rewards[0] < 1.0
    assert all(r["done"] is False for r in records)
    assert state["state"]["step_count"] == len(solution)


def test_mcp_tools_call_answers_reward_and_done_beside_the_result(server: Server,
                                                                 solution: list[dict[str, Any]]) -> None:
    with httpx.Client(base_url=base(server), timeout=60) as http:
        def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
            answer: dict[str, Any] = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method,
                                                             "params": params}).json()
            return dict(answer["result"])

        episode = rpc("openenv/session/create", {"scenario_id": "lib-001"})["session_id"]
        results = [rpc("tools/call", {"session_id": episode, "name": t["name"], "arguments": t["arguments"]})
                   for t in solution]
        assert [r["reward"] for r in results][-1] == 1.0 and results[0]["reward"] < 1.0
        assert all(r["done"] is False and r["data"]["reward"] == r["reward"] for r in results)
        rpc("openenv/session/close", {"session_id": episode})


def test_http_step_without_an_episode_steps_a_fresh_one_and_keeps_nothing(server: Server) -> None:
    """OpenEnv's server answers /step without an episode from a throwaway environment; so does this one."""
    with httpx.Client(base_url=base(server), timeout=60) as http:
        live = httpx.get(f"{server.url}/v1/sessions").json()["total"]
        listed = http.post("/step", json={"action": {"type": "list_tools"}})
        assert listed.status_code == 200, listed.text
        assert "return_book" in {t["name"] for t in listed.json()["observation"]["tools"]}
        # the fresh episode is seed 0's (lib-001): its first reference step, alone, passes one check of three
        called = http.post("/step", json={"action": {"type": "call_tool", "tool_name": "return_book",
                                                      "arguments": {"loan_id": "L0003"}}}).json()
        assert called["observation"]["ok"] is True and called["observation"]["step"] == 1
        assert 0 < called["reward"] < 1.0 and called["done"] is False
        again = http.post("/step", json={"action": {"type": "call_tool", "tool_name": "return_book",
                                                     "arguments": {"loan_id": "L0003"}}}).json()
        assert again["observation"]["step"] == 1 and again["reward"] == called["reward"]  # nothing carried over
        assert httpx.get(f"{server.url}/v1/sessions").json()["total"] == live  # each was ended
        bad = http.post("/step", json={"action": {"type": "nonsense"}})
        assert bad.status_code == 422 and httpx.get(f"{server.url}/v1/sessions").json()["total"] == live


def test_openenv_validate_passes_the_base_url(played: dict[str, Any]) -> None:
    (report,) = played["validate"]
    assert report == {"kind": "report", "passed": True, "failed": [], "mode": "simulation"}


def test_http_endpoints_describe_the_environment_and_play_an_episode(server: Server,
                                                                     solution: list[dict[str, Any]]) -> None:
    with httpx.Client(base_url=base(server), timeout=60) as http:
        assert http.get("/health").json() == {"status": "healthy"}
        meta = http.get("/metadata").json()
        assert meta["name"] == ENV and "lib-001" in {s["scenario_id"] for s in meta["scenarios"]}
        schema = http.get("/schema").json()
        named = {a["properties"]["tool_name"]["const"] for a in schema["action"]["oneOf"]
                 if "tool_name" in a["properties"]}
        assert named == {t["name"] for t in meta["tools"]}
        opened = http.post("/reset", json={"seed": 0}).json()
        episode = opened["observation"]["episode_id"]
        assert opened["observation"]["scenario_id"] == "lib-001" and opened["observation"]["seed"] == 0
        rewards = []
        for index, tool in enumerate(solution):
            action = {"type": "call_tool", "tool_name": tool["name"], "arguments": tool["arguments"]}
            body = {"action": action, "episode_id": episode, "request_id": f"call-{index}"}
            rewards.append(http.post("/step", json=body).json()["reward"])
        assert rewards[-1] == 1.0
        # a retried step (same request_id) answers the first attempt and applies nothing twice
        retry = http.post("/step", json=body).json()
        assert retry["observation"]["replayed"] is True and retry["observation"]["step"] == len(solution)
        state = http.get("/state", params={"episode_id": episode}).json()
        assert state["step_count"] == len(solution) and state["scenario_id"] == "lib-001"
        continued = http.post("/reset", json={"episode_id": episode}).json()
        assert continued["observation"]["step"] == len(solution) and continued["reward"] == 1.0
        assert http.post("/reset", json={"seed": 1}).json()["observation"]["scenario_id"] == "lib-002"


def ws_url(server: Server, env_id: str = ENV, query: str = "") -> str:
    return base(server, env_id).replace("http://", "ws://") + "/ws" + query


def exchange(ws: Any, message: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps(message))
    answer: dict[str, Any] = json.loads(ws.recv(timeout=60))
    return answer


def test_bad_messages_get_openenv_error_codes_and_change_nothing(server: Server) -> None:
    with connect(ws_url(server)) as ws:
        early = exchange(ws, {"type": "step", "data": {"type": "list_tools"}})
        assert early["type"] == "error" and early["data"]["code"] == "VALIDATION_ERROR"
        foreign = exchange(ws, {"type": "reset", "data": {"scenario_id": "store-001"}})
        assert foreign["data"]["code"] == "VALIDATION_ERROR" and foreign["data"]["problem"]["field"] == "scenario_id"
        unknown = exchange(ws, {"type": "reset", "data": {"scenario": "lib-001"}})
        assert unknown["data"]["problem"]["field"] == "scenario"
        assert exchange(ws, {"type": "reset", "data": {"seed": -1}})["data"]["problem"]["field"] == "seed"
        assert exchange(ws, {"type": "dance"})["data"]["code"] == "VALIDATION_ERROR"
        opened = exchange(ws, {"type": "reset", "data": {"scenario_id": "lib-001"}})
        episode = opened["data"]["observation"]["episode_id"]
        before = httpx.get(f"{server.url}/v1/sessions/{episode}/state").json()
        # a tool failure is an observation, not a protocol error, and the state stays as it was
        wrong = exchange(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "burn_books", "arguments": {}}})
        assert wrong["type"] == "observation" and wrong["data"]["observation"]["ok"] is False
        assert wrong["data"]["observation"]["error"]["error_type"] == "tool_not_found"
        bad = exchange(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "return_book",
                                                      "arguments": {"loan_id": 7}}})
        assert bad["data"]["observation"]["error"]["error_type"] == "invalid_args"
        after = httpx.get(f"{server.url}/v1/sessions/{episode}/state").json()
        assert after["state"] == before["state"]
        rpc = exchange(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}})
        assert rpc["type"] == "mcp" and len(rpc["data"]["result"]["tools"]) == 10
        # request_id makes a step idempotent: the retry answers the first attempt, applied once
        step = {"type": "step", "request_id": "r-1",
                "data": {"type": "call_tool", "tool_name": "return_book", "arguments": {"loan_id": "L0003"}}}
        assert exchange(ws, step)["data"]["observation"]["replayed"] is False
        again = exchange(ws, step)["data"]["observation"]
        assert again["replayed"] is True and again["step"] == 3
        # a message is bounded as a REST body is, before it is parsed
        flood = exchange(ws, {"type": "reset", "data": {"seed": 0, "pad": [1] * 200_001}})
        assert flood["data"]["problem"]["limit"] == "max_body_values"
        # NaN and Infinity are not JSON, here as in REST bodies: refused naming the field, nothing applied
        ws.send('{"type": "step", "data": {"type": "call_tool", "tool_name": "return_book", '
                '"arguments": {"loan_id": NaN}}}')
        nan = json.loads(ws.recv(timeout=60))
        assert nan["data"]["code"] == "VALIDATION_ERROR", nan
        assert nan["data"]["problem"]["field"] == "data.arguments.loan_id", nan
        assert httpx.get(f"{server.url}/v1/sessions/{episode}").json()["steps"] == 3
    # the access log has a line per message (written within 50 ms, in batches)
    proctree.wait_until(lambda: '"method": "WS"' in server.log.read_text(), 10, "a WebSocket message's access line")
    with connect(ws_url(server, "no_such_env")) as ws:
        refused = json.loads(ws.recv(timeout=30))
        assert refused["data"]["code"] == "SESSION_ERROR" and refused["data"]["problem"]["status"] == 404
    with httpx.Client(base_url=base(server), timeout=30) as http:
        missing = http.post("/step", json={"action": {"type": "list_tools"}, "episode_id": 5})
        assert missing.status_code == 422 and missing.json()["field"] == "episode_id"
        assert missing.headers["content-type"].startswith("application/problem+json")
        assert http.get("/state", params={"episode_id": "ses_nope"}).status_code == 404
        rpc = http.post("/mcp", content=b"{not json").json()
        assert rpc["error"]["code"] == -32700
        rpc = http.post("/mcp", content=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"x": -Infinity}}',
                        headers={"content-type": "text/plain"}).json()
        assert rpc["error"]["code"] == -32700 and "params.x" in rpc["error"]["message"], rpc


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str, str]]:
    """A server with two tenants' keys and room for one live session each."""
    key_a, line_a = new_key("tenant-a", ["run"])
    key_b, line_b = new_key("tenant-b", ["run"])
    tmp = tmp_path_factory.mktemp("keyed")
    (tmp / "keys.txt").write_text(f"{line_a}\n{line_b}\n")
    server = start_server(tmp, extra_env={"ENVFOUNDRY_API_KEYS_FILE": str(tmp / "keys.txt"),
                                          "ENVFOUNDRY_MAX_SESSIONS": "1"})
    yield server, key_a, key_b
    server.stop()


def test_keys_tenants_and_quotas_hold_as_on_rest(keyed: tuple[Server, str, str]) -> None:
    server, key_a, key_b = keyed
    with pytest.raises(InvalidStatus) as refused:  # refused at the upgrade (tests/service/test_websocket_bounds.py)
        connect(ws_url(server))
    assert refused.value.response.status_code == 401
    assert httpx.post(f"{base(server)}/reset", json={}).status_code == 401
    with connect(ws_url(server), additional_headers={"Authorization": f"Bearer {key_a}"}) as ws:
        episode = exchange(ws, {"type": "reset", "data": {}})["data"]["observation"]["episode_id"]
        full = httpx.post(f"{base(server)}/reset", json={}, headers={"Authorization": f"Bearer {key_a}"})
        assert full.status_code == 429 and full.json()["quota"] == "max_sessions"
        # another reset on this connection ends its episode first, so the quota of one allows it
        again = exchange(ws, {"type": "reset", "data": {"seed": 1}})
        assert again["data"]["observation"]["scenario_id"] == "lib-002"
        assert exchange(ws, {"type": "reset", "data": {"episode_id": episode}})["data"]["problem"]["status"] == 404
        second = again["data"]["observation"]["episode_id"]
        with connect(ws_url(server), additional_headers={"Authorization": f"Bearer {key_b}"}) as other:
            stolen = exchange(other, {"type": "reset", "data": {"episode_id": second}})
            assert stolen["data"]["problem"]["status"] == 404  # another tenant's episode is not found
        with connect(ws_url(server), additional_headers={"Authorization": f"Bearer {key_a}"}) as extra:
            capped = exchange(extra, {"type": "reset", "data": {}})
            assert capped["data"]["code"] == "CAPACITY_REACHED"


def test_a_killed_replica_mid_episode_is_continued_on_another(replicas: tuple[Server, Server],
                                                              openenv_python: Path) -> None:
    first, second = replicas
    steps = httpx.get(f"{first.url}/v1/scenarios/lib-001").json()["reference_solution"]
    process = subprocess.Popen([str(openenv_python), str(PEER), "reconnect", base(first), json.dumps(steps)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdin is not None
        started = json.loads(process.stdout.readline())
        assert started["observation"]["step"] == 1
        first.process.kill()  # SIGKILL: nothing of the API process gets to clean up
        first.process.wait(15)
        process.stdin.write(base(second) + "\n")
        process.stdin.flush()
        out, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err[-3000:]
    dead, resumed, *rest = [json.loads(line) for line in out.splitlines()]
    assert dead["failed"] is True
    assert resumed["observation"]["episode_id"] == started["episode_id"] and resumed["observation"]["step"] == 1
    assert [s["observation"]["step"] for s in rest] == [2, 3] and rest[-1]["reward"] == 1.0


DICE = '''
import random


class Dice:
    def __init__(self):
        self.rolled = []

    def roll(self) -> int:
        """Roll a die."""
        value = random.randint(1, 10**9)
        self.rolled.append(value)
        return value
'''


def test_a_reset_seed_makes_the_episode_reproducible_as_gymnasium_reset_does(server: Server) -> None:
    env_id = f"dice_{secrets.token_hex(4)}"
    added = httpx.post(f"{server.url}/v1/environments", json={"env_id": env_id, "class_name": "Dice", "code": DICE})
    assert added.status_code == 201, added.text

    def rolls(reset: dict[str, Any]) -> list[int]:
        with httpx.Client(base_url=base(server, env_id), timeout=30) as http:
            episode = http.post("/reset", json=reset).json()["observation"]["episode_id"]
            action = {"type": "call_tool", "tool_name": "roll", "arguments": {}}
            return [http.post("/step", json={"action": action, "episode_id": episode}).json()["observation"]["result"]
                    for _ in range(3)]

    assert rolls({"seed": 7}) == rolls({"seed": 7})
    assert rolls({"seed": 7}) != rolls({"seed": 8})
    assert rolls({}) != rolls({})  # without a seed, each episode draws its own
    with connect(ws_url(server, env_id)) as ws:  # a fresh episode of another seed is not kept for it
        first = exchange(ws, {"type": "reset", "data": {"seed": 7}})["data"]["observation"]["episode_id"]
        second = exchange(ws, {"type": "reset", "data": {"seed": 8}})["data"]["observation"]["episode_id"]
        assert first != second
    too_big = httpx.post(f"{base(server, env_id)}/reset", json={"seed": 2**63})
    assert too_big.status_code == 422 and too_big.json()["field"] == "seed"


def test_a_reset_with_an_idle_ttl_opens_an_episode_reaped_after_it(server: Server) -> None:
    with httpx.Client(base_url=base(server), timeout=60) as http:
        opened = http.post("/reset", json={"scenario_id": "lib-001", "idle_ttl_seconds": 1}).json()
        episode = opened["observation"]["episode_id"]
        assert httpx.get(f"{server.url}/v1/sessions/{episode}").status_code == 200
        time.sleep(1.5)  # what a killed trainer leaves: no step, no close
        assert httpx.get(f"{server.url}/v1/sessions/{episode}").status_code == 404
        for bad in (0, "soon", 10**9):
            refused = http.post("/reset", json={"scenario_id": "lib-001", "idle_ttl_seconds": bad})
            assert refused.status_code == 422 and "idle_ttl_seconds" in refused.text, refused.text
