"""Sessions over MCP: the SDK's own client against a real server, compared with the REST path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from service.api.auth import new_key
from tests.conftest import BUNDLED, Server, start_server
from tests.service import proctree

pytestmark = pytest.mark.anyio
SCENARIO = "lib-001"
# "legacy" is the initialize handshake of 2025 servers; "auto" negotiates the per-request protocol.
MODES = ["legacy", "auto"]


def reference_solution(scenario_id: str = SCENARIO) -> list[dict[str, Any]]:
    for line in (BUNDLED / "library_circulation" / "scenarios.jsonl").read_text().splitlines():
        scenario = json.loads(line)
        if scenario["scenario_id"] == scenario_id:
            return list(scenario["reference_solution"])
    raise LookupError(scenario_id)


def new_session(http: httpx.Client, scenario_id: str = SCENARIO) -> str:
    response = http.post("/v1/sessions", json={"scenario_id": scenario_id})
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


def mcp_url(server: Server, session_id: str) -> str:
    return f"{server.url}/v1/sessions/{session_id}/mcp"


@pytest.mark.parametrize("mode", MODES)
async def test_tools_list_gives_the_environment_tools_with_their_schemas(server: Server, client: httpx.Client,
                                                                         mode: str) -> None:
    session_id = new_session(client)
    rest = client.get(f"/v1/sessions/{session_id}/tools").json()["tools"]
    async with Client(mcp_url(server, session_id), mode=mode) as mcp:
        listed = (await mcp.list_tools()).tools
    assert [t.name for t in listed] == [t["function"]["name"] for t in rest]
    for tool, schema in zip(listed, rest, strict=True):
        assert tool.input_schema == schema["function"]["parameters"]
        assert tool.description == schema["function"]["description"]


@pytest.mark.parametrize("mode", MODES)
async def test_solving_a_scenario_over_mcp_matches_the_rest_path(server: Server, client: httpx.Client,
                                                                 mode: str) -> None:
    """State, trajectory and score after tools/call equal those after POST .../calls, step for step."""
    over_mcp, over_rest = new_session(client), new_session(client)
    async with Client(mcp_url(server, over_mcp), mode=mode) as mcp:
        for step, call in enumerate(reference_solution(), start=1):
            result = await mcp.call_tool(call["name"], call["arguments"])
            rest = client.post(f"/v1/sessions/{over_rest}/calls", json=call).json()
            assert result.is_error is False
            assert result.structured_content == rest
            assert result.structured_content is not None and result.structured_content["step"] == step
            assert [c.text for c in result.content if c.type == "text"] == [rest["observation"]]

    def view(session_id: str, what: str) -> Any:
        response = client.request("POST" if what == "score" else "GET", f"/v1/sessions/{session_id}/{what}")
        assert response.status_code == 200, response.text
        return response.json()

    assert view(over_mcp, "state") == view(over_rest, "state")
    assert view(over_mcp, "trajectory") == view(over_rest, "trajectory")
    score = view(over_mcp, "score")
    assert score == view(over_rest, "score")
    assert score["reward"] == 1.0


async def test_tool_failures_are_error_results_and_the_connection_stays_usable(server: Server,
                                                                               client: httpx.Client) -> None:
    """Unknown tools and bad arguments answer isError with REST's error.type; state is untouched."""
    session_id = new_session(client)
    before = client.get(f"/v1/sessions/{session_id}/state").json()["state"]
    async with Client(mcp_url(server, session_id)) as mcp:
        unknown = await mcp.call_tool("fly_to_the_moon", {})
        invalid = await mcp.call_tool("return_book", {"loan_id": 42})
        assert client.get(f"/v1/sessions/{session_id}/state").json()["state"] == before
        good = await mcp.call_tool(**_first_call())
    for result, kind in ((unknown, "unknown_tool"), (invalid, "invalid_arguments")):
        assert result.is_error is True
        assert result.structured_content is not None
        assert result.structured_content["ok"] is False
        assert result.structured_content["error"]["type"] == kind
        assert result.content[0].type == "text" and result.content[0].text.startswith(f"Error ({kind})")
    assert good.is_error is False
    steps = client.get(f"/v1/sessions/{session_id}/trajectory").json()["steps"]
    assert [(s["name"], s["ok"]) for s in steps] == [("fly_to_the_moon", False), ("return_book", False),
                                                    ("return_book", True)]


def _first_call() -> dict[str, Any]:
    call = reference_solution()[0]
    return {"name": call["name"], "arguments": call["arguments"]}


@pytest.mark.parametrize("mode", MODES)
async def test_an_unknown_session_is_a_not_found_error(server: Server, mode: str) -> None:
    async with Client(mcp_url(server, "ses_does_not_exist"), mode=mode) as mcp:
        for _ in range(2):  # the connection survives the error
            with pytest.raises(MCPError) as listed:
                await mcp.list_tools()
            assert listed.value.error.data["type"] == "urn:envfoundry:problem:not-found"
            assert "ses_does_not_exist" in str(listed.value)
        with pytest.raises(MCPError) as called:
            await mcp.call_tool(**_first_call())
        assert called.value.error.code == -32002
        assert called.value.error.data["status"] == 404


async def test_a_deleted_session_stops_answering_over_mcp(server: Server, client: httpx.Client) -> None:
    session_id = new_session(client)
    async with Client(mcp_url(server, session_id)) as mcp:
        await mcp.list_tools()
        assert client.delete(f"/v1/sessions/{session_id}").status_code == 204
        with pytest.raises(MCPError) as called:
            await mcp.call_tool(**_first_call())
    assert called.value.error.data["type"] == "urn:envfoundry:problem:not-found"


def logged_since(server: Server, offset: int) -> list[dict[str, Any]]:
    text = server.log.read_bytes()[offset:].decode()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("mode", MODES)
async def test_a_call_on_a_deleted_session_is_logged_as_the_clients_error_not_the_servers(
        server: Server, client: httpx.Client, mode: str) -> None:
    session_id = new_session(client)
    offset = server.log.stat().st_size
    async with Client(mcp_url(server, session_id), mode=mode) as mcp:
        assert client.delete(f"/v1/sessions/{session_id}").status_code == 204
        with pytest.raises(MCPError) as called:
            await mcp.call_tool(**_first_call())
    assert called.value.error.code == -32002
    logged = logged_since(server, offset)
    assert logged and not [e for e in logged if e["level"] not in ("info", "debug")]
    assert not [e for e in logged if "error" in e]  # no traceback
    sdk = [e for e in logged if e["logger"].startswith("mcp.")]
    if mode == "auto":  # the SDK's header check ran the listing, which found the session gone
        assert len(sdk) == 1 and "urn:envfoundry:problem:not-found" in sdk[0]["message"]
        assert session_id in sdk[0]["message"]


async def test_the_mcp_endpoints_announce_themselves_once(server: Server) -> None:
    messages = [e["message"] for e in logged_since(server, 0)]
    assert "StreamableHTTP session manager started" not in messages
    assert messages.count("MCP endpoints ready: /v1/sessions/{session_id}/mcp and /v1/mcp") == 1


async def test_the_service_endpoint_runs_a_whole_episode(server: Server, client: httpx.Client) -> None:
    """An MCP-only agent lists scenarios, creates a session, calls its tools and scores it."""
    async with Client(f"{server.url}/v1/mcp") as mcp:
        assert {t.name for t in (await mcp.list_tools()).tools} == {"list_scenarios", "create_session",
                                                                    "call_tool", "send_message", "end_turn", "score_session"}
        listed = await mcp.call_tool("list_scenarios", {"env_id": "library_circulation"})
        assert listed.structured_content is not None
        assert SCENARIO in [s["scenario_id"] for s in listed.structured_content["scenarios"]]
        created = await mcp.call_tool("create_session", {"scenario_id": SCENARIO})
        assert created.structured_content is not None and created.is_error is False
        session_id = created.structured_content["session_id"]
        assert created.structured_content["task"]
        for call in reference_solution():
            result = await mcp.call_tool("call_tool", {"session_id": session_id, **call})
            assert result.is_error is False, result.structured_content
        scored = await mcp.call_tool("score_session", {"session_id": session_id})
    assert scored.structured_content is not None and scored.structured_content["reward"] == 1.0
    assert scored.structured_content == client.post(f"/v1/sessions/{session_id}/score").json()
    assert client.get(f"/v1/sessions/{session_id}").json()["steps"] == len(reference_solution())


async def test_the_service_endpoint_explains_bad_requests_as_tool_errors(server: Server) -> None:
    async with Client(f"{server.url}/v1/mcp") as mcp:
        missing = await mcp.call_tool("create_session", {"scenario_id": "no-such-scenario"})
        both = await mcp.call_tool("create_session", {"scenario_id": SCENARIO, "env_id": "library_circulation"})
        untyped = await mcp.call_tool("score_session", {"session_id": 7})
        gone = await mcp.call_tool("call_tool", {"session_id": "ses_gone", "name": "get_book", "arguments": {}})
    assert missing.is_error and missing.structured_content is not None
    assert missing.structured_content["problem"]["type"] == "urn:envfoundry:problem:not-found"
    assert both.is_error and both.structured_content is not None
    assert both.structured_content["problem"]["type"] == "urn:envfoundry:problem:invalid-request"
    assert untyped.is_error and untyped.structured_content is not None
    assert untyped.structured_content["error"]["type"] == "invalid_arguments"
    assert gone.is_error and gone.structured_content is not None
    assert gone.structured_content["problem"]["status"] == 404


async def test_an_idempotency_key_in_meta_applies_a_call_once(server: Server, client: httpx.Client) -> None:
    """A retried tools/call with the same key answers the first step; the same key with other arguments is refused."""
    session_id = new_session(client)
    call = _first_call()
    meta = {"envfoundry/idempotency-key": "retry-1"}
    async with Client(mcp_url(server, session_id)) as mcp:
        first = await mcp.call_tool(**call, meta=meta)
        again = await mcp.call_tool(**call, meta=meta)
        with pytest.raises(MCPError) as reused:
            await mcp.call_tool(call["name"], {"loan_id": "L0001"}, meta=meta)
    assert first.structured_content == again.structured_content
    assert "envfoundry/replayed" not in (first.meta or {})
    assert again.meta is not None and again.meta["envfoundry/replayed"] is True
    assert reused.value.error.data["type"] == "urn:envfoundry:problem:idempotency-key-reused"
    assert client.get(f"/v1/sessions/{session_id}").json()["steps"] == 1


async def test_send_message_explains_a_task_mode_session(server: Server, client: httpx.Client) -> None:
    session_id = new_session(client)
    async with Client(f"{server.url}/v1/mcp") as mcp:
        answer = await mcp.call_tool("send_message", {"session_id": session_id, "content": "hello"})
    assert answer.is_error and answer.structured_content is not None
    assert answer.structured_content["problem"]["type"] == "urn:envfoundry:problem:not-conversation"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str, str]]:
    """A server with API keys for two tenants."""
    key_a, line_a = new_key("tenant-a", ["run"])
    key_b, line_b = new_key("tenant-b", ["run"])
    srv = start_server(tmp_path_factory.mktemp("keyed-mcp"), extra_env={"ENVFOUNDRY_API_KEYS": f"{line_a};{line_b}"})
    yield srv, key_a, key_b
    srv.stop()


def keyed_client(url: str, http: httpx2.AsyncClient) -> Client:
    return Client(streamable_http_client(url, http_client=http))


async def test_mcp_takes_the_rest_api_key_and_sees_only_its_tenant(keyed_server: tuple[Server, str, str]) -> None:
    server, key_a, key_b = keyed_server
    with server.client() as http:
        created = http.post("/v1/sessions", json={"scenario_id": SCENARIO}, headers={"authorization": f"Bearer {key_a}"})
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]
        for path in (f"/v1/sessions/{session_id}/mcp", "/v1/mcp"):
            refused = http.post(path, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert refused.status_code == 401
            assert refused.headers["content-type"] == "application/problem+json"
            assert refused.json()["type"] == "urn:envfoundry:problem:unauthorized"
    async with httpx2.AsyncClient(headers={"authorization": f"Bearer {key_a}"}, timeout=60) as owner:
        async with keyed_client(mcp_url(server, session_id), owner) as mcp:
            assert len((await mcp.list_tools()).tools) == 10
            called = await mcp.call_tool(**_first_call())
            assert called.is_error is False
    async with httpx2.AsyncClient(headers={"authorization": f"Bearer {key_b}"}, timeout=60) as other:
        async with keyed_client(mcp_url(server, session_id), other) as mcp:
            with pytest.raises(MCPError) as hidden:
                await mcp.call_tool(**_first_call())
        async with keyed_client(f"{server.url}/v1/mcp", other) as mcp:
            scored = await mcp.call_tool("score_session", {"session_id": session_id})
    assert hidden.value.error.data["type"] == "urn:envfoundry:problem:not-found"
    assert scored.is_error and scored.structured_content is not None
    assert scored.structured_content["problem"]["status"] == 404


async def test_mcp_requests_of_one_session_are_served_by_any_replica(tmp_path: Path, redis_url: str,
                                                                    key_prefix: str) -> None:
    """Stateless MCP: two servers on one Redis take turns serving the same session's tools/call."""
    env = {"ENVFOUNDRY_KEY_PREFIX": key_prefix}
    replicas = [start_server(tmp_path, redis_url=redis_url, extra_env=env, workers=1) for _ in range(2)]
    try:
        with replicas[0].client() as http:
            session_id = new_session(http)
        for step, call in enumerate(reference_solution(), start=1):
            replica = replicas[step % 2]
            async with Client(mcp_url(replica, session_id)) as mcp:
                result = await mcp.call_tool(call["name"], call["arguments"])
            assert result.structured_content is not None and result.structured_content["step"] == step
        with replicas[1].client() as http:
            assert http.post(f"/v1/sessions/{session_id}/score").json()["reward"] == 1.0
    finally:
        for replica in replicas:
            replica.stop()


async def test_mcp_requests_are_counted_and_logged_like_rest(server: Server, client: httpx.Client) -> None:
    """The access log and /metrics label MCP requests by their route; MCP tool calls count as tool calls."""

    def counted(text: str, line_start: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))

    route = 'envfoundry_http_requests_total{method="POST",route="/v1/sessions/{session_id}/mcp",status="200"}'
    calls = 'envfoundry_tool_calls_total{outcome="unknown_tool"}'
    before = client.get("/metrics").text
    session_id = new_session(client)
    async with Client(mcp_url(server, session_id)) as mcp:
        await mcp.call_tool("no_such_tool", {})
    after = client.get("/metrics").text
    assert counted(after, route) > counted(before, route)
    assert counted(after, calls) == counted(before, calls) + 1

    def logged() -> bool:  # (access lines are written within 50 ms, in batches)
        entries = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
        return any(entry.get("route") == "/v1/sessions/{session_id}/mcp" and entry.get("session") == session_id
                   for entry in entries)

    proctree.wait_until(logged, 10, "the MCP request's access line")


async def test_list_scenarios_pages_as_the_rest_listing_does(server: Server, client: httpx.Client) -> None:
    everything = client.get("/v1/scenarios", params={"limit": 1000}).json()
    async with Client(f"{server.url}/v1/mcp") as mcp:
        seen: list[str] = []
        arguments: dict[str, Any] = {"limit": 3}
        while True:
            listed = (await mcp.call_tool("list_scenarios", arguments)).structured_content
            assert listed is not None and listed["total"] == everything["total"]
            seen += [s["scenario_id"] for s in listed["scenarios"]]
            if listed["next_cursor"] is None:
                break
            arguments = {"limit": 3, "cursor": listed["next_cursor"]}
        refused = await mcp.call_tool("list_scenarios", {"limit": 5000})
    assert seen == [s["scenario_id"] for s in everything["scenarios"]]
    assert refused.is_error is True and "limit" in json.dumps(refused.structured_content)
