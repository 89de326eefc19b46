"""docker-compose.yml end to end: Redis plus two API replicas on the docker sandbox backend."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.api.auth import new_key
from tests.conftest import (
    REDIS_IMAGE,
    ROOT,
    SANDBOX_IMAGE,
    SERVICE_IMAGE,
    build_images,
    containers_of,
    free_port,
    images_older_than_sources,
)

PROXY_IMAGE = os.environ.get("ENVFOUNDRY_PROXY_IMAGE", "envfoundry/proxy:dev")


def _two_free_ports() -> int:
    import socket

    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two adjacent free ports")


def _wait_healthy(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not become healthy")


@pytest.fixture
def stack(docker_client: Any) -> Iterator[dict[str, Any]]:
    compose = shutil.which("docker-compose")
    if compose is None:
        message = "docker-compose is not installed (scripts/docker-setup installs it)"
        if os.environ.get("ENVFOUNDRY_REQUIRE_DOCKER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    if images_older_than_sources(docker_client, (SERVICE_IMAGE, SANDBOX_IMAGE, REDIS_IMAGE, PROXY_IMAGE)):
        failure = build_images()
        assert failure is None, failure
    project = f"eftest{secrets.token_hex(4)}"
    port = _two_free_ports()
    proxy_port = free_port()
    key, line = new_key("compose", ["run"])
    env = {**os.environ, "ENVFOUNDRY_SERVICE_IMAGE": SERVICE_IMAGE, "ENVFOUNDRY_SANDBOX_IMAGE": SANDBOX_IMAGE,
           "ENVFOUNDRY_REDIS_IMAGE": REDIS_IMAGE, "ENVFOUNDRY_PORTS": f"{port}-{port + 1}", "ENVFOUNDRY_WORKERS": "2",
           "ENVFOUNDRY_API_KEYS": line, "ENVFOUNDRY_PROXY_IMAGE": PROXY_IMAGE, "ENVFOUNDRY_PORT": str(proxy_port)}
    command = [compose, "-p", project, "-f", str(ROOT / "docker-compose.yml")]
    up = subprocess.run([*command, "up", "-d", "--no-build", "--scale", "api=2"], env=env, capture_output=True,
                        text=True, timeout=300)
    services: list[str] = []
    try:
        assert up.returncode == 0, up.stderr
        urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
        deadline = time.monotonic() + 120
        proxy = f"http://127.0.0.1:{proxy_port}"
        for url in [*urls, proxy]:
            _wait_healthy(url, deadline)
        apis = docker_client.containers.list(filters={"label": [f"com.docker.compose.project={project}",
                                                                "com.docker.compose.service=api"]})
        services = [f"envfoundry-{c.attrs['Config']['Hostname']}-8000" for c in apis]
        by_port = {}
        for container in apis:
            published = container.attrs["NetworkSettings"]["Ports"]["8000/tcp"][0]["HostPort"]
            by_port[int(published)] = f"envfoundry-{container.attrs['Config']['Hostname']}-8000"
        yield {"urls": urls, "proxy": proxy, "service_of": [by_port[port], by_port[port + 1]], "client": docker_client, "key": key}
    finally:
        down = subprocess.run([*command, "down", "-v", "--timeout", "30"], env=env, capture_output=True, text=True,
                              timeout=300)
        assert down.returncode == 0, down.stderr
        left = docker_client.containers.list(all=True, filters={"label": f"com.docker.compose.project={project}"})
        assert left == [], "compose containers left behind"
        for service in services:
            assert containers_of(docker_client, service) == [], f"sandbox containers of {service} left behind"


def _call(http: httpx.Client, sid: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    response = http.post(f"/v1/sessions/{sid}/calls", json={"name": name, "arguments": arguments})
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.timeout(420)  # bringing the stack up and down alone may take minutes on a loaded machine
def test_an_episode_survives_a_killed_worker_across_two_replicas(stack: dict[str, Any]) -> None:
    auth = {"Authorization": f"Bearer {stack['key']}"}
    first, second = (httpx.Client(base_url=url, timeout=60, headers=auth) for url in stack["urls"])
    with first, second:
        # the compose stack listens beyond loopback, so it requires keys
        assert httpx.get(f"{stack['urls'][0]}/v1/environments").status_code == 401
        scenario = first.get("/v1/scenarios/lib-001").json()
        sid = first.post("/v1/sessions", json={"scenario_id": "lib-001"}).json()["session_id"]
        steps = scenario["reference_solution"]
        assert _call(first, sid, steps[0]["name"], steps[0]["arguments"])["ok"]

        workers = containers_of(stack["client"], stack["service_of"][1])
        assert len(workers) == 2 and all(w.attrs["HostConfig"]["NetworkMode"] == "none" for w in workers)
        assert all(w.attrs["HostConfig"]["ReadonlyRootfs"] for w in workers)
        assert all(w.attrs["HostConfig"]["CapDrop"] == ["ALL"] for w in workers)
        workers[0].kill()  # mid-episode, on the replica that serves the rest of it

        for step in steps[1:]:
            before = second.get(f"/v1/sessions/{sid}/state").json()["state"]
            result = _call(second, sid, step["name"], step["arguments"])
            if not result["ok"]:
                # the call that met the dead worker: reported, nothing applied, retried as an agent would
                assert result["error"]["type"] == "sandbox_error", result
                assert second.get(f"/v1/sessions/{sid}/state").json()["state"] == before
                result = _call(second, sid, step["name"], step["arguments"])
            assert result["ok"], result
        score = first.post(f"/v1/sessions/{sid}/score").json()
        assert score["reward"] == 1.0, score

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            running = [w for w in containers_of(stack["client"], stack["service_of"][1]) if w.status == "running"]
            if len(running) == 2 and workers[0].id not in {w.id for w in running}:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the killed sandbox container was not replaced")


@pytest.mark.timeout(420)
def test_one_published_port_serves_every_replica(stack: dict[str, Any]) -> None:
    """Clients need one address: the proxy spreads requests over ready replicas sharing Redis."""
    auth = {"Authorization": f"Bearer {stack['key']}"}
    with httpx.Client(base_url=stack["proxy"], timeout=60, headers=auth) as proxy:
        assert httpx.get(f"{stack['proxy']}/v1/environments").status_code == 401
        assert proxy.get("/readyz").status_code == 200
        sids = [proxy.post("/v1/sessions", json={"scenario_id": "lib-001"}).json()["session_id"] for _ in range(4)]
        for url in stack["urls"]:  # every replica sees every session made through the proxy
            with httpx.Client(base_url=url, timeout=60, headers=auth) as replica:
                assert all(replica.get(f"/v1/sessions/{sid}").status_code == 200 for sid in sids)
