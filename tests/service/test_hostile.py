"""The attacks of the hostile-client round, against the real app in this process (tests/in_process.py): the attacker gets a clear problem and
changes nothing, and another tenant's requests (the victim's) are answered meanwhile."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from service.api.auth import new_key
from service.catalog.analysis import Analysis
from service.catalog.model import CatalogError
from tests.conftest import keyed_server
from tests.in_process import AppServer, start_app
from tests.service.test_api import problem

QUOTA = 8 << 20
FLIPPER = '''
class Flipper:
    def __init__(self):
        self.cells = [[] for _ in range(60_000)]

    def flip(self) -> int:
        """Flip every cell between empty and not."""
        self.cells = [[] if cell else [0] for cell in self.cells]
        return len(self.cells)
'''
SHARED_KEYS = '''
class Shared:
    def __init__(self):
        shared = tuple(range(6000))
        self.index = {(i, shared): i for i in range(300)}

    def size(self) -> int:
        """How many keys."""
        return len(self.index)
'''


class Tenants:
    def __init__(self) -> None:
        self.attacker, line_a = new_key("attacker", ["run", "admin"])
        self.victim, line_v = new_key("victim", ["run", "admin"])
        self.lines = f"{line_a}\n{line_v}\n"


@pytest.fixture(scope="module")
def tenants() -> Tenants:
    return Tenants()


@pytest.fixture(scope="module", params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def hostile(request: pytest.FixtureRequest, tenants: Tenants,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    yield from keyed_server(request, tmp_path_factory.mktemp("hostile"), tenants.lines,
                            {"ENVFOUNDRY_MAX_TENANT_BYTES": str(QUOTA), "ENVFOUNDRY_CALL_TIMEOUT": "4"}, start=start_app)


def _client(server: AppServer, key: str) -> httpx.Client:
    return server.client(headers={"authorization": f"Bearer {key}"})


@pytest.fixture
def attacker(hostile: AppServer, tenants: Tenants) -> Iterator[httpx.Client]:
    with _client(hostile, tenants.attacker) as http:
        yield http


@pytest.fixture
def victim(hostile: AppServer, tenants: Tenants) -> Iterator[httpx.Client]:
    with _client(hostile, tenants.victim) as http:
        yield http


def _session(http: httpx.Client, **body: Any) -> str:
    response = http.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


def _victim_is_served(victim: httpx.Client) -> None:
    sid = _session(victim, scenario_id="probe-001")
    answer = victim.post(f"/v1/sessions/{sid}/calls", json={"name": "increment", "arguments": {"by": 2}})
    assert answer.status_code == 200 and answer.json()["ok"] is True
    assert victim.delete(f"/v1/sessions/{sid}").status_code == 204


def _meanwhile(victim: httpx.Client, attack: Callable[[], httpx.Response], times: int) -> list[httpx.Response]:
    """The answers to ``times`` hostile requests sent one after another while the victim is served."""
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.extend(attack() for _ in range(times)))
    thread.start()
    _victim_is_served(victim)
    thread.join(60)
    return answers


def _sandbox_grants(http: httpx.Client) -> float:
    """How many requests have been given a sandbox worker (the wait histogram's count)."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("envfoundry_sandbox_wait_seconds_count"):
            return float(line.split()[-1])
    raise AssertionError("no sandbox wait metric")


def _clear(http: httpx.Client) -> None:
    for info in http.get("/v1/sessions", params={"limit": 1000}).json()["sessions"]:
        http.delete(f"/v1/sessions/{info['session_id']}")


def test_a_call_is_served_while_another_tenant_holds_every_other_worker(attacker: httpx.Client,
                                                                        victim: httpx.Client) -> None:
    spinners = [_session(attacker, scenario_id="probe-001") for _ in range(2)]  # as many as the workers
    sid = _session(victim, scenario_id="probe-001")
    finished: list[str] = []

    def spin(session: str) -> None:
        answer = attacker.post(f"/v1/sessions/{session}/calls", json={"name": "spin"})
        assert answer.status_code == 200 and answer.json()["error"]["type"] == "timeout"
        finished.append("attacker")

    granted = _sandbox_grants(victim)
    threads = [threading.Thread(target=spin, args=(s,)) for s in spinners]
    for thread in threads:
        thread.start()
    while _sandbox_grants(victim) == granted:
        time.sleep(0.01)  # until a spin holds a worker
    time.sleep(0.3)  # (and the other has asked for one)
    answer = victim.post(f"/v1/sessions/{sid}/calls", json={"name": "increment", "arguments": {"by": 1}})
    finished.append("victim")
    assert answer.status_code == 200 and answer.json()["ok"] is True
    for thread in threads:
        thread.join(60)
    assert finished[0] == "victim"  # answered before any of the calls holding the other workers ended
    metrics = victim.get("/metrics").text
    assert 'envfoundry_sandbox_tenant_bounds{bound="reserve"} 1.0' in metrics
    _clear(attacker)
    _clear(victim)


def test_large_arguments_and_results_are_cut_in_the_stored_trajectory(attacker: httpx.Client,
                                                                      victim: httpx.Client) -> None:
    sid = _session(attacker, scenario_id="probe-001")
    for i in range(3):
        tag = f"{i}" + "a" * 300_000
        answer = attacker.post(f"/v1/sessions/{sid}/calls", json={"name": "tag", "arguments": {"tag": tag}})
        assert answer.status_code == 200 and answer.json()["ok"] is True
        assert len(answer.json()["result"]) == i + 1  # the answer itself is whole
    steps = attacker.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]
    assert len(steps) == 3
    for step in steps:
        assert step["arguments"] == {"$truncated": "size", "bytes": step["arguments"]["bytes"]}
        assert step["arguments"]["bytes"] > 300_000
        assert step["result"]["$truncated"] == "size"
        assert step["diff"]["truncated"] is True
    _victim_is_served(victim)
    _clear(attacker)


def test_a_fork_past_the_tenants_byte_quota_is_refused_whole(attacker: httpx.Client, victim: httpx.Client) -> None:
    sid = _session(attacker, scenario_id="probe-001")
    answer = attacker.post(f"/v1/sessions/{sid}/calls", json={"name": "tag", "arguments": {"tag": "b" * 900_000}})
    assert answer.status_code == 200 and answer.json()["ok"] is True
    before = attacker.get("/v1/sessions").json()["total"]
    body = problem(attacker.post(f"/v1/sessions/{sid}/fork", json={"n": 64}), 429, "quota-exceeded")
    assert body["quota"] == "max_tenant_bytes" and body["value"] == QUOTA
    assert attacker.get("/v1/sessions").json()["total"] == before  # no copy was made
    _victim_is_served(victim)
    _clear(attacker)


def test_a_group_past_the_quota_is_refused_whole(attacker: httpx.Client, victim: httpx.Client) -> None:
    before = attacker.get("/v1/sessions").json()["total"]
    body = problem(attacker.post("/v1/sessions", json={"env_id": "probe", "init_config": {"note": "g" * 500_000},
                                                       "n": 64}), 429, "quota-exceeded")
    assert body["quota"] == "max_tenant_bytes" and body["needed"] > QUOTA
    assert attacker.get("/v1/sessions").json()["total"] == before
    _victim_is_served(victim)


def _fill(attacker: httpx.Client) -> tuple[str, httpx.Response]:
    """Sessions of about 900 KB each until the quota refuses a step: that session and the answer."""
    for i in range(20):
        sid = _session(attacker, scenario_id="probe-001")
        answer = attacker.post(f"/v1/sessions/{sid}/calls",
                               json={"name": "tag", "arguments": {"tag": f"{i}" + "c" * 900_000}})
        if answer.status_code != 200:
            return sid, answer
        assert answer.json()["ok"] is True
    raise AssertionError("the quota never refused a step")


def test_steps_past_the_quota_are_refused_and_leave_the_session_as_it_was(attacker: httpx.Client,
                                                                          victim: httpx.Client) -> None:
    sid, refused = _fill(attacker)
    body = problem(refused, 429, "quota-exceeded")
    assert body["quota"] == "max_tenant_bytes" and refused.headers["retry-after"]
    assert attacker.get(f"/v1/sessions/{sid}").json()["steps"] == 0  # the refused step was not applied
    assert attacker.get(f"/v1/sessions/{sid}/state").json()["state"]["tags"] == []
    _victim_is_served(victim)
    # deleting what it holds gives the tenant its room back
    _clear(attacker)
    _victim_is_served(attacker)


def test_an_added_environment_past_the_quota_is_refused(attacker: httpx.Client) -> None:
    _fill(attacker)
    code = FLIPPER + "\n# " + "x" * 900_000 + "\n"
    body = problem(attacker.post("/v1/environments", json={"env_id": "filler", "class_name": "Flipper",
                                                           "code": code}), 429, "quota-exceeded")
    assert body["quota"] == "max_tenant_bytes"
    assert attacker.get("/v1/environments/filler").status_code == 404
    _clear(attacker)


def test_a_diff_of_many_changes_is_summarised_and_others_are_answered(attacker: httpx.Client,
                                                                       victim: httpx.Client) -> None:
    assert attacker.post("/v1/environments", json={"env_id": "flipper", "class_name": "Flipper",
                                                   "code": FLIPPER}).status_code in (200, 201)
    sid = _session(attacker, env_id="flipper")
    answers = _meanwhile(victim, lambda: attacker.post(f"/v1/sessions/{sid}/calls", json={"name": "flip"}), 3)
    assert [a.status_code for a in answers] == [200, 200, 200]
    steps = attacker.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]
    assert all(step["ok"] and step["diff"]["truncated"] is True for step in steps)
    _clear(attacker)


def test_a_small_state_with_a_large_view_is_shown_whole_off_the_loop(attacker: httpx.Client,
                                                                    victim: httpx.Client) -> None:
    assert attacker.post("/v1/environments", json={"env_id": "shared", "class_name": "Shared",
                                                   "code": SHARED_KEYS}).status_code in (200, 201)
    sid = _session(attacker, env_id="shared")
    views = _meanwhile(victim, lambda: attacker.get(f"/v1/sessions/{sid}/state"), 2)
    assert [v.status_code for v in views] == [200, 200]
    index = views[0].json()["state"]["index"]
    assert len(index) == 300
    assert all(len(key) > 6000 for key in index)  # every key shows the shared tuple in full
    _clear(attacker)


@pytest.mark.parametrize("word", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_in_a_body_are_refused_naming_the_field(attacker: httpx.Client, word: str) -> None:
    before = attacker.get("/v1/sessions").json()["total"]
    body = problem(attacker.post("/v1/sessions", content='{"env_id": "probe", "init_config": {"limits": [1, ' + word
                                 + "]}}", headers={"content-type": "application/json"}), 422, "invalid-request")
    assert body["errors"][0]["field"] == "init_config.limits.1" and word.lstrip("-") in body["detail"]
    assert attacker.get("/v1/sessions").json()["total"] == before
    sid = _session(attacker, scenario_id="probe-001")
    body = problem(attacker.post(f"/v1/sessions/{sid}/calls", content='{"name": "increment", "arguments": {"by": '
                                 + word + "}}", headers={"content-type": "application/json"}), 422, "invalid-request")
    assert body["errors"][0]["field"] == "arguments.by"
    assert attacker.get(f"/v1/sessions/{sid}").json()["steps"] == 0
    # the words inside strings are text, not numbers
    _session(attacker, env_id="probe", init_config={"note": f"{word} and NaN"})
    _clear(attacker)


PLAIN = "class Ok:\n    def go(self) -> int:\n        \"\"\"Go.\"\"\"\n        return 1\n"
SLOW = "import time\nclass Slow:\n" + "".join(
    f"    def m{i}(self, a: 'Union[{', '.join(['int', 'str'] * 3000)}]') -> int:\n        \"\"\"M.\"\"\"\n"
    f"        return 1\n" for i in range(4))


@pytest.mark.anyio
async def test_a_tenants_queue_of_submissions_delays_anothers_by_at_most_one_analysis() -> None:
    analysis = Analysis(timeout=1.0, concurrent=1)
    finished: list[str] = []

    async def submit(tenant: str, name: str, code: str, class_name: str) -> None:
        try:
            await analysis.environment(env_id=name, class_name=class_name, code=code, summary="", introduction="",
                                       rules=[], tenant=tenant)
        except CatalogError:
            pass  # the hostile ones may pass the time limit; their order is what counts
        finished.append(name)

    hostile = [asyncio.create_task(submit("attacker", f"slow{i}", SLOW, "Slow")) for i in range(4)]
    await asyncio.sleep(0.05)
    victim = asyncio.create_task(submit("victim", "plain", PLAIN, "Ok"))
    await asyncio.gather(*hostile, victim)
    assert finished.index("plain") == 1  # right after the one analysis running when it came
