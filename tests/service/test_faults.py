"""Faults injected for real into a running service: a worker killed mid-call, Redis killed and
restarted under load, the API process told to stop while a call runs.

Every test drives a real uvicorn server over HTTP. Calls that must be "in flight" use the ledger's
``gated_add`` tool, which waits in the sandbox until the test sends it SIGUSR1, so the test knows
the call is running and decides when it ends; nothing here depends on how long anything takes.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from service.stores.redis.connection import RECONNECT_LONGEST
from tests.conftest import ROOT, Server, free_port, start_server
from tests.service import proctree

LEDGER = ROOT / "tests" / "fixtures" / "faults"
PROBLEM = "application/problem+json"
UNAVAILABLE = "urn:envfoundry:problem:unavailable"
# A gated call may wait at its gate far longer than the default call timeout.
SERVER_ENV = {"ENVFOUNDRY_CALL_TIMEOUT": "60"}
# No request may take longer than this, whatever is down: a hang fails the test as a timeout.
REQUEST_BOUND = 15.0


class InFlight:
    """One HTTP request running in a thread, so the test can act while it is in flight."""

    def __init__(self, send: Callable[[], httpx.Response]) -> None:
        self._response: httpx.Response | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(send,), daemon=True)
        self._thread.start()

    def _run(self, send: Callable[[], httpx.Response]) -> None:
        try:
            self._response = send()
        except BaseException as exc:  # handed to the test in result()
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 90.0) -> httpx.Response:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the request did not finish"
        if self._error is not None:
            raise self._error
        assert self._response is not None
        return self._response


def gated_call(server: Server, session_id: str, value: int) -> tuple[InFlight, int]:
    """Start ``gated_add(value)``; return the request and the pid of the call waiting at its gate."""

    def send() -> httpx.Response:
        with server.client(timeout=90) as http:
            return http.post(f"/v1/sessions/{session_id}/calls", json={"name": "gated_add", "arguments": {"value": value}})

    request = InFlight(send)
    return request, proctree.wait_for_gate(server.process.pid)


def new_session(http: httpx.Client) -> str:
    created = http.post("/v1/sessions", json={"env_id": "ledger"})
    assert created.status_code == 201, created.text
    return str(created.json()["session_id"])


def add(http: httpx.Client, session_id: str, value: int) -> httpx.Response:
    return http.post(f"/v1/sessions/{session_id}/calls", json={"name": "add", "arguments": {"value": value}})


# -- a sandbox worker killed mid-call ---------------------------------------------------------
def test_a_worker_killed_mid_call_fails_that_call_only_and_the_next_call_is_fine(tmp_path: Path) -> None:
    server = start_server(tmp_path, catalogs=(LEDGER,), workers=1, extra_env=SERVER_ENV)
    try:
        with server.client() as http:
            sid = new_session(http)
            assert add(http, sid, 1).json()["ok"]
            before = http.get(f"/v1/sessions/{sid}/state").json()

            request, gate = gated_call(server, sid, 2)
            worker = proctree.worker_of(server.process.pid, gate)
            tree = [worker, *proctree.descendants(worker)]
            os.kill(worker, signal.SIGKILL)

            answer = request.result()
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["ok"] is False and body["error"]["type"] == "sandbox_error", body
            # the failed call is a step that changed nothing
            assert http.get(f"/v1/sessions/{sid}/state").json() == {"step": 2, "state": before["state"]}
            proctree.wait_until(lambda: not any(proctree.descendants(server.process.pid).count(p) for p in tree),
                                10, "every process of the killed worker ending")

            after = add(http, sid, 3).json()
            assert after["ok"] and after["step"] == 3, after
            assert http.get(f"/v1/sessions/{sid}/state").json()["state"] == {"entries": [1, 3]}
            assert len(proctree.workers(server.process.pid)) == 1
    finally:
        server.stop()


# -- Redis killed and restarted ------------------------------------------------------------------
class OwnRedis:
    """An append-only redis-server owned by one test: its own port and folder, fsync on every write."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:  # refused while starting, LOADING while replaying the log
                return False

        proctree.wait_until(answers, 20, "redis-server answering")
        client.close()

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    folder = tmp_path / "redis"
    folder.mkdir()
    server = OwnRedis(folder)
    server.start()
    yield server
    server.stop()


def retry_after(response: httpx.Response) -> int:
    """The Retry-After of a 503 problem: whole seconds, at least 1, at most the reconnect backoff's ceiling."""
    assert response.status_code == 503, f"{response.request.method} {response.request.url.path}: {response.text}"
    assert response.headers["content-type"].startswith(PROBLEM)
    assert response.json()["type"] == UNAVAILABLE
    seconds = int(response.headers["retry-after"])
    assert 1 <= seconds <= math.ceil(RECONNECT_LONGEST)
    return seconds


def test_a_redis_outage_answers_503_with_retry_after_recovers_by_itself_and_loses_nothing(
        tmp_path: Path, own_redis: OwnRedis) -> None:
    prefix = "eftest-outage"
    server = start_server(tmp_path, redis_url=own_redis.url, catalogs=(LEDGER,), workers=1,
                          extra_env={**SERVER_ENV, "ENVFOUNDRY_KEY_PREFIX": prefix, "ENVFOUNDRY_LOCK_WAIT": "5"})
    try:
        with server.client(timeout=REQUEST_BOUND) as http:
            sid = new_session(http)
            for value in (1, 2, 3):
                assert add(http, sid, value).json()["ok"]
            acknowledged = [1, 2, 3]

            # a call that is running in the sandbox when Redis dies, and ends while it is down
            in_flight, gate = gated_call(server, sid, 99)
            own_redis.kill()
            os.kill(gate, proctree.GATE_SIGNAL)
            retry_after(in_flight.result())

            outage: list[tuple[str, str, dict[str, Any] | None]] = [
                ("GET", f"/v1/sessions/{sid}", None),
                ("GET", f"/v1/sessions/{sid}/state", None),
                ("GET", f"/v1/sessions/{sid}/trajectory", None),
                ("POST", f"/v1/sessions/{sid}/calls", {"name": "add", "arguments": {"value": 100}}),
                ("POST", f"/v1/sessions/{sid}/fork", None),
                ("POST", f"/v1/sessions/{sid}/score", None),
                ("POST", "/v1/sessions", {"env_id": "ledger"}),
                ("DELETE", f"/v1/sessions/{sid}", None),
                ("GET", "/v1/environments", None),
                ("GET", "/v1/scenarios/no-such-scenario", None),
            ]
            for method, path, body in outage:
                retry_after(http.request(method, path, json=body))
            assert http.get("/healthz").status_code == 200  # the process itself is alive

            own_redis.start()  # same port, same folder: the append-only file is replayed
            # Honouring the Retry-After of a 503 once Redis is back is enough: the service reconnects itself.
            first = http.get(f"/v1/sessions/{sid}")
            if first.status_code == 503:
                time.sleep(retry_after(first))
                first = http.get(f"/v1/sessions/{sid}")
            assert first.status_code == 200, first.text
            assert first.json()["steps"] == len(acknowledged)

            # nothing acknowledged was lost and nothing from the outage was applied
            assert http.get(f"/v1/sessions/{sid}/state").json() == {"step": 3, "state": {"entries": acknowledged}}
            steps = http.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]
            assert [s["arguments"]["value"] for s in steps] == acknowledged
            sessions = {key.split(":")[2] for key in own_redis.client().scan_iter(match=f"{prefix}:session:*")}
            assert sessions == {f"{{{sid}}}"}, "a session was created during the outage"

            # the session is usable at once: the lock the in-flight call held does not linger
            after = add(http, sid, 4)
            assert after.status_code == 200 and after.json()["step"] == 4, after.text
    finally:
        server.stop()


# -- SIGTERM to the API process ------------------------------------------------------------------
def refuses_connections(url: str) -> bool:
    try:
        httpx.get(f"{url}/healthz", timeout=2)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


def test_sigterm_drains_a_call_in_flight_commits_it_and_refuses_new_connections(
        tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    env = {**SERVER_ENV, "ENVFOUNDRY_KEY_PREFIX": key_prefix}
    server = start_server(tmp_path, redis_url=redis_url, catalogs=(LEDGER,), workers=1, extra_env=env)
    successor: Server | None = None
    try:
        with server.client() as http:
            sid = new_session(http)
            assert add(http, sid, 1).json()["ok"]
        in_flight, gate = gated_call(server, sid, 2)

        server.process.send_signal(signal.SIGTERM)
        proctree.wait_until(lambda: refuses_connections(server.url), 15, "the listener closing")
        assert not in_flight.done, "the call ended before its gate opened"
        assert server.process.poll() is None, "the process exited with a call in flight"

        os.kill(gate, proctree.GATE_SIGNAL)
        answer = in_flight.result()
        assert answer.status_code == 200, answer.text
        assert answer.json()["ok"] and answer.json()["step"] == 2, answer.text
        # uvicorn re-raises the signal it caught once it has drained, so "killed by SIGTERM" is a clean end too
        assert server.process.wait(30) in (0, -signal.SIGTERM)
        assert "Finished server process" in server.log.read_text()

        # committed: another process on the same Redis sees the step
        successor = start_server(tmp_path, redis_url=redis_url, catalogs=(LEDGER,), workers=1, extra_env=env)
        with successor.client() as http:
            assert http.get(f"/v1/sessions/{sid}/state").json() == {"step": 2, "state": {"entries": [1, 2]}}
    finally:
        server.stop()
        if successor is not None:
            successor.stop()
