"""A tenant's quotas of live sessions and stored bytes, on both stores (the app in this process): sessions
kept alive by reads alone stay counted, however long past the session TTL they are read."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import keyed_server
from tests.in_process import AppServer, start_app
from tests.service.test_api import new_session, problem

TTL = 2.0  # seconds an idle session lives here
BIG = '''
class Big:
    def __init__(self):
        self.blob = "x" * 300_000

    def size(self) -> int:
        """The blob's length."""
        return len(self.blob)
'''


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def quota_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppServer]:
    # no API keys: every request is the one anonymous tenant's
    yield from keyed_server(request, tmp_path, "", {"ENVFOUNDRY_SESSION_TTL": str(TTL),
                                                    "ENVFOUNDRY_MAX_SESSIONS": "2",
                                                    "ENVFOUNDRY_MAX_TENANT_BYTES": str(1 << 20)}, start=start_app)


def _read_past_the_ttl(client: httpx.Client, sids: list[str]) -> None:
    """Read every session, never stepping one, until twice the TTL has passed since they were made."""
    until = time.monotonic() + 2 * TTL + 0.5
    while time.monotonic() < until:
        for sid in sids:
            assert client.get(f"/v1/sessions/{sid}").status_code == 200
            assert client.get(f"/v1/sessions/{sid}/state").status_code == 200
        time.sleep(0.4)


def test_sessions_kept_alive_by_reads_count_against_the_session_quota(quota_server: AppServer) -> None:
    with quota_server.client() as client:
        sids = [new_session(client, scenario_id="lib-001") for _ in range(2)]
        _read_past_the_ttl(client, sids)
        body = problem(client.post("/v1/sessions", json={"scenario_id": "lib-001"}), 429, "quota-exceeded")
        assert body["quota"] == "max_sessions" and body["value"] == 2
        listed = client.get("/v1/sessions").json()
        assert listed["total"] == 2 and {s["session_id"] for s in listed["sessions"]} == set(sids)
        assert client.delete(f"/v1/sessions/{sids[0]}").status_code == 204
        new_session(client, scenario_id="lib-001")  # deleting one frees its place


def test_sessions_kept_alive_by_reads_count_against_the_bytes_quota(quota_server: AppServer) -> None:
    with quota_server.client() as client:
        added = client.post("/v1/environments", json={"env_id": "big_blob", "class_name": "Big", "code": BIG})
        assert added.status_code in (200, 201), added.text
        sid = new_session(client, env_id="big_blob")  # its state and initial state: 600 KB of the 1 MiB
        _read_past_the_ttl(client, [sid])
        body = problem(client.post("/v1/sessions", json={"env_id": "big_blob"}), 429, "quota-exceeded")
        assert body["quota"] == "max_tenant_bytes" and body["used"] >= 600_000
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
        new_session(client, env_id="big_blob")
