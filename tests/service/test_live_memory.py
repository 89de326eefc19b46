"""Live sessions over a real benchmark-sized database, through the API, with default settings.

A 3 MB database (the size of tau-bench's airline database) makes a live session hold ~50 MB.
Created, called and deleted 20 at a time, repeatedly, no call may fail, no worker may be lost,
and once the sessions are deleted their processes are gone and the workers' memory is back.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from sandbox.pool.requests import INITIAL_CACHE_BYTES
from sandbox.pool.workers import PING_EVERY
from tests.conftest import start_server
from tests.in_process import start_app
from tests.service.test_observability import sample

DATABASE = '''
class Airline:
    """Flights and reservations, about 3 MB of JSON."""

    def __init__(self, config=None):
        self.reservations = {
            f"R{i:05d}": {"user": f"user_{i % 997}", "flights": [{"number": f"HAT{i % 300:03d}", "date":
                          "2024-05-01", "price": i % 500}], "status": "confirmed", "note": "x" * 60}
            for i in range(20000)
        }

    def get_reservation(self, reservation_id: str) -> dict:
        """Look a reservation up.

        Args:
            reservation_id: its id
        """
        return self.reservations[reservation_id]

    def cancel_reservation(self, reservation_id: str) -> dict:
        """Cancel a reservation.

        Args:
            reservation_id: its id
        """
        self.reservations[reservation_id]["status"] = "cancelled"
        return {"success": True}
'''
ROUNDS, SESSIONS = 2, 20


def _live_and_memory(client: httpx.Client, workers: int) -> tuple[float, float, float]:
    text = client.get("/metrics").text
    return (sum(sample(text, "envfoundry_sandbox_live_sessions", worker=str(w)) for w in range(workers)),
            sum(sample(text, "envfoundry_sandbox_worker_memory_bytes", worker=str(w)) for w in range(workers)),
            sample(text, "envfoundry_sandbox_worker_replacements"))


def _settled(client: httpx.Client, workers: int) -> tuple[float, float, float]:
    """The figures once every deleted session's process is gone. Idle workers report when the pool
    pings them (every PING_EVERY seconds), so the memory is read once a ping has passed since."""
    deadline = time.monotonic() + 30
    while True:
        live, memory, replaced = _live_and_memory(client, workers)
        if live == 0 and memory > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    time.sleep(PING_EVERY + 1)
    return _live_and_memory(client, workers)


def _episode(client: httpx.Client, n: int) -> str:
    created = client.post("/v1/sessions", json={"env_id": "airline_3mb", "init_config": {}})
    assert created.status_code == 201, created.text
    sid = created.json()["session_id"]
    read = client.post(f"/v1/sessions/{sid}/calls", json={"name": "get_reservation",
                                                          "arguments": {"reservation_id": f"R{n:05d}"}})
    assert read.status_code == 200 and read.json()["ok"], read.text
    wrote = client.post(f"/v1/sessions/{sid}/calls", json={"name": "cancel_reservation",
                                                           "arguments": {"reservation_id": f"R{n:05d}"}})
    assert wrote.status_code == 200 and wrote.json()["ok"], wrote.text
    return sid


def test_sessions_over_a_3mb_database_end_with_their_sessions_and_give_their_memory_back() -> None:
    workers = 2
    server = start_app(workers=workers)
    try:
        with server.client(timeout=120) as client:
            added = client.post("/v1/environments", json={"env_id": "airline_3mb", "class_name": "Airline",
                                                          "code": DATABASE})
            assert added.status_code == 201, added.text
            # Every worker loads the class and builds the database's template once, the machinery that
            # stays: a new session goes to the worker holding fewest live, so one each while both live.
            warm = [_episode(client, n) for n in range(workers)]
            for sid in warm:
                assert client.delete(f"/v1/sessions/{sid}").status_code == 204
            live, start, _ = _settled(client, workers)
            assert live == 0 and start > 0
            for round_ in range(ROUNDS):
                with ThreadPoolExecutor(2) as pool:  # two at a time, as a benchmark harness runs them
                    numbers = range(round_ * SESSIONS, (round_ + 1) * SESSIONS)
                    sids = list(pool.map(lambda n: _episode(client, n), numbers))
                for sid in sids:
                    assert client.delete(f"/v1/sessions/{sid}").status_code == 204
            live, end, replaced = _settled(client, workers)
            assert live == 0, "deleted sessions kept their processes"
            assert replaced == 0
            # what is left is the machinery's own: within 16 MB a worker of where it started
            assert end <= start + workers * (16 << 20), (start, end)
    finally:
        server.stop()


LARGE = '''
class Large:
    """About 15 MB of state."""

    def __init__(self, config=None):
        mark = str((config or {}).get("mark", "v"))
        self.blob = {f"k{i:06d}": mark * 140 for i in range(95000)}

    def touch(self, key: str) -> dict:
        """Change one entry.

        Args:
            key: which
        """
        self.blob[key] = "w"
        return {"success": True}
'''


def _resident_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))


def test_the_api_process_gives_memory_back_when_large_sessions_end(tmp_path: Path) -> None:
    """Eight 15 MB sessions of distinct initial states (memory store: the states live in the API
    process) and their views: once deleted, the process is back within 48 MB of where it started,
    besides the pool's bounded cache of initial states (it stayed ~350 MB larger while the
    allocator kept large blocks in its heap). Sessions of one initial state share it (a base)."""
    server = start_server(tmp_path, workers=2)
    try:
        with server.client(timeout=120) as client:
            added = client.post("/v1/environments", json={"env_id": "large", "class_name": "Large", "code": LARGE})
            assert added.status_code == 201, added.text
            start = _resident_mb(server.process.pid)
            sids = []
            for mark in "abcdefgh":  # eight initial states: sessions of one would share it
                created = client.post("/v1/sessions", json={"env_id": "large", "init_config": {"mark": mark}})
                assert created.status_code == 201, created.text
                sid = created.json()["session_id"]
                sids.append(sid)
                touched = client.post(f"/v1/sessions/{sid}/calls", json={"name": "touch",
                                                                         "arguments": {"key": "k000001"}})
                assert touched.json()["ok"], touched.text
                assert client.get(f"/v1/sessions/{sid}/state").status_code == 200
            held = _resident_mb(server.process.pid)
            for sid in sids:
                assert client.delete(f"/v1/sessions/{sid}").status_code == 204
            after = _resident_mb(server.process.pid)
            assert held > start + 100, (start, held)  # the states were really held here
            # (besides the pool's bounded cache of initial states, kept for the next creates)
            assert after <= start + 48 + (INITIAL_CACHE_BYTES >> 20), (start, held, after)
    finally:
        server.stop()
