"""Going back to any step: forks at a past step and past states, on both stores, and after a restart."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Server, start_server
from tests.in_process import start_app

pytestmark = pytest.mark.in_process  # (restarts are real ones: a new process)

RANDOM = '''
import random


class Dice:
    def __init__(self, config=None):
        self.rolls = []

    def roll(self) -> int:
        """Roll a die."""
        value = random.randint(1, 1_000_000)
        self.rolls.append(value)
        return value


class SharedDice(Dice):
    """The same dice, with its rolls reached twice: not a tree, so its steps store whole states."""

    def __init__(self, config=None):
        super().__init__(config)
        self.also = self.rolls
'''


def _call(client: httpx.Client, sid: str, name: str, **arguments: Any) -> dict[str, Any]:
    answer = client.post(f"/v1/sessions/{sid}/calls", json={"name": name, "arguments": arguments})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _state(client: httpx.Client, sid: str, step: int | None = None) -> dict[str, Any]:
    answer = client.get(f"/v1/sessions/{sid}/state", params={} if step is None else {"step": step})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _episode(client: httpx.Client) -> tuple[str, list[dict[str, Any]]]:
    """lib-001 played four steps (one refused), with the state after each."""
    sid = client.post("/v1/sessions", json={"scenario_id": "lib-001"}).json()["session_id"]
    states = [_state(client, sid)["state"]]
    for name, arguments in (("list_member_loans", {"member_id": "M002"}), ("return_book", {"loan_id": "L0003"}),
                            ("renew_loan", {"loan_id": "L9999"}), ("return_book", {"loan_id": "L0004"})):
        _call(client, sid, name, **arguments)
        states.append(_state(client, sid)["state"])
    return sid, states


def test_a_past_state_is_the_state_that_step_left(client: httpx.Client) -> None:
    sid, states = _episode(client)
    for step, expected in enumerate(states):
        shown = _state(client, sid, step)
        assert shown == {"step": step, "state": expected}
    assert _state(client, sid)["step"] == 4  # the session itself is where it was


def test_a_fork_at_a_past_step_starts_there_and_the_original_is_unchanged(client: httpx.Client) -> None:
    sid, states = _episode(client)
    forked = client.post(f"/v1/sessions/{sid}/fork", json={"step": 2, "n": 2})
    assert forked.status_code == 201, forked.text
    first, second = forked.json()["session_ids"]
    for fork in (first, second):
        info = client.get(f"/v1/sessions/{fork}").json()
        assert (info["steps"], info["parent_id"]) == (2, sid)
        assert _state(client, fork) == {"step": 2, "state": states[2]}
        steps = client.get(f"/v1/sessions/{fork}/trajectory").json()
        assert [s["step"] for s in steps["steps"]] == [1, 2] and steps["total"] == 2
    # the fork goes its own way from step 2; its sibling and the original do not move
    assert _call(client, first, "return_book", loan_id="L0004")["step"] == 3
    assert _state(client, second) == {"step": 2, "state": states[2]}
    assert _state(client, sid) == {"step": 4, "state": states[4]}
    assert client.post(f"/v1/sessions/{first}/score").json()["reward"] is not None
    initial = client.post(f"/v1/sessions/{sid}/fork", json={"step": 0})
    assert _state(client, initial.json()["session_ids"][0]) == {"step": 0, "state": states[0]}


def test_a_future_or_negative_step_is_a_422_naming_step(client: httpx.Client) -> None:
    sid, _ = _episode(client)
    for step in (5, -1):
        for answer in (client.post(f"/v1/sessions/{sid}/fork", json={"step": step}),
                       client.get(f"/v1/sessions/{sid}/state", params={"step": step})):
            assert answer.status_code == 422, answer.text
            body = answer.json()
            fields = [e["field"] for e in body.get("errors", [])] + [body.get("field")]
            assert "step" in fields, body


def test_a_step_that_does_not_repeat_itself_is_refused_naming_it(client: httpx.Client) -> None:
    """A past state that must be rebuilt by running the steps again (the steps stored whole
    states) is refused when a step answers otherwise the second time."""
    added = client.post("/v1/environments", json={"env_id": "dice_rewind", "class_name": "SharedDice",
                                                  "code": RANDOM})
    assert added.status_code in (200, 201), added.text
    sid = client.post("/v1/sessions", json={"env_id": "dice_rewind"}).json()["session_id"]
    _call(client, sid, "roll")
    _call(client, sid, "roll")
    answer = client.post(f"/v1/sessions/{sid}/fork", json={"step": 1})
    assert answer.status_code == 409, answer.text
    assert answer.json()["field"] == "step" and "step 1" in answer.json()["detail"]
    assert client.get("/v1/sessions").json()["total"] >= 1
    assert _state(client, sid, 0)["state"] == {"rolls": [], "also": {"$ref": "/rolls"}}  # nothing to replay


def test_a_past_state_kept_as_parts_needs_no_replay(client: httpx.Client) -> None:
    """The steps of a tree state record the parts they changed: the state after step k is added
    up from them, exactly, even for an environment that would not repeat itself."""
    added = client.post("/v1/environments", json={"env_id": "dice_parts", "class_name": "Dice", "code": RANDOM})
    assert added.status_code in (200, 201), added.text
    sid = client.post("/v1/sessions", json={"env_id": "dice_parts"}).json()["session_id"]
    rolls = [_call(client, sid, "roll")["result"] for _ in range(3)]
    assert _state(client, sid, 1)["state"] == {"rolls": rolls[:1]}
    forked = client.post(f"/v1/sessions/{sid}/fork", json={"step": 2, "n": 2})
    assert forked.status_code == 201, forked.text
    first, second = forked.json()["session_ids"]
    assert _state(client, first) == {"step": 2, "state": {"rolls": rolls[:2]}}
    fourth = _call(client, first, "roll")["result"]
    assert _state(client, first)["state"] == {"rolls": [*rolls[:2], fourth]}
    assert _state(client, second)["state"] == {"rolls": rolls[:2]}  # its sibling did not move
    assert _state(client, sid)["state"] == {"rolls": rolls}
    steps = client.get(f"/v1/sessions/{first}/trajectory").json()["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3] and not any(k.startswith("_") for s in steps for k in s)


@pytest.mark.redis
def test_forks_at_past_steps_work_after_a_restart(tmp_path: Path, redis_url: str) -> None:
    prefix = f"eftest-{secrets.token_hex(4)}"
    env = {"ENVFOUNDRY_KEY_PREFIX": prefix}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    first: Server = start_server(tmp_path / "a", redis_url=redis_url, extra_env=env)
    try:
        with first.client() as client:
            sid, states = _episode(client)
    finally:
        first.stop()
    second = start_server(tmp_path / "b", redis_url=redis_url, extra_env=env)
    try:
        with second.client() as client:
            forked = client.post(f"/v1/sessions/{sid}/fork", json={"step": 3}).json()["session_ids"][0]
            assert _state(client, forked) == {"step": 3, "state": states[3]}
    finally:
        second.stop()
        import redis

        store = redis.Redis.from_url(redis_url)
        keys = list(store.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            store.delete(*keys)


BIG_ENTRY = '''
class Big:
    def __init__(self, config=None):
        self.items = {"a": {"text": "x" * 6000, "n": 0}}

    def bump(self) -> int:
        """Count one more."""
        self.items["a"]["n"] += 1
        return self.items["a"]["n"]
'''


def test_a_step_whose_parts_would_pass_the_record_bound_keeps_its_diff_and_is_replayed() -> None:
    """The parts a step changed are kept with its record only while they fit the record bound:
    the diff, arguments and result come first, and a past state is then rebuilt by replaying."""
    server = start_app(extra_env={"ENVFOUNDRY_MAX_RECORD_BYTES": "4096"})
    try:
        with server.client() as client:
            added = client.post("/v1/environments", json={"env_id": "big_entry", "class_name": "Big",
                                                          "code": BIG_ENTRY})
            assert added.status_code in (200, 201), added.text
            sid = client.post("/v1/sessions", json={"env_id": "big_entry"}).json()["session_id"]
            for _ in range(2):
                _call(client, sid, "bump")
            steps = client.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]
            assert steps[0]["diff"]["changed"] == [{"path": "/items/a/n", "old": 0, "new": 1}]
            assert _state(client, sid, 1)["state"]["items"]["a"]["n"] == 1
            forked = client.post(f"/v1/sessions/{sid}/fork", json={"step": 1}).json()["session_ids"][0]
            assert _state(client, forked)["state"]["items"]["a"] == {"text": "x" * 6000, "n": 1}
    finally:
        server.stop()
