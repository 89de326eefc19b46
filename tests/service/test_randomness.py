"""A served session draws what the class would draw in one plain process, through every rebuild;
with a ``seed`` every draw is reproducible, on any replica."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import per_store, start_server
from tests.in_process import AppServer, start_app

DICE = '''
import random


class Dice:
    def __init__(self, config=None):
        random.seed(42)
        self.first = random.random()

    def roll(self) -> float:
        """Roll the die."""
        return random.random()
'''

LOTTERY = '''
import os
import random
import secrets
import uuid


class Lottery:
    def __init__(self, config=None):
        self.token = str(uuid.uuid4())
        self.pin = random.randint(0, 10**9)

    def draw(self) -> dict:
        """Draw from every source."""
        return {"random": random.random(), "uuid": str(uuid.uuid4()), "secret": secrets.token_hex(8),
                "urandom": os.urandom(4).hex(), "system": random.SystemRandom().random()}
'''

HIDDEN_CHECK = "def check_func(final_state):\n    return sorted(final_state) == ['pin', 'token']\n"


def _register(http: httpx.Client) -> None:
    for env_id, class_name, code in (("rnd_dice", "Dice", DICE), ("rnd_lottery", "Lottery", LOTTERY)):
        answer = http.post("/v1/environments", json={"env_id": env_id, "class_name": class_name, "code": code})
        assert answer.status_code in (200, 201), answer.text
    for scenario_id, env_id, checklist in (("rnd-dice-1", "rnd_dice", []),
                                           ("rnd-lottery-1", "rnd_lottery",
                                            [{"item": "only the attributes", "check": HIDDEN_CHECK}])):
        answer = http.post("/v1/scenarios", json={"scenario_id": scenario_id, "env_id": env_id, "task": "draw",
                                                  "checklist": checklist})
        assert answer.status_code in (200, 201, 409), answer.text


@pytest.fixture(scope="module", params=["memory", "redis"])
def rebuilding(request: pytest.FixtureRequest) -> Iterator[AppServer]:
    """The app (in this process) keeping no live session: every call rebuilds the instance from the stored state."""
    for server in per_store(request, start_app, {"ENVFOUNDRY_RESIDENTS": "0"}):
        with server.client() as http:
            _register(http)
        yield server


@pytest.fixture
def http(rebuilding: AppServer) -> Iterator[httpx.Client]:
    with rebuilding.client() as client:
        yield client


def _create(http: httpx.Client, scenario_id: str, **options: Any) -> list[str]:
    answer = http.post("/v1/sessions", json={"scenario_id": scenario_id, **options})
    assert answer.status_code == 201, answer.text
    return list(answer.json()["session_ids"])


def _call(http: httpx.Client, sid: str, name: str) -> Any:
    answer = http.post(f"/v1/sessions/{sid}/calls", json={"name": name, "arguments": {}}).json()
    assert answer["ok"], answer
    return answer["result"]


def _state(http: httpx.Client, sid: str) -> dict[str, Any]:
    state = http.get(f"/v1/sessions/{sid}/state").json()["state"]
    assert "__random__" not in state  # the session's randomness is the sandbox's, never the state's
    return dict(state)


def _run(http: httpx.Client, sid: str, draws: int = 3) -> tuple[dict[str, Any], list[Any]]:
    return _state(http, sid), [_call(http, sid, "draw") for _ in range(draws)]


def test_a_class_seeding_random_draws_as_one_plain_process_through_every_rebuild(http: httpx.Client) -> None:
    random.seed(42)
    plain = [random.random() for _ in range(5)]
    for sid in (_create(http, "rnd-dice-1")[0], _create(http, "rnd-dice-1")[0]):  # the second from the template
        assert _state(http, sid) == {"first": plain[0]}
        assert [_call(http, sid, "roll") for _ in range(4)] == plain[1:]
        steps = http.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]
        assert all(step["diff"] == {"added": [], "removed": [], "changed": []} for step in steps)


def test_sessions_of_one_scenario_draw_their_own(http: httpx.Client) -> None:
    """More sessions than the server has workers: some are made on one worker, from one template."""
    runs = [_run(http, _create(http, "rnd-lottery-1")[0], draws=1) for _ in range(4)]
    for name in ("token", "pin"):
        assert len({run[0][name] for run in runs}) == len(runs)
    for name in runs[0][1][0]:
        assert len({run[1][0][name] for run in runs}) == len(runs)


def test_the_same_seed_draws_the_same_and_another_seed_does_not(http: httpx.Client) -> None:
    runs = [_run(http, _create(http, "rnd-lottery-1", seed=seed)[0]) for seed in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0][0]["token"] != runs[2][0]["token"]
    assert all(runs[0][1][0][name] != runs[2][1][0][name] for name in runs[0][1][0])
    dice = _create(http, "rnd-dice-1", seed=7)[0]  # the class's own random.seed(42) wins, as in a process
    random.seed(42)
    random.random()
    assert _call(http, dice, "roll") == random.random()


def test_a_group_draws_from_derived_seeds_reproducibly(http: httpx.Client) -> None:
    group = [_run(http, sid) for sid in _create(http, "rnd-lottery-1", n=3, seed=11)]
    again = [_run(http, sid) for sid in _create(http, "rnd-lottery-1", n=3, seed=11)]
    assert group == again
    assert len({run[0]["token"] for run in group}) == 1  # one initial state, shared
    assert len({run[1][0]["uuid"] for run in group}) == 3  # and each member's own draws after it
    same = [_run(http, sid) for sid in _create(http, "rnd-lottery-1", n=2, seed=11, group_seeds="same")]
    assert same[0] == same[1]
    unseeded = [_run(http, sid) for sid in _create(http, "rnd-lottery-1", n=2)]
    assert unseeded[0][1] != unseeded[1][1]


def test_a_fork_goes_on_drawing_where_its_parent_was(http: httpx.Client) -> None:
    """As a forked process would (were it not reseeded): the random module's draws, and with a seed every
    draw; without one, the OS's (urandom, uuid4, secrets) are a fresh process's own."""
    for options, same in (({}, ("random",)), ({"seed": 3}, ("random", "uuid", "secret", "urandom", "system"))):
        parent = _create(http, "rnd-lottery-1", **options)[0]
        _call(http, parent, "draw")
        fork = http.post(f"/v1/sessions/{parent}/fork").json()["session_id"]
        drawn = _call(http, fork, "draw"), _call(http, parent, "draw")
        assert [drawn[0][name] for name in same] == [drawn[1][name] for name in same]
        past = http.post(f"/v1/sessions/{parent}/fork", json={"step": 1}).json()["session_id"]
        again = _call(http, past, "draw")  # the state after step 1 holds the stream as it was then
        assert [again[name] for name in same] == [drawn[0][name] for name in same]
    reseeded = [http.post(f"/v1/sessions/{parent}/fork", json={"seed": 5}).json()["session_id"] for _ in range(2)]
    assert _call(http, reseeded[0], "draw") == _call(http, reseeded[1], "draw") != _call(http, parent, "draw")


def test_checks_never_see_the_randomness(http: httpx.Client) -> None:
    sid = _create(http, "rnd-lottery-1")[0]
    _call(http, sid, "draw")
    assert http.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0


def test_a_seeded_session_draws_the_same_on_every_replica(tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    env = {"ENVFOUNDRY_KEY_PREFIX": key_prefix}
    a = start_server(tmp_path, redis_url=redis_url, extra_env=env)
    b = start_server(tmp_path, redis_url=redis_url, extra_env=env)
    try:
        with a.client() as on_a, b.client() as on_b:
            _register(on_a)
            alone = _create(on_a, "rnd-lottery-1", seed=21)[0]
            expected = [_call(on_a, alone, "draw") for _ in range(4)]
            moving = _create(on_b, "rnd-lottery-1", seed=21)[0]
            assert [_call(on_a if turn % 2 else on_b, moving, "draw") for turn in range(4)] == expected
            assert _state(on_a, moving) == _state(on_b, alone)
    finally:
        a.stop()
        b.stop()
