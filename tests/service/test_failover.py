"""kill -9 of the API process that took a call: the client retries on another replica with its key."""

from __future__ import annotations

import secrets
import signal
import threading
import time

import httpx
import pytest

from tests.conftest import Server
from tests.service.test_api import state

pytestmark = pytest.mark.redis

SLOW = '''
import time


class Counter:
    def __init__(self):
        self.count = 0

    def slow_increment(self, seconds: float = 3.0) -> int:
        """Work a while, then count one."""
        time.sleep(seconds)
        self.count += 1
        return self.count
'''



def test_a_call_cut_off_by_kill_9_is_applied_once_on_the_retry(replicas: tuple[Server, Server]) -> None:
    first, second = replicas
    env_id = f"counter-{secrets.token_hex(3)}"
    with first.client() as a, second.client(timeout=120) as b:
        assert a.post("/v1/environments", json={"env_id": env_id, "class_name": "Counter",
                                                "code": SLOW}).status_code == 201
        sid = a.post("/v1/sessions", json={"env_id": env_id}).json()["session_id"]
        key = {"Idempotency-Key": secrets.token_hex(8)}
        body = {"name": "slow_increment", "arguments": {"seconds": 3.0}}
        outcome: dict[str, object] = {}

        def first_attempt() -> None:
            try:
                outcome["response"] = a.post(f"/v1/sessions/{sid}/calls", json=body, headers=key)
            except httpx.HTTPError as exc:
                outcome["error"] = exc

        attempt = threading.Thread(target=first_attempt)
        attempt.start()
        time.sleep(1.0)  # the call is running in A's sandbox
        first.process.send_signal(signal.SIGKILL)
        attempt.join(30)
        assert "error" in outcome, "the replica was killed mid-call, so the first attempt has no answer"

        retried = b.post(f"/v1/sessions/{sid}/calls", json=body, headers=key)
        assert retried.status_code == 200, retried.text
        assert retried.json()["ok"] is True and retried.json()["result"] == 1
        again = b.post(f"/v1/sessions/{sid}/calls", json=body, headers=key)
        assert again.json() == retried.json() and again.headers["Idempotent-Replayed"] == "true"
        trajectory = b.get(f"/v1/sessions/{sid}/trajectory").json()
        assert trajectory["total"] == 1 and trajectory["steps"][0]["result"] == 1
        assert state(b, sid)["state"]["count"] == 1
