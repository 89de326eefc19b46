"""Environments whose state is an object graph are served exactly: parent pointers, aliases and
cycles survive every call, fork and replica, and clients see them as ``$ref`` pointers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start_server
from tests.in_process import AppServer, start_app

GRAPHS = Path(__file__).resolve().parents[1] / "fixtures" / "graphs"


@pytest.fixture(scope="module")
def graph_server() -> Iterator[AppServer]:
    """The app in this process (process sandbox, memory store) serving the file-system fixture catalog."""
    server = start_app(catalogs=(GRAPHS,), workers=1)
    yield server
    server.stop()


@pytest.fixture
def api(graph_server: AppServer) -> Iterator[httpx.Client]:
    with graph_server.client() as http:
        yield http


def call(http: httpx.Client, sid: str, tool: str, **arguments: Any) -> dict[str, Any]:
    response = http.post(f"/v1/sessions/{sid}/calls", json={"name": tool, "arguments": arguments})
    assert response.status_code == 200, response.text
    step: dict[str, Any] = response.json()
    assert step["ok"], step
    return step


def state(http: httpx.Client, sid: str) -> Any:
    response = http.get(f"/v1/sessions/{sid}/state")
    assert response.status_code == 200, response.text
    return response.json()["state"]


def test_session_with_parent_pointers_is_created_and_viewed_with_refs(api: httpx.Client) -> None:
    created = api.post("/v1/sessions", json={"scenario_id": "fs-001"})
    assert created.status_code == 201, created.text
    shown = state(api, created.json()["session_id"])
    assert shown["current_dir"] == {"$ref": "/root"}
    assert shown["root"]["parent"] is None
    assert shown["root"]["children"]["docs"]["parent"] == {"$ref": "/root"}


def test_file_written_through_the_current_dir_alias_appears_under_root(api: httpx.Client) -> None:
    sid = api.post("/v1/sessions", json={"scenario_id": "fs-001"}).json()["session_id"]
    call(api, sid, "change_dir", name="docs")
    call(api, sid, "write_file", name="notes.txt", content="hello")
    assert call(api, sid, "pwd")["result"] == "/docs"
    shown = state(api, sid)
    assert shown["current_dir"] == {"$ref": "/root/children/docs"}
    assert shown["root"]["children"]["docs"]["files"] == {"notes.txt": "hello"}
    trajectory = api.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]
    assert trajectory[0]["diff"]["changed"] == [
        {"path": "/current_dir", "old": {"$ref": "/root"}, "new": {"$ref": "/root/children/docs"}},
    ]
    assert trajectory[0]["diff"]["added"] == trajectory[0]["diff"]["removed"] == []
    assert trajectory[1]["diff"] == {"added": [{"path": "/root/children/docs/files/notes.txt", "value": "hello"}],
                                     "removed": [], "changed": []}


def test_checks_walk_parent_pointers_of_final_and_initial_state(api: httpx.Client) -> None:
    sid = api.post("/v1/sessions", json={"scenario_id": "fs-001"}).json()["session_id"]
    assert api.post(f"/v1/sessions/{sid}/score").json()["passed"] == 1  # only the initial-state check
    call(api, sid, "change_dir", name="docs")
    call(api, sid, "write_file", name="notes.txt", content="hello")
    scored = api.post(f"/v1/sessions/{sid}/score").json()
    assert scored["reward"] == 1.0, scored


def test_alias_stays_shared_in_a_fork_on_another_replica_and_after_a_restart(tmp_path: Path, redis_url: str,
                                                                             key_prefix: str) -> None:
    env = {"ENVFOUNDRY_KEY_PREFIX": key_prefix}
    a, b = (start_server(tmp_path, redis_url=redis_url, extra_env=env, catalogs=(GRAPHS,), workers=1)
            for _ in range(2))
    servers = [a, b]
    try:
        with a.client() as api, b.client() as other:
            sid = api.post("/v1/sessions", json={"scenario_id": "fs-001"}).json()["session_id"]
            call(api, sid, "change_dir", name="docs")
            fork = api.post(f"/v1/sessions/{sid}/fork").json()["session_id"]
            call(other, fork, "write_file", name="fork.txt", content="f")
            assert state(api, fork)["root"]["children"]["docs"]["files"] == {"fork.txt": "f"}
            assert state(api, sid)["root"]["children"]["docs"]["files"] == {}
            call(other, sid, "make_dir", name="sub")
            call(other, sid, "change_dir", name="sub")
            call(other, sid, "write_file", name="deep.txt", content="d")
            shown = state(api, sid)
            assert shown["root"]["children"]["docs"]["children"]["sub"]["files"] == {"deep.txt": "d"}
            assert shown["current_dir"] == {"$ref": "/root/children/docs/children/sub"}
        a.stop()
        b.stop()
        c = start_server(tmp_path, redis_url=redis_url, extra_env=env, catalogs=(GRAPHS,), workers=1)
        servers.append(c)
        with c.client() as api:
            assert call(api, sid, "pwd")["result"] == "/docs/sub"
            assert call(api, sid, "change_dir", name="..")["result"]["data"] == "/docs"
            call(api, sid, "write_file", name="notes.txt", content="hello")
            assert api.post(f"/v1/sessions/{sid}/score").json()["checks"][1]["passed"] is True
    finally:
        for server in servers:
            server.stop()


def test_cycle_through_a_frozenset_survives_calls(api: httpx.Client) -> None:
    sid = api.post("/v1/sessions", json={"scenario_id": "fs-001"}).json()["session_id"]
    call(api, sid, "pin", label="top")
    call(api, sid, "change_dir", name="docs")
    call(api, sid, "pin", label="work")
    assert call(api, sid, "pinned")["result"] == [["top", "/"], ["work", "/docs"]]
    shown = state(api, sid)
    assert shown["root"]["pins"] == [{"__type__": "Pin", "label": "top", "target": {"$ref": "/root"}}]
    assert shown["root"]["children"]["docs"]["pins"][0]["target"] == {"$ref": "/root/children/docs"}


def test_state_nesting_deeply_is_served_and_viewed_to_the_view_depth(api: httpx.Client) -> None:
    """No depth limit on state (the codec writes deep parts as flat blocks): a chain of 500
    folders is stored and rebuilt; the view shows it down to its depth bound."""
    sid = api.post("/v1/sessions", json={"scenario_id": "fs-001"}).json()["session_id"]
    call(api, sid, "make_chain", depth=500)
    node = state(api, sid)["root"]
    levels = 0
    while "children" in node and f"d{levels}" in node["children"]:
        node = node["children"][f"d{levels}"]
        levels += 1
    assert node["children"] == {"$truncated": "depth"} and levels > 50
    call(api, sid, "change_dir", name="docs")  # the session goes on
    assert call(api, sid, "pwd")["result"] == "/docs"
