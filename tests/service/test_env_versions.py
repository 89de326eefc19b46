"""Versions by content: other code under an id is its new version, never a 409 or a silent swap.

A session keeps the environment and scenario versions it started on, through new versions added
over the API and, on Redis, through a restart that serves a changed catalog folder under the same
ids; ``id@<digest prefix>`` and ``id@<label>`` name one version for ever.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import BUNDLED, Server, drop_keys, start_server
from tests.service.test_api import call, new_session, problem
from tests.service.test_cli import run

pytestmark = pytest.mark.in_process  # (the restart is a real one: a new process, whose log is read)

V1 = '''
class Counter:
    def __init__(self, config=None):
        self.count = 0

    def bump(self) -> int:
        """Add one."""
        self.count += 1
        return self.count
'''
# v2: bump adds two, and a tool is added
V2 = V1.replace("self.count += 1", "self.count += 2").replace("Add one.", "Add two.") + '''
    def reset(self) -> int:
        """Back to zero."""
        self.count = 0
        return self.count
'''


def _added(client: httpx.Client, env_id: str, code: str, label: str | None = None) -> dict[str, Any]:
    body = {"env_id": env_id, "class_name": "Counter", "code": code, **({"label": label} if label else {})}
    added = client.post("/v1/environments", json=body)
    assert added.status_code == 201, added.text
    return dict(added.json())


def test_new_code_is_a_new_version_and_sessions_keep_theirs(client: httpx.Client) -> None:
    env_id = f"counter-{secrets.token_hex(4)}"
    one = _added(client, env_id, V1, "first")
    created = client.post("/v1/sessions", json={"env_id": env_id}).json()
    assert created["env_version"] == one["version"] and created["scenario_version"] is None
    old = created["session_id"]
    assert call(client, old, "bump")["result"] == 1
    two = _added(client, env_id, V2, "second")
    assert one["version"] != two["version"] and two["label"] == "second"
    assert client.get(f"/v1/environments/{env_id}").json()["version"] == two["version"]
    # the session made on the first version goes on with it; a new one gets the latest
    assert call(client, old, "bump")["result"] == 2
    assert client.get(f"/v1/sessions/{old}").json()["env_version"] == one["version"]
    forked = client.post(f"/v1/sessions/{old}/fork").json()  # a fork runs what its parent runs
    assert forked["env_version"] == one["version"] and call(client, forked["session_id"], "bump")["result"] == 3
    assert call(client, new_session(client, env_id=env_id), "bump")["result"] == 2
    # a version by label or digest prefix, for a session or a read
    for named in ("first", one["version"][:8], one["version"]):
        pinned = new_session(client, env_id=f"{env_id}@{named}")
        assert call(client, pinned, "bump")["result"] == 1
        assert client.get(f"/v1/environments/{env_id}@{named}").json()["version"] == one["version"]
    # OpenEnv's base URL may name a version too
    episode = client.post(f"/openenv/{env_id}@first/reset", json={}).json()["observation"]["episode_id"]
    stepped = client.post(f"/openenv/{env_id}@first/step", json={
        "action": {"type": "call_tool", "tool_name": "bump", "arguments": {}}, "episode_id": episode}).json()
    assert stepped["observation"]["result"] == 1
    listed = client.get(f"/v1/environments/{env_id}/versions").json()["versions"]
    assert [(v["version"], v["label"], v["latest"]) for v in listed] == [
        (one["version"], "first", False), (two["version"], "second", True)]
    assert listed[1]["changes"] == {"added": ["reset"], "removed": [], "changed": ["bump"]}
    assert listed[0]["changes"] == {"added": ["bump"], "removed": [], "changed": []}
    # the first version's code again: that version is the latest again (no new one)
    assert _added(client, env_id, V1)["version"] == one["version"]
    assert client.get(f"/v1/environments/{env_id}").json()["label"] == "first"
    assert len(client.get(f"/v1/environments/{env_id}/versions").json()["versions"]) == 2


def test_bad_version_references_name_what_is_wrong(client: httpx.Client) -> None:
    env_id = f"counter-{secrets.token_hex(4)}"
    _added(client, env_id, V1, "first")
    problem(client.get(f"/v1/environments/{env_id}@nosuch"), 404, "not-found")
    problem(client.get(f"/v1/environments/{env_id}@00000000"), 404, "not-found")
    assert problem(client.get(f"/v1/environments/{env_id}@abc"), 422, "invalid-request")["field"] == "version"
    taken = client.post("/v1/environments", json={"env_id": env_id, "class_name": "Counter", "code": V2,
                                                  "label": "first"})
    assert problem(taken, 409, "conflict")["field"] == "label"
    hex_label = client.post("/v1/environments", json={"env_id": env_id, "class_name": "Counter", "code": V2,
                                                      "label": "cafe01"})
    assert problem(hex_label, 422, "invalid-request")["field"] == "label"
    assert len(client.get(f"/v1/environments/{env_id}/versions").json()["versions"]) == 1  # nothing added
    problem(client.post("/v1/environments", json={"env_id": "library_circulation", "class_name": "Counter",
                                                  "code": V1}), 409, "conflict")  # a loaded catalog's


def test_a_session_is_scored_by_the_checks_of_the_scenario_version_it_started_on(client: httpx.Client) -> None:
    env_id = f"counter-{secrets.token_hex(4)}"
    _added(client, env_id, V1)
    scenario_id = f"count-{secrets.token_hex(4)}"

    def scenario(target: int) -> dict[str, Any]:
        check = f"def check_func(final_state):\n    return final_state['count'] == {target}"
        added = client.post("/v1/scenarios", json={"scenario_id": scenario_id, "env_id": env_id, "task": "Bump.",
                                                   "init_config": {"count": 0},
                                                   "checklist": [{"item": f"count is {target}", "check": check}]})
        assert added.status_code == 201, added.text
        return dict(added.json())

    first = scenario(1)
    old = new_session(client, scenario_id=scenario_id)
    call(client, old, "bump")
    second = scenario(2)
    assert first["version"] != second["version"]
    assert client.get(f"/v1/scenarios/{scenario_id}").json()["version"] == second["version"]
    scored = client.post(f"/v1/sessions/{old}/score").json()
    assert scored["reward"] == 1.0 and scored["scenario_version"] == first["version"]
    new = new_session(client, scenario_id=scenario_id)
    call(client, new, "bump")
    assert client.post(f"/v1/sessions/{new}/score").json()["reward"] == 0.0
    pinned = new_session(client, scenario_id=f"{scenario_id}@{first['version'][:10]}")
    call(client, pinned, "bump")
    assert client.post(f"/v1/sessions/{pinned}/score").json()["reward"] == 1.0
    # deleting the id removes every version: its sessions are gone with them
    assert client.delete(f"/v1/environments/{env_id}").status_code == 204
    problem(client.get(f"/v1/environments/{env_id}@{first['version'][:8]}"), 404, "not-found")
    problem(client.post(f"/v1/sessions/{old}/calls", json={"name": "bump", "arguments": {}}), 404, "not-found")


def test_a_restart_serving_changed_files_keeps_sessions_on_the_code_they_started_with(
        redis_url: str, tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    shutil.copytree(BUNDLED / "library_circulation", catalog / "library_circulation")
    prefix = f"eftest-{secrets.token_hex(4)}"
    env = {"ENVFOUNDRY_KEY_PREFIX": prefix}

    def serve() -> Server:
        return start_server(tmp_path, redis_url=redis_url, extra_env=env, catalogs=(catalog,))

    locked = run("catalog", "lock", str(catalog))
    assert locked.returncode == 0, locked.stderr
    server = serve()
    try:
        with server.client() as http:
            before = http.get("/v1/environments/library_circulation").json()["version"]
            first = http.get("/v1/catalog/manifest").json()
            assert first["drift"] == [] and first["environments"] == {"library_circulation": before}
            old = new_session(http, scenario_id="lib-001")
        server.stop()
        code = catalog / "library_circulation" / "env.py"
        code.write_text(code.read_text().replace("Look up a library member by id.", "Find a member.", 1))
        server = serve()
        with server.client() as http:
            after = http.get("/v1/environments/library_circulation").json()["version"]
            assert after != before
            assert http.get(f"/v1/sessions/{old}").json()["env_version"] == before
            assert "Look up a library member by id." in _described(http, old, "get_member")
            assert call(http, old, "get_member", {"member_id": "M002"})["ok"] is True
            assert http.get(f"/v1/environments/library_circulation@{before[:8]}").json()["version"] == before
            new = new_session(http, scenario_id="lib-001")
            assert http.get(f"/v1/sessions/{new}").json()["env_version"] == after
            assert "Find a member." in _described(http, new, "get_member")
            now = http.get("/v1/catalog/manifest").json()
            assert now["digest"] != first["digest"]
            assert now["drift"] == [f"{catalog}: environment 'library_circulation' is locked at {before[:12]} but "
                                    f"serves {after[:12]}"]
        assert f"catalog drift: {catalog}: environment 'library_circulation'" in server.log.read_text()
    finally:
        server.stop()
        drop_keys(redis_url, prefix)


def _described(http: httpx.Client, session: str, tool: str) -> str:
    listed = http.get(f"/v1/sessions/{session}/tools").json()["tools"]
    return str(next(t["function"]["description"] for t in listed if t["function"]["name"] == tool))


def test_the_bundled_catalog_is_served_as_its_lock_file_says() -> None:
    """A change to the bundled catalog comes with `envfoundry catalog lock catalog`, or this fails."""
    from service.catalog.collection import Catalog
    from service.catalog.manifest import LOCK_FILE, drift

    assert (BUNDLED / LOCK_FILE).is_file()
    catalog = Catalog()
    catalog.load_dir(BUNDLED)
    assert drift(BUNDLED, catalog) == []
