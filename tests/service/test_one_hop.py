"""A call on a session this replica holds is one round trip to the store: no lock, no read, one
commit. What the commit refuses (a step committed elsewhere, a lock held elsewhere, a key used
before) goes the usual way, and nothing is applied twice."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import redis

from tests.conftest import start_server
from tests.in_process import start_app


def _commands(raw: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = raw.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def _spent(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The commands Redis ran between two counts, by name (those it ran at all)."""
    return {name: n for name in after if (n := after[name] - before.get(name, 0))}


def _call(http: httpx.Client, sid: str, key: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return http.post(f"/v1/sessions/{sid}/calls", json={"name": "increment", "arguments": {}}, headers=headers)


def test_calls_on_a_session_this_replica_holds_are_one_redis_round_trip_each(redis_url: str) -> None:
    server = start_app(redis_url=redis_url, workers=1)
    raw = redis.Redis.from_url(redis_url)
    try:
        with server.client() as http:
            sid = http.post("/v1/sessions", json={"env_id": "probe", "init_config": {"counter": 0}}).json()[
                "session_id"]
            before = _commands(raw)
            for step in range(1, 11):  # (the first too: the create left the session's meta here)
                answer = _call(http, sid, key=f"k{step}")
                assert answer.json()["step"] == step and answer.json()["result"]["data"] == step
            after = _commands(raw)
        spent = _spent(before, after)
        # One script per call, the commit. (Redis counts the commands a script runs too: taking the
        # lock would show as SET, reading the meta as HGETALL, either as a second EVALSHA.)
        assert spent.get("evalsha") == 10, spent
        assert "set" not in spent and "hgetall" not in spent, spent
    finally:
        raw.close()
        server.stop()


def test_a_step_committed_by_another_replica_is_seen_and_nothing_is_applied_twice(tmp_path: Path,
                                                                                   redis_url: str) -> None:
    first = start_server(tmp_path, redis_url=redis_url, workers=1)
    second = start_server(tmp_path, redis_url=redis_url, workers=1)
    try:
        with first.client() as one, second.client() as two:
            sid = one.post("/v1/sessions", json={"env_id": "probe", "init_config": {"counter": 0}}).json()[
                "session_id"]
            assert _call(one, sid).json()["result"]["data"] == 1  # the first replica holds it now
            assert _call(two, sid).json()["result"]["data"] == 2  # a step it did not see
            answer = _call(one, sid, key="again")
            assert answer.json()["step"] == 3 and answer.json()["result"]["data"] == 3, answer.text
            # a retry of that call, on the replica that holds the session: the first answer, not a new step
            retried = _call(one, sid, key="again")
            assert retried.headers.get("Idempotent-Replayed") == "true"
            assert retried.json() == answer.json()
            assert _call(one, sid).json()["result"]["data"] == 4
            assert one.get(f"/v1/sessions/{sid}/state").json()["state"]["counter"] == 4
    finally:
        first.stop()
        second.stop()


def _lodged_calls(http: httpx.Client) -> float:
    found = re.search(r'envfoundry_sandbox_session_calls\{instance="lodged"\} (\S+)', http.get("/metrics").text)
    return float(found.group(1)) if found else 0.0


def test_calls_on_a_lodged_session_are_one_redis_round_trip_each(redis_url: str) -> None:
    """A session its worker holds live in a lodge (its call goes through the worker, not straight to
    a process) is held live all the same: no lock and no read before each call."""
    server = start_app(redis_url=redis_url, workers=1, extra_env={"ENVFOUNDRY_RESIDENTS": "1"})
    raw = redis.Redis.from_url(redis_url)
    try:
        with server.client() as http:
            made = [http.post("/v1/sessions", json={"env_id": "probe", "init_config": {"counter": 0}}).json()[
                "session_id"] for _ in range(3)]
            for sid in made:  # one keeps the worker's one session process, the others are lodged
                assert _call(http, sid).json()["result"]["data"] == 1
            lodged_before, before = _lodged_calls(http), _commands(raw)
            for step in range(2, 7):
                for sid in made:
                    answer = _call(http, sid, key=f"{sid}-{step}")
                    assert answer.json()["step"] == step and answer.json()["result"]["data"] == step, answer.text
            after, lodged_after = _commands(raw), _lodged_calls(http)
            assert lodged_after - lodged_before >= 10  # (two sessions' five calls each, at least)
        spent = _spent(before, after)
        assert spent.get("evalsha") == 15, spent
        assert "set" not in spent and "hgetall" not in spent, spent
    finally:
        raw.close()
        server.stop()
