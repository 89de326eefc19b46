"""Per-session and per-tenant bounds: steps, record size, the score budget and the tenant's share of workers."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from service.api.auth import new_key
from tests.in_process import AppServer, start_app
from tests.service.test_api import call, new_session, problem, state

SLOW = '''
import time


class Slow:
    def __init__(self):
        self.blob = ""
        self.done = 0

    def nap(self, seconds: float = 1.5) -> int:
        """Work for a while."""
        time.sleep(seconds)
        self.done += 1
        return self.done

    def fill(self, kilobytes: int) -> int:
        """Replace the blob."""
        self.blob = "x" * (kilobytes * 1024)
        return len(self.blob)
'''

SLEEPY_CHECK = "def check_func(final_state):\n    import time\n    time.sleep(3)\n    return True\n"


class Keys:
    def __init__(self) -> None:
        self.a, line_a = new_key("alpha", ["run", "admin"])
        self.b, line_b = new_key("beta", ["run", "admin"])
        self.lines = f"{line_a};{line_b}"


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture(scope="module")
def bounded(keys: Keys) -> Iterator[AppServer]:
    server = start_app(workers=2, extra_env={
        "ENVFOUNDRY_API_KEYS": keys.lines, "ENVFOUNDRY_MAX_STEPS": "4", "ENVFOUNDRY_MAX_RECORD_BYTES": "8192",
        "ENVFOUNDRY_SCORE_BUDGET": "2", "ENVFOUNDRY_TENANT_SANDBOX_SHARE": "0.5"})
    yield server
    server.stop()


def as_(server: AppServer, key: str) -> httpx.Client:
    return server.client(headers={"Authorization": f"Bearer {key}"})


@pytest.fixture(scope="module")
def slow_env(bounded: AppServer, keys: Keys) -> str:
    env_id = f"slow-{secrets.token_hex(3)}"
    with as_(bounded, keys.a) as a, as_(bounded, keys.b) as b:
        for client in (a, b):
            assert client.post("/v1/environments", json={"env_id": env_id, "class_name": "Slow",
                                                         "code": SLOW}).status_code == 201
    return env_id


def test_a_session_stops_at_max_steps_and_its_state_stays(bounded: AppServer, keys: Keys, slow_env: str) -> None:
    with as_(bounded, keys.a) as a:
        sid = new_session(a, env_id=slow_env)
        for _ in range(4):
            call(a, sid, "fill", {"kilobytes": 1})
        before = state(a, sid)
        body = problem(a.post(f"/v1/sessions/{sid}/calls", json={"name": "fill", "arguments": {"kilobytes": 1}}),
                       422, "limit-exceeded")
        assert body["limit"] == "max_steps" and body["value"] == 4
        assert state(a, sid) == before


def test_a_diff_over_the_record_bound_is_summarised_and_the_result_kept(bounded: AppServer, keys: Keys,
                                                                        slow_env: str) -> None:
    with as_(bounded, keys.a) as a:
        sid = new_session(a, env_id=slow_env)
        assert call(a, sid, "fill", {"kilobytes": 64})["result"] == 65536
        steps = a.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]
        assert steps[0]["diff"]["truncated"] is True and steps[0]["diff"]["bytes"] > 65536
        assert steps[0]["diff"]["changed"] == [] and steps[0]["result"] == 65536
        assert len(state(a, sid)["state"]["blob"]) == 65536  # the state itself is whole
        call(a, sid, "nap", {"seconds": 0})
        small = a.get(f"/v1/sessions/{sid}/trajectory").json()["steps"][1]["diff"]
        assert "truncated" not in small and small["changed"]


def test_checks_past_the_score_budget_are_a_named_problem(bounded: AppServer, keys: Keys, slow_env: str) -> None:
    with as_(bounded, keys.a) as a:
        scenario = a.post("/v1/scenarios", json={"env_id": slow_env, "task": "nap", "checklist": [
            {"item": f"sleepy {i}", "check": SLEEPY_CHECK} for i in range(3)]}).json()
        sid = new_session(a, scenario_id=scenario["scenario_id"])
        body = problem(a.post(f"/v1/sessions/{sid}/score"), 422, "limit-exceeded")
        assert body["limit"] == "score_budget" and body["value"] == 2
        # the workers are free again for everyone
        assert call(a, new_session(a, env_id=slow_env), "fill", {"kilobytes": 1})["ok"]


def test_one_tenant_cannot_hold_every_worker(bounded: AppServer, keys: Keys, slow_env: str) -> None:
    """With a share of 0.5 of two workers, alpha's second slow call waits while beta's call goes ahead."""
    with as_(bounded, keys.a) as a, as_(bounded, keys.b) as b:
        sessions = [new_session(a, env_id=slow_env) for _ in range(2)]
        other = new_session(b, env_id=slow_env)
        finished: dict[str, float] = {}

        def run(client: httpx.Client, sid: str, name: str, seconds: float) -> None:
            call(client, sid, "nap", {"seconds": seconds})
            finished[name] = time.monotonic()

        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(run, a, sessions[0], "alpha-1", 2.0)
            time.sleep(0.3)
            second = pool.submit(run, a, sessions[1], "alpha-2", 0.1)
            time.sleep(0.3)
            third = pool.submit(run, b, other, "beta", 0.1)
            for future in (first, second, third):
                future.result()
        assert finished["beta"] < finished["alpha-1"] < finished["alpha-2"]


def test_a_tenant_past_its_live_session_quota_gets_429() -> None:
    server = start_app(extra_env={"ENVFOUNDRY_MAX_SESSIONS": "3"})
    try:
        with server.client() as client:
            group = client.post("/v1/sessions", json={"scenario_id": "probe-001", "n": 2}).json()["session_ids"]
            refused = client.post("/v1/sessions", json={"scenario_id": "probe-001", "n": 2})
            body = problem(refused, 429, "quota-exceeded")
            assert body["quota"] == "max_sessions" and body["value"] == 3 and int(refused.headers["Retry-After"]) > 0
            problem(client.post(f"/v1/sessions/{group[0]}/fork", json={"n": 2}), 429, "quota-exceeded")
            fork = client.post(f"/v1/sessions/{group[0]}/fork")
            assert fork.status_code == 201
            assert client.delete(f"/v1/sessions/{group[1]}").status_code == 204
            assert client.post("/v1/sessions", json={"scenario_id": "probe-001"}).status_code == 201
    finally:
        server.stop()


def test_a_waiting_tenant_goes_before_a_busy_tenants_queue(keys: Keys) -> None:
    """Work-conserving fairness, on by default: alpha fills both workers and queues two more calls;
    beta's one call takes the next free worker."""
    server = start_app(workers=2, extra_env={"ENVFOUNDRY_API_KEYS": keys.lines})
    env_id = f"slow-{secrets.token_hex(3)}"
    try:
        with as_(server, keys.a) as a, as_(server, keys.b) as b:
            for client in (a, b):
                assert client.post("/v1/environments", json={"env_id": env_id, "class_name": "Slow",
                                                             "code": SLOW}).status_code == 201
            alpha = [new_session(a, env_id=env_id) for _ in range(4)]
            beta = new_session(b, env_id=env_id)
            finished: dict[str, float] = {}

            def run(client: httpx.Client, sid: str, name: str, seconds: float) -> None:
                call(client, sid, "nap", {"seconds": seconds})
                finished[name] = time.monotonic()

            with ThreadPoolExecutor(5) as pool:
                futures = []
                for i, sid in enumerate(alpha):
                    futures.append(pool.submit(run, a, sid, f"alpha-{i}", 1.5))
                    time.sleep(0.1)
                time.sleep(0.3)
                futures.append(pool.submit(run, b, beta, "beta", 0.2))
                for future in futures:
                    future.result()
            third_alpha = sorted(finished[f"alpha-{i}"] for i in range(4))[2]
            assert finished["beta"] < third_alpha
    finally:
        server.stop()
