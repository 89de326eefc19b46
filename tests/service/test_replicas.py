"""Sessions outlive the process that created them: any replica sharing Redis serves any session."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.conftest import Server, start_server


def test_any_replica_serves_any_session_and_a_crash_loses_nothing(tmp_path: Path, redis_url: str,
                                                                  key_prefix: str) -> None:
    env = {"ENVFOUNDRY_KEY_PREFIX": key_prefix}
    a = start_server(tmp_path, redis_url=redis_url, extra_env=env)
    b = start_server(tmp_path, redis_url=redis_url, extra_env=env)
    servers: list[Server] = [a, b]
    try:
        with a.client() as on_a, b.client() as on_b:
            sid = on_a.post("/v1/sessions", json={"scenario_id": "probe-001"}).json()["session_id"]
            assert on_b.post(f"/v1/sessions/{sid}/calls",
                             json={"name": "add_item", "arguments": {"item_id": "A1", "name": "Apple", "qty": 2}}
                             ).json()["ok"]
            a.process.send_signal(signal.SIGKILL)
            a.process.wait()
            step = on_b.post(f"/v1/sessions/{sid}/calls", json={"name": "increment", "arguments": {"by": 3}}).json()
            assert step["ok"] and step["step"] == 2
        # a replica started after the crash picks the session up where it was
        c = start_server(tmp_path, redis_url=redis_url, extra_env=env)
        servers.append(c)
        with c.client() as on_c:
            assert on_c.get(f"/v1/sessions/{sid}").json()["steps"] == 2
            scored = on_c.post(f"/v1/sessions/{sid}/score")
            assert scored.status_code == 200 and scored.json()["reward"] == 1.0, scored.text
            fork = on_c.post(f"/v1/sessions/{sid}/fork").json()["session_id"]
        with b.client() as on_b:
            assert len(on_b.get(f"/v1/sessions/{fork}/trajectory").json()["steps"]) == 2
    finally:
        for server in servers:
            server.stop()


def test_environments_created_on_one_replica_serve_on_another(tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    env = {"ENVFOUNDRY_KEY_PREFIX": key_prefix}
    a = start_server(tmp_path, redis_url=redis_url, extra_env=env)
    b = start_server(tmp_path, redis_url=redis_url, extra_env=env)
    code = "class Tally:\n    def __init__(self):\n        self.n = 0\n\n    def bump(self) -> int:\n" \
           "        self.n += 1\n        return self.n\n"
    try:
        with a.client() as on_a, b.client() as on_b:
            assert on_a.post("/v1/environments", json={"env_id": "tally", "class_name": "Tally",
                                                       "code": code}).status_code == 201
            assert "tally" in {e["env_id"] for e in on_b.get("/v1/environments").json()["environments"]}
            sid = on_b.post("/v1/sessions", json={"env_id": "tally"}).json()["session_id"]
            assert on_a.post(f"/v1/sessions/{sid}/calls", json={"name": "bump"}).json()["result"] == 1
            # A scenario added on one replica is listed, filtered, by the other; and gone there once deleted.
            assert on_a.post("/v1/scenarios", json={"scenario_id": "tally-1", "env_id": "tally", "task": "bump",
                                                    "split": "test", "tags": ["tally"]}).status_code == 201
            listed = on_b.get("/v1/scenarios", params={"split": "test", "tag": "tally"}).json()
            assert [s["scenario_id"] for s in listed["scenarios"]] == ["tally-1"] and listed["total"] == 1
            assert on_b.delete("/v1/scenarios/tally-1").status_code == 204
            assert on_a.get("/v1/scenarios", params={"tag": "tally"}).json()["total"] == 0
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_idle_sessions_expire_and_use_refreshes_them(tmp_path: Path, store: str, request: pytest.FixtureRequest
                                                     ) -> None:
    extra = {"ENVFOUNDRY_SESSION_TTL": "2"}
    url = None
    if store == "redis":
        url = request.getfixturevalue("redis_url")
        extra["ENVFOUNDRY_KEY_PREFIX"] = request.getfixturevalue("key_prefix")
    server = start_server(tmp_path, redis_url=url, extra_env=extra, workers=1)
    try:
        with server.client() as http:
            kept = http.post("/v1/sessions", json={"env_id": "probe"}).json()["session_id"]
            dropped = http.post("/v1/sessions", json={"env_id": "probe"}).json()["session_id"]
            for _ in range(3):
                time.sleep(1.0)
                assert http.get(f"/v1/sessions/{kept}").status_code == 200
            assert http.get(f"/v1/sessions/{dropped}").status_code == 404
            assert http.post(f"/v1/sessions/{dropped}/calls", json={"name": "increment"}).status_code == 404
    finally:
        server.stop()
