"""What is particular to the docker backend: container lifecycle across service crashes."""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox.backends.container import INSTANCE_LABEL, SERVICE_LABEL, DockerBackend
from sandbox.pool.requests import WorkerPool
from sandbox.wire.limits import Limits
from tests.conftest import SANDBOX_IMAGE, containers_of, start_server


def _wait_for(predicate: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return False


def test_workers_vanish_when_the_service_is_killed(docker_client: Any, tmp_path: Path) -> None:
    service = f"eftest-{secrets.token_hex(4)}"
    server = start_server(tmp_path, workers=2, extra_env={"ENVFOUNDRY_SANDBOX": "docker",
                                                          "ENVFOUNDRY_SERVICE_NAME": service})
    try:
        with server.client() as http:
            made = http.post("/v1/sessions", json={"scenario_id": "lib-001"})
            assert made.status_code == 201, made.text
            sid = made.json()["session_id"]
            assert http.post(f"/v1/sessions/{sid}/calls", json={"name": "get_member",
                                                                 "arguments": {"member_id": "M002"}}).json()["ok"]
        assert len(containers_of(docker_client, service)) == 2
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()
        assert _wait_for(lambda: containers_of(docker_client, service) == [], 30), "workers outlived the service"
    finally:
        server.stop()


@pytest.mark.anyio
async def test_start_up_removes_what_an_earlier_run_of_the_service_left(docker_client: Any) -> None:
    service = f"eftest-{secrets.token_hex(4)}"
    orphan = docker_client.containers.create(SANDBOX_IMAGE, labels={SERVICE_LABEL: service, INSTANCE_LABEL: "gone"})
    stranger = docker_client.containers.create(SANDBOX_IMAGE, labels={SERVICE_LABEL: service + "-other",
                                                                       INSTANCE_LABEL: "alive"})
    try:
        pool = WorkerPool(DockerBackend(SANDBOX_IMAGE, service), 1, Limits())
        await pool.start()
        try:
            names = {c.name for c in containers_of(docker_client, service)}
            assert orphan.name not in names and len(names) == 1
            assert stranger.name in {c.name for c in docker_client.containers.list(all=True)}
        finally:
            await pool.close()
        assert containers_of(docker_client, service) == []
    finally:
        stranger.remove(force=True)
        if orphan.name in {c.name for c in docker_client.containers.list(all=True)}:
            orphan.remove(force=True)
