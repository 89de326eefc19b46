"""Episodes in turns (``service/engine/turns.py``): a scripted user turn at a time, a tool that arrives in the second
turn, checks at the end of every turn (reading the turn's calls and closing message), over REST, MCP, OpenEnv
and the Python client, on both stores; the turn kept in the store (a replica sees it) and by forks."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from envfoundry_client import Client, TurnsEnded
from mcp import Client as MCPClient
from mcp.shared.subscriptions import ToolsListChanged

from tests.conftest import ROOT, Server, drop_keys, start_server

TURNS = ROOT / "tests" / "fixtures" / "turns"
SCENARIO = "turns-001"


@pytest.fixture(scope="module", params=["memory", "redis"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    """One server per store; on Redis, the settings a second replica needs to share its sessions."""
    tmp = tmp_path_factory.mktemp("turns")
    settings: dict[str, str] = {}
    url = None
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        settings = {"ENVFOUNDRY_KEY_PREFIX": f"eftest-{secrets.token_hex(4)}"}
    server = start_server(tmp, redis_url=url, extra_env=settings, catalogs=(TURNS,))
    yield server, {**settings, **({"redis": url} if url else {})}
    server.stop()
    if url:
        drop_keys(url, settings["ENVFOUNDRY_KEY_PREFIX"])


@pytest.fixture
def http(store: tuple[Server, dict[str, str]]) -> Iterator[httpx.Client]:
    with store[0].client() as client:
        yield client


def names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def call(http: httpx.Client, sid: str, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    answer = http.post(f"/v1/sessions/{sid}/calls", json={"name": name, "arguments": arguments or {}})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def field(answer: httpx.Response) -> str:
    """The field a 422 names (the engine's problems name it at the top, the body's validation in errors)."""
    body = answer.json()
    return str(body.get("field") or body["errors"][0]["field"])


def end_turn(http: httpx.Client, sid: str, content: str | None = None) -> dict[str, Any]:
    answer = http.post(f"/v1/sessions/{sid}/turns", json={} if content is None else {"content": content})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_an_episode_in_turns_over_rest(http: httpx.Client) -> None:
    created = http.post("/v1/sessions", json={"scenario_id": SCENARIO}).json()
    sid = created["session_id"]
    assert (created["turn"], created["turns"]) == (0, 3)
    assert created["task"] == created["user_message"] == "Add a note titled 'plan' saying 'ship it'."
    assert names(created["tools"]) == ["add_note", "list_titles"]  # archive arrives in the second turn
    early = call(http, sid, "archive", {"title": "plan"})
    assert early["error"] == {"type": "unknown_tool",
                              "message": "unknown tool 'archive'; available tools: add_note, list_titles"}
    call(http, sid, "add_note", {"title": "plan", "text": "ship it"})

    second = end_turn(http, sid)
    assert second["ended_turn"] == 0 and second["turn"] == 1 and not second["done"]
    assert second["user_message"] == "You can archive notes now: archive 'plan'."
    assert names(second["new_tools"]) == ["archive"]
    assert names(http.get(f"/v1/sessions/{sid}/tools").json()["tools"]) == ["add_note", "list_titles", "archive"]
    assert call(http, sid, "archive", {"title": "plan"})["ok"] is True
    assert end_turn(http, sid)["turn"] == 2
    call(http, sid, "list_titles")
    last = end_turn(http, sid, "none are left")
    assert last == {"step": 7, "ended_turn": 2, "turn": None, "turns": 3, "done": True, "user_message": None,
                    "new_tools": []}
    again = http.post(f"/v1/sessions/{sid}/turns")
    assert again.status_code == 409 and again.json()["type"] == "urn:envfoundry:problem:turns-ended"
    assert http.get(f"/v1/sessions/{sid}").json()["done"] is True
    assert http.get(f"/v1/sessions/{sid}/turns").json()["done"] is True

    score = http.post(f"/v1/sessions/{sid}/score").json()
    assert (score["reward"], score["aggregation"], score["turns_passed"], score["partial_credit"]) == (
        1.0, "all_turns", 3, 1.0)
    assert [t["status"] for t in score["turns"]] == ["ended"] * 3
    kinds = [s["kind"] for s in http.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]]
    assert kinds == ["call", "call", "turn", "call", "turn", "call", "turn"]


def test_each_turn_is_scored_when_it_ends_and_partial_credit_counts_turns(http: httpx.Client) -> None:
    sid = http.post("/v1/sessions", json={"scenario_id": SCENARIO}).json()["session_id"]
    call(http, sid, "add_note", {"title": "plan", "text": "ship it"})
    # Scored mid-turn: the turn in progress is checked on the current state, later ones fail unreached.
    early = http.post(f"/v1/sessions/{sid}/score").json()
    assert [(t["status"], t["passed"]) for t in early["turns"]] == [
        ("in_progress", True), ("not_reached", False), ("not_reached", False)]
    end_turn(http, sid)
    end_turn(http, sid)  # the archive never done
    call(http, sid, "archive", {"title": "plan"})  # too late: turn 1's checks ran when it ended
    call(http, sid, "list_titles")
    end_turn(http, sid, "I give up")  # the closing message is what turn 2's second check reads
    score = http.post(f"/v1/sessions/{sid}/score").json()
    assert score["reward"] == 0.0 and score["turns_passed"] == 1 and score["partial_credit"] == pytest.approx(1 / 3)
    assert [c["passed"] for c in score["turns"][2]["checks"]] == [True, False]
    assert score["passed"] == 3 and score["total"] == 5


def test_a_retried_turn_end_is_answered_once(http: httpx.Client) -> None:
    sid = http.post("/v1/sessions", json={"scenario_id": SCENARIO}).json()["session_id"]
    first = http.post(f"/v1/sessions/{sid}/turns", json={}, headers={"Idempotency-Key": "end-1"})
    again = http.post(f"/v1/sessions/{sid}/turns", json={}, headers={"Idempotency-Key": "end-1"})
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    assert http.get(f"/v1/sessions/{sid}/turns").json()["turn"] == 1  # one turn ended, not two
    other = http.post(f"/v1/sessions/{sid}/turns", json={"content": "x"}, headers={"Idempotency-Key": "end-1"})
    assert other.status_code == 422 and other.json()["type"] == "urn:envfoundry:problem:idempotency-key-reused"


def test_forks_keep_the_turn_they_were_made_in(http: httpx.Client) -> None:
    sid = http.post("/v1/sessions", json={"scenario_id": SCENARIO}).json()["session_id"]
    call(http, sid, "add_note", {"title": "plan", "text": "ship it"})
    end_turn(http, sid)
    fork = http.post(f"/v1/sessions/{sid}/fork").json()
    assert fork["turn"] == 1 and "archive" in names(fork["tools"])
    assert call(http, fork["session_id"], "archive", {"title": "plan"})["ok"] is True
    back = http.post(f"/v1/sessions/{sid}/fork", json={"step": 1}).json()  # before the first turn ended
    assert back["turn"] == 0 and back["user_message"].startswith("Add a note")
    assert call(http, back["session_id"], "archive", {"title": "plan"})["error"]["type"] == "unknown_tool"
    assert end_turn(http, back["session_id"])["turn"] == 1


@pytest.mark.parametrize("store", ["redis"], indirect=True)  # (a memory store is one replica's)
def test_another_replica_continues_the_turn(store: tuple[Server, dict[str, str]], http: httpx.Client,
                                            tmp_path: Any) -> None:
    settings = dict(store[1])
    url = settings.pop("redis")
    sid = http.post("/v1/sessions", json={"scenario_id": SCENARIO}).json()["session_id"]
    call(http, sid, "add_note", {"title": "plan", "text": "ship it"})
    replica = start_server(tmp_path, redis_url=url, extra_env=settings, catalogs=(TURNS,))
    try:
        with replica.client() as other:
            assert other.get(f"/v1/sessions/{sid}/turns").json()["turn"] == 0
            assert call(other, sid, "archive", {"title": "plan"})["error"]["type"] == "unknown_tool"
            assert end_turn(other, sid)["turn"] == 1
            # The first replica counts the turn that ended on the other.
            assert call(http, sid, "archive", {"title": "plan"})["ok"] is True
            assert end_turn(http, sid)["turn"] == 2
            assert other.get(f"/v1/sessions/{sid}/turns").json()["turn"] == 2
    finally:
        replica.stop()


def test_bad_input_names_the_field(http: httpx.Client) -> None:
    turn = {"message": "hi", "tools": ["teleport"]}
    bad = http.post("/v1/scenarios", json={"env_id": "turn_notes", "init_config": {}, "turns": [{"message": "a"}, turn]})
    assert bad.status_code == 422 and field(bad) == "turns[1].tools[0]"
    bad = http.post("/v1/scenarios", json={"env_id": "turn_notes", "init_config": {}, "turns": [{"message": "a"}],
                                           "checklist": [{"item": "x", "check": "def check_func(s):\n    return True"}]})
    assert bad.status_code == 422 and field(bad) == "checklist"
    bad = http.post("/v1/scenarios", json={"env_id": "turn_notes", "init_config": {}})
    assert bad.status_code == 422 and field(bad) == "task"
    bad = http.post("/v1/sessions", json={"scenario_id": SCENARIO, "mode": "conversation"})
    assert bad.status_code == 422 and field(bad) == "mode"
    # A scenario added over the API, with its task derived from its first turn; and one without turns.
    added = http.post("/v1/scenarios", json={"env_id": "turn_notes", "init_config": {}, "turns": [
        {"message": "List the notes.", "checklist": [{"item": "listed", "check": (
            "def check_func(final_state):\n    return [c['name'] for c in turn_responses['calls']] == ['list_titles']")}]}]})
    assert added.status_code == 201 and added.json()["task"] == "List the notes."
    sid = http.post("/v1/sessions", json={"scenario_id": added.json()["scenario_id"]}).json()["session_id"]
    call(http, sid, "list_titles")
    assert end_turn(http, sid)["done"] is True
    assert http.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0
    plain = http.post("/v1/scenarios", json={"env_id": "turn_notes", "task": "t", "init_config": {}}).json()
    sid = http.post("/v1/sessions", json={"scenario_id": plain["scenario_id"]}).json()["session_id"]
    refused = http.post(f"/v1/sessions/{sid}/turns")
    assert refused.status_code == 409 and refused.json()["type"] == "urn:envfoundry:problem:not-turn-based"
    assert "aggregation" not in http.post(f"/v1/sessions/{sid}/score").json()


@pytest.mark.anyio
async def test_mcp_offers_a_turns_tools_and_ends_turns(store: tuple[Server, dict[str, str]], http: httpx.Client) -> None:
    server = store[0]
    sid = http.post("/v1/sessions", json={"scenario_id": SCENARIO}).json()["session_id"]
    async with MCPClient(f"{server.url}/v1/sessions/{sid}/mcp") as mcp:
        assert [t.name for t in (await mcp.list_tools()).tools] == ["add_note", "list_titles", "end_turn"]
        early = await mcp.call_tool("archive", {"title": "plan"})
        assert early.is_error and early.structured_content["error"]["type"] == "unknown_tool"
        await mcp.call_tool("add_note", {"title": "plan", "text": "ship it"})
        ended = await mcp.call_tool("end_turn", {})
        assert ended.content[0].text == "You can archive notes now: archive 'plan'."
        assert [t["function"]["name"] for t in ended.structured_content["new_tools"]] == ["archive"]
        assert "archive" in [t.name for t in (await mcp.list_tools()).tools]
    async with MCPClient(f"{server.url}/v1/mcp") as service:
        answer = await service.call_tool("end_turn", {"session_id": sid, "content": "done"})
        assert answer.structured_content["ended_turn"] == 1 and answer.structured_content["turn"] == 2


@pytest.mark.anyio
async def test_mcp_listen_streams_hear_that_a_turn_brought_tools(store: tuple[Server, dict[str, str]],
                                                                 http: httpx.Client) -> None:
    server = store[0]
    sid = http.post("/v1/sessions", json={"scenario_id": SCENARIO}).json()["session_id"]
    async with MCPClient(f"{server.url}/v1/sessions/{sid}/mcp", mode="auto") as mcp, \
            mcp.listen(tools_list_changed=True) as stream, httpx.AsyncClient(base_url=server.url) as rest:
        assert (await rest.post(f"/v1/sessions/{sid}/turns")).json()["turn"] == 1  # ended over REST
        with anyio.fail_after(30):
            assert isinstance(await stream.__anext__(), ToolsListChanged)
        assert "archive" in [t.name for t in (await mcp.list_tools()).tools]


@pytest.mark.anyio
@pytest.mark.parametrize("store", ["redis"], indirect=True)  # (a memory store is one replica's)
async def test_a_listen_stream_on_another_replica_hears_that_a_turn_brought_tools(
        store: tuple[Server, dict[str, str]], http: httpx.Client, tmp_path: Any) -> None:
    """The turn ends on the first replica; the MCP client streams from a second one sharing its Redis."""
    settings = dict(store[1])
    url = settings.pop("redis")
    sid = http.post("/v1/sessions", json={"scenario_id": SCENARIO}).json()["session_id"]
    replica = start_server(tmp_path, redis_url=url, extra_env=settings, catalogs=(TURNS,))
    try:
        async with MCPClient(f"{replica.url}/v1/sessions/{sid}/mcp", mode="auto") as mcp, \
                mcp.listen(tools_list_changed=True) as stream, \
                httpx.AsyncClient(base_url=store[0].url) as first:
            assert "archive" not in [t.name for t in (await mcp.list_tools()).tools]
            assert (await first.post(f"/v1/sessions/{sid}/turns")).json()["turn"] == 1
            with anyio.fail_after(30):
                assert isinstance(await stream.__anext__(), ToolsListChanged)
            assert "archive" in [t.name for t in (await mcp.list_tools()).tools]
    finally:
        replica.stop()


def test_openenv_episodes_end_turns(store: tuple[Server, dict[str, str]]) -> None:
    with httpx.Client(base_url=f"{store[0].url}/openenv/turn_notes", timeout=60) as env:
        opened = env.post("/reset", json={"scenario_id": SCENARIO}).json()["observation"]
        episode = opened["episode_id"]
        assert (opened["turn"], opened["turns"]) == (0, 3) and names(opened["tool_schemas"]) == ["add_note",
                                                                                                  "list_titles"]
        step = {"episode_id": episode}
        env.post("/step", json={**step, "action": {"type": "call_tool", "tool_name": "add_note",
                                                   "arguments": {"title": "plan", "text": "ship it"}}})
        ended = env.post("/step", json={**step, "action": {"type": "end_turn"}}).json()
        assert ended["observation"]["turn"] == 1 and ended["done"] is False and ended["reward"] == 0.0
        tools = env.post("/step", json={**step, "action": {"type": "list_tools"}}).json()["observation"]["tools"]
        assert "archive" in [t["name"] for t in tools]
        again = env.post("/reset", json={"episode_id": episode}).json()["observation"]
        assert again["turn"] == 1 and again["user_message"].startswith("You can archive")


def test_the_python_client_plays_turns(store: tuple[Server, dict[str, str]]) -> None:
    with Client(store[0].url) as ef:
        session = ef.create_session(SCENARIO)
        assert session.turn == 0 and session.turns == 3 and session.prompt.startswith("Add a note")
        ef.call(session.session_id, "add_note", {"title": "plan", "text": "ship it"})
        following = ef.end_turn(session.session_id)
        assert following.turn == 1 and [t["function"]["name"] for t in following.new_tools] == ["archive"]
        ef.call(session.session_id, "archive", {"title": "plan"})
        ef.end_turn(session.session_id)
        assert ef.turn(session.session_id).user_message.startswith("Which notes")
        ef.call(session.session_id, "list_titles")
        assert ef.end_turn(session.session_id, "none").done
        with pytest.raises(TurnsEnded):
            ef.end_turn(session.session_id)
        score = ef.score(session.session_id)
        assert score.reward == 1.0 and score.partial_credit == 1.0 and score.turns is not None
        assert [t.status for t in score.turns] == ["ended"] * 3
        assert [s.kind for s in ef.trajectory(session.session_id).steps][-1] == "turn"


def test_validate_plays_each_turn_of_the_reference_solution() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVFOUNDRY_")}
    done = subprocess.run([sys.executable, "-m", "service.cli", "catalog", "validate", str(TURNS)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env=env)
    assert done.returncode == 0 and done.stdout.strip().endswith("1 environments, 1 scenarios, 0 problems"), done.stdout
    record = json.loads((TURNS / "turn_notes" / "scenarios.jsonl").read_text())
    assert "task" not in record  # derived from the first turn
