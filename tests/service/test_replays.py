"""Past states rebuilt by running steps again: kept once rebuilt, charged to the tenant and bounded
per tenant, and a sandbox that could not run a step again is a 503, never a 409 about the
environment. The real app (in this process; a server process where a worker is killed), real
sandbox workers, both stores."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox.pool.calls import CallOutcome
from service.api.auth import new_key
from service.engine.replays import ReplayBudget, ReplayCache
from service.engine.rewind import _difference
from service.errors import QuotaExceeded
from tests.conftest import Server, keyed_server, start_server
from tests.in_process import AppServer, start_app
from tests.service import proctree
from tests.service.test_api import new_session, problem
from tests.service.test_faults import InFlight
from tests.service.test_observability import sample

# Its entries are reached twice: not a tree, so every step stores a whole state and a past state
# is rebuilt by running the steps again (nothing to add up from step records, see service/engine/past.py).
SHARED = '''
import time


class SharedLedger:
    def __init__(self, config=None):
        self.entries = []
        self.also = self.entries

    def slow_add(self, value: int) -> int:
        """Append a value, taking half a second.

        Args:
            value: The value to append.
        """
        time.sleep(0.5)
        self.entries.append(value)
        return len(self.entries)

    def gated_add(self, value: int, wait: float = 50.0) -> int:
        """Append a value once the test sends SIGUSR1 (see tests/fixtures/faults/ledger).

        Args:
            value: The value to append.
            wait: Seconds to wait for the gate before giving up.
        """
        import signal

        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        signal.signal(signal.SIGUSR1, lambda signum, frame: None)
        if signal.sigtimedwait({signal.SIGUSR1}, wait) is None:
            raise RuntimeError("the gate was never opened")
        self.entries.append(value)
        return len(self.entries)
'''


def _add_environment(client: httpx.Client) -> None:
    added = client.post("/v1/environments", json={"env_id": "shared_ledger", "class_name": "SharedLedger",
                                                  "code": SHARED})
    assert added.status_code in (200, 201), added.text


def _call(client: httpx.Client, sid: str, name: str, value: int) -> None:
    answer = client.post(f"/v1/sessions/{sid}/calls", json={"name": name, "arguments": {"value": value}})
    assert answer.status_code == 200 and answer.json()["ok"], answer.text


def _metrics(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {**{outcome: sample(text, "envfoundry_replays_total", outcome=outcome)
               for outcome in ("replayed", "cached", "refused", "failed")},
            "seconds": sample(text, "envfoundry_replay_seconds_total")}


class Keys:
    def __init__(self) -> None:
        self.a, line_a = new_key("tenant-a", ["run", "admin"])
        self.b, line_b = new_key("tenant-b", ["run", "admin"])
        self.lines = f"{line_a}\n{line_b}\n"


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def budgeted(request: pytest.FixtureRequest, keys: Keys, tmp_path: Path) -> Iterator[AppServer]:
    # one second of replay per tenant and minute: one replay of three half-second steps uses it up
    yield from keyed_server(request, tmp_path, keys.lines, {"ENVFOUNDRY_REPLAY_SECONDS": "1"}, start=start_app)


def _client(server: AppServer, key: str) -> httpx.Client:
    return server.client(headers={"Authorization": f"Bearer {key}"})


def test_a_rebuilt_past_state_is_kept_and_replay_time_is_charged_to_its_tenant(budgeted: AppServer, keys: Keys) -> None:
    with _client(budgeted, keys.a) as a, _client(budgeted, keys.b) as b:
        _add_environment(a)
        sid = new_session(a, env_id="shared_ledger")
        for value in range(1, 5):
            _call(a, sid, "slow_add", value)

        before = _metrics(a)
        shown = a.get(f"/v1/sessions/{sid}/state", params={"step": 3})
        assert shown.status_code == 200, shown.text
        assert shown.json() == {"step": 3, "state": {"entries": [1, 2, 3], "also": {"$ref": "/entries"}}}
        replayed = _metrics(a)
        assert replayed["replayed"] - before["replayed"] == 1
        assert replayed["seconds"] - before["seconds"] >= 1.5  # three steps that each sleep half a second

        again = a.get(f"/v1/sessions/{sid}/state", params={"step": 3})
        assert again.status_code == 200 and again.json() == shown.json()
        cached = _metrics(a)
        assert (cached["replayed"], cached["cached"] - replayed["cached"]) == (replayed["replayed"], 1)
        assert cached["seconds"] == replayed["seconds"]  # nothing run again, nothing charged

        # the tenant owes replay time now: another past state, or a fork there, waits until it is paid
        for refused in (a.get(f"/v1/sessions/{sid}/state", params={"step": 2}),
                        a.post(f"/v1/sessions/{sid}/fork", json={"step": 2})):
            body = problem(refused, 429, "quota-exceeded")
            assert body["quota"] == "replay_seconds" and body["value"] == 1
            assert int(refused.headers["Retry-After"]) >= 1
        assert _metrics(a)["refused"] - before["refused"] == 2
        assert a.get(f"/v1/sessions/{sid}/state", params={"step": 3}).json() == shown.json()  # still kept
        assert a.get(f"/v1/sessions/{sid}/state", params={"step": 0}).status_code == 200  # nothing to replay

        # another tenant's replays are its own
        _add_environment(b)
        other = new_session(b, env_id="shared_ledger")
        for value in (7, 8):
            _call(b, other, "slow_add", value)
        mine = b.get(f"/v1/sessions/{other}/state", params={"step": 1})
        assert mine.status_code == 200, mine.text
        assert mine.json()["state"]["entries"] == [7]


def test_a_worker_lost_during_a_replay_is_a_503_and_the_replay_works_when_retried(tmp_path: Path) -> None:
    server = start_server(tmp_path, workers=1, extra_env={"ENVFOUNDRY_CALL_TIMEOUT": "60"})
    try:
        with server.client() as client:
            _add_environment(client)
            sid = new_session(client, env_id="shared_ledger")
            first = InFlight(lambda: _gated(server, sid))
            os.kill(proctree.wait_for_gate(server.process.pid), proctree.GATE_SIGNAL)
            assert first.result().json()["ok"] is True
            _call(client, sid, "slow_add", 2)

            # the replay of step 1 waits at the gate; its worker is killed there
            replay = InFlight(lambda: _past(server, sid, 1))
            gate = proctree.wait_for_gate(server.process.pid)
            os.kill(proctree.worker_of(server.process.pid, gate), signal.SIGKILL)
            answer = replay.result()
            body = problem(answer, 503, "unavailable")
            assert body["detail"].startswith("the sandbox could not replay step 1: sandbox_error"), body
            assert "Retry-After" in answer.headers
            assert _metrics(client)["failed"] == 1

            retried = InFlight(lambda: _past(server, sid, 1))
            os.kill(proctree.wait_for_gate(server.process.pid), proctree.GATE_SIGNAL)
            shown = retried.result()
            assert shown.status_code == 200, shown.text
            assert shown.json()["state"]["entries"] == [1]
    finally:
        server.stop()


def _gated(server: Server, sid: str) -> httpx.Response:
    with server.client(timeout=90) as http:
        return http.post(f"/v1/sessions/{sid}/calls", json={"name": "gated_add", "arguments": {"value": 1}})


def _past(server: Server, sid: str, step: int) -> httpx.Response:
    with server.client(timeout=90) as http:
        return http.get(f"/v1/sessions/{sid}/state", params={"step": step})


def _outcome(ok: bool, result: Any = None, error: str | None = None) -> CallOutcome:
    return CallOutcome(ok, result, {"type": error, "message": "boom"} if error else None, None,
                       {"added": [], "removed": [], "changed": []})


def test_a_refusal_says_which_way_the_step_went_each_time() -> None:
    succeeded: dict[str, Any] = {"step": 1, "ok": True, "result": 4, "error": None, "diff": {"added": [], "removed": [], "changed": []}}
    failed = {**succeeded, "ok": False, "result": None, "error": {"type": "tool_exception", "message": "no"}}
    assert _difference(succeeded, _outcome(False, error="tool_exception")) == (
        "failed when run again (tool_exception: boom), succeeded the first time: the environment does not repeat "
        "itself")
    assert _difference(failed, _outcome(True, 4)) == (
        "succeeded when run again, failed the first time (tool_exception: no): the environment does not repeat "
        "itself")
    assert _difference(succeeded, _outcome(True, 5)) == (
        "answered 5 when run again, 4 the first time: the environment does not repeat itself")
    assert _difference(succeeded, _outcome(True, 4)) is None


def test_the_cache_of_rebuilt_states_is_bounded_in_entries_and_in_size() -> None:
    cache = ReplayCache(entries=2, size=10)
    def key(step: int) -> tuple[str, str, int, str]:
        return ("t", "ses_1", step, "code")

    cache.put(key(1), "aaaa")
    cache.put(key(2), "bbbb")
    assert cache.get(key(1)) == "aaaa"  # (now the most recently used)
    cache.put(key(3), "cccc")
    assert (cache.get(key(1)), cache.get(key(2)), cache.get(key(3))) == ("aaaa", None, "cccc")
    cache.put(key(4), "dddddddd")
    assert (cache.get(key(1)), cache.get(key(3)), cache.get(key(4))) == (None, None, "dddddddd")
    cache.put(key(5), "x" * 11)  # larger than the whole cache: not kept, nothing dropped for it
    assert (cache.get(key(4)), cache.get(key(5))) == ("dddddddd", None)


@pytest.mark.anyio
async def test_a_tenant_runs_at_most_its_replays_at_once_and_waits_until_what_it_owes_is_paid_back() -> None:
    now = [0.0]
    charged: list[float] = []
    budget = ReplayBudget(6, 1, charged.append, clock=lambda: now[0])  # 6 s a minute, one at a time
    async with budget.turn("a") as turn:
        turn.start()
        with pytest.raises(QuotaExceeded) as busy:
            async with budget.turn("a"):
                pass
        assert (busy.value.extra["quota"], busy.value.extra["value"]) == ("max_tenant_replays", 1)
        async with budget.turn("b"):  # another tenant's replays are its own
            pass
        now[0] += 9  # the replay takes 9 s: 3 s more than the tenant held
    assert charged == [9] and budget.left("a") == -3
    with pytest.raises(QuotaExceeded) as owed:
        async with budget.turn("a"):
            pass
    assert (owed.value.extra["quota"], owed.value.extra["retry_after"]) == ("replay_seconds", 30)
    now[0] += 30.5  # paid back, and half a second more
    async with budget.turn("a"):
        pass  # (a replay refused before it started is charged nothing)
    assert charged == [9]
