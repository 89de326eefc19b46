"""Two API processes on a real Redis Cluster (three masters, one replica each), through a master's kill -9."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Server, start_server
from tests.redis_cluster import Cluster
from tests.service.test_api import call, state

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"eftest-{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def replicas(redis_cluster: Cluster, prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """One process configured by a redis+cluster:// URL, the other by ENVFOUNDRY_REDIS_CLUSTER_NODES."""
    tmp = tmp_path_factory.mktemp("cluster-api")
    first = start_server(tmp, redis_url=redis_cluster.url, extra_env={"ENVFOUNDRY_KEY_PREFIX": prefix})
    second = start_server(tmp, extra_env={"ENVFOUNDRY_KEY_PREFIX": prefix,
                                           "ENVFOUNDRY_REDIS_CLUSTER_NODES": redis_cluster.nodes})
    yield first, second
    first.stop()
    second.stop()


def episode(a: httpx.Client, b: httpx.Client) -> tuple[str, int]:
    """A bundled scenario's reference solution, calls alternating between the processes; scores 1.0."""
    summary = a.get("/v1/environments/library_circulation/scenarios").json()["scenarios"][0]
    scenario = a.get(f"/v1/scenarios/{summary['scenario_id']}").json()
    sid = a.post("/v1/sessions", json={"scenario_id": scenario["scenario_id"]}).json()["session_id"]
    for i, step in enumerate(scenario["reference_solution"], start=1):
        result = call((a, b)[i % 2], sid, step["name"], step["arguments"])
        assert result["ok"] and result["step"] == i
    assert b.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0
    return sid, len(scenario["reference_solution"])


def test_two_processes_on_a_cluster_serve_episodes_groups_forks_and_retries_through_a_failover(
    redis_cluster: Cluster, replicas: tuple[Server, Server], prefix: str
) -> None:
    first, second = replicas
    with first.client() as a, second.client() as b:
        assert a.get("/readyz").status_code == b.get("/readyz").status_code == 200
        sid, steps = episode(a, b)

        # a group's sessions land on different slots and still all exist, each with the initial state
        group = a.post("/v1/sessions", json={"scenario_id": "probe-001", "n": 6}).json()["session_ids"]
        assert len(group) == 6
        assert len({state(b, g)["state"]["counter"] for g in group}) == 1
        call(b, group[0], "increment", {"by": 4})

        # forks of a session served by the other process
        forks = b.post(f"/v1/sessions/{group[0]}/fork", json={"n": 3}).json()["session_ids"]
        assert [state(a, f)["state"]["counter"] for f in forks] == [4, 4, 4]

        # the same Idempotency-Key on the other process returns the first answer and applies nothing new
        key = {"Idempotency-Key": secrets.token_hex(8)}
        body = {"name": "increment", "arguments": {"by": 2}}
        once = a.post(f"/v1/sessions/{forks[0]}/calls", json=body, headers=key)
        again = b.post(f"/v1/sessions/{forks[0]}/calls", json=body, headers=key)
        assert once.status_code == again.status_code == 200
        assert again.json() == once.json() and again.headers["Idempotent-Replayed"] == "true"
        created_key = {"Idempotency-Key": secrets.token_hex(8)}
        made = a.post("/v1/sessions", json={"scenario_id": "probe-001", "n": 2}, headers=created_key)
        remade = b.post("/v1/sessions", json={"scenario_id": "probe-001", "n": 2}, headers=created_key)
        assert remade.status_code == 201 and remade.json() == made.json()

        acknowledged: dict[str, dict[str, Any]] = {s: state(a, s) for s in [sid, *group, *forks]}
        assert acknowledged[forks[0]]["state"]["counter"] == 6 and acknowledged[sid]["step"] == steps

        # kill -9 the master holding the episode's session; its replica takes over
        victim = redis_cluster.master_of(f"{prefix}:session:{{{sid}}}:meta")
        heir = redis_cluster.replicas_of(victim)[0]
        redis_cluster.kill(victim)
        killed = time.monotonic()
        deadline = killed + 30
        while heir not in redis_cluster.masters():
            assert time.monotonic() < deadline, "no replica was promoted within 30 s"
            time.sleep(0.1)
        print(f"failover: replica promoted {time.monotonic() - killed:.1f} s after kill -9")

        # every acknowledged session is there, on both processes, exactly as acknowledged
        for client in (a, b):
            for session, seen in acknowledged.items():
                assert state(client, session) == seen, session
        assert a.get("/readyz").status_code == b.get("/readyz").status_code == 200
        # and new work goes on: a call on the failed-over slot, and a whole new episode
        assert call(b, forks[0], "increment", {"by": 1})["step"] == acknowledged[forks[0]]["step"] + 1
        episode(b, a)


def test_an_idle_session_expires_on_a_cluster(redis_cluster: Cluster, tmp_path: Path) -> None:
    prefix = f"eftest-{secrets.token_hex(4)}"
    server = start_server(tmp_path, extra_env={"ENVFOUNDRY_KEY_PREFIX": prefix, "ENVFOUNDRY_SESSION_TTL": "1.5",
                                               "ENVFOUNDRY_REDIS_CLUSTER_NODES": redis_cluster.nodes})
    try:
        with server.client() as http:
            sid = http.post("/v1/sessions", json={"scenario_id": "probe-001"}).json()["session_id"]
            assert http.get(f"/v1/sessions/{sid}").status_code == 200
            time.sleep(3.0)  # idle (every read would push the TTL back) for twice the TTL
            assert http.get(f"/v1/sessions/{sid}").status_code == 404
            assert http.post(f"/v1/sessions/{sid}/calls", json={"name": "increment"}).status_code == 404
    finally:
        server.stop()
