"""A long run of create/call/delete cycles leaves the service as it found it.

RSS and open descriptors of the API process, its sandbox workers and every process under them,
and the Redis keys under the server's prefix are measured after a warm-up and after the cycles;
each must end within a fixed margin of where it started. Workers are recycled on the way
(``ENVFOUNDRY_WORKER_MAX_REQUESTS``), so replacement leaks would show too.

The test runs ``ENVFOUNDRY_SOAK_CYCLES`` cycles (2,000 by default, about a minute). Run standalone
for a longer soak and its figures:

    ENVFOUNDRY_SOAK_CYCLES=10000 .venv/bin/python -m tests.service.test_soak
"""

from __future__ import annotations

import os
import re
import secrets
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import ROOT, Server, start_server
from tests.service import proctree

LEDGER = ROOT / "tests" / "fixtures" / "faults"
CYCLES = int(os.environ.get("ENVFOUNDRY_SOAK_CYCLES", "2000"))
WARMUP = 200
CLIENTS = 4
WORKERS = 2
# Low enough that every worker is recycled several times during the default run.
MAX_REQUESTS = 500
# Allocator arenas and caches settle during the warm-up; what is left over this is a leak.
RSS_MARGIN_KIB = 24 * 1024
FD_MARGIN = 8


@dataclass(frozen=True)
class Figures:
    rss_kib: int
    fds: int
    workers: int
    processes: int
    keys: int
    bases: int  # shared initial states: kept until their TTL, not by any one session
    replaced: int  # workers replaced since start (recycled, here)

    def line(self) -> str:
        return (f"RSS {self.rss_kib / 1024:.1f} MiB, {self.fds} fds, {self.workers} workers, "
                f"{self.processes} sandbox processes, {self.keys} Redis keys and {self.bases} shared bases")


def measure(server: Server, store: redis.Redis, prefix: str) -> Figures:
    pid = server.process.pid
    # A worker recycled by the last cycle is replaced in the background: wait for the pool to be whole.
    proctree.wait_until(lambda: len(proctree.workers(pid)) == WORKERS, 30, "every worker slot filled")
    # Deleted sessions' processes end as soon as their worker is idle, which is just after the
    # last answer: count once that is done (the count holds still for a second).
    counts = [len(proctree.descendants(pid))]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (len(counts) < 5 or len(set(counts[-5:])) > 1):
        time.sleep(0.25)
        counts.append(len(proctree.descendants(pid)))
    return Figures(
        rss_kib=proctree.rss_kib(pid),
        fds=proctree.open_descriptors(pid),
        workers=len(proctree.workers(pid)),
        processes=len(proctree.descendants(pid)),
        # (not the shared bases, nor the catalog's records and their byte count: the versions
        # sessions started on are kept, once each)
        keys=sum(1 for key in store.scan_iter(match=f"{prefix}:*", count=1000)
                 if not key.startswith((f"{prefix}:base:".encode(), f"{prefix}:catalog:".encode()))
                 and not key.endswith(b":record-bytes")),
        bases=sum(1 for _ in store.scan_iter(match=f"{prefix}:base:*", count=1000)),
        replaced=replacements(server),
    )


def replacements(server: Server) -> int:
    with server.client() as http:
        found = re.search(r"^envfoundry_sandbox_worker_replacements (\S+)$", http.get("/metrics").text, re.MULTILINE)
    assert found is not None
    return int(float(found.group(1)))


def cycle(http: httpx.Client, value: int) -> None:
    created = http.post("/v1/sessions", json={"env_id": "ledger"})
    assert created.status_code == 201, created.text
    sid = created.json()["session_id"]
    called = http.post(f"/v1/sessions/{sid}/calls", json={"name": "add", "arguments": {"value": value}})
    assert called.status_code == 200 and called.json()["ok"], called.text
    assert http.delete(f"/v1/sessions/{sid}").status_code == 204


def run_cycles(server: Server, count: int) -> None:
    def client_loop(offset: int) -> None:
        with server.client() as http:
            for value in range(offset, count, CLIENTS):
                cycle(http, value)

    with ThreadPoolExecutor(CLIENTS) as clients:
        for done in [clients.submit(client_loop, offset) for offset in range(CLIENTS)]:
            done.result()


def soak(tmp: Path, redis_url: str, prefix: str, cycles: int) -> tuple[Figures, Figures, float]:
    """Warm up, measure, run ``cycles`` cycles, measure again; the seconds the cycles took."""
    env = {"ENVFOUNDRY_KEY_PREFIX": prefix, "ENVFOUNDRY_WORKER_MAX_REQUESTS": str(MAX_REQUESTS)}
    server = start_server(tmp, redis_url=redis_url, catalogs=(LEDGER,), workers=WORKERS, extra_env=env)
    store = redis.Redis.from_url(redis_url)
    try:
        run_cycles(server, WARMUP)
        before = measure(server, store, prefix)
        started = time.monotonic()
        run_cycles(server, cycles)
        took = time.monotonic() - started
        return before, measure(server, store, prefix), took
    finally:
        server.stop()
        store.close()


@pytest.mark.timeout(max(300, CYCLES // 10))
def test_create_call_delete_cycles_leave_memory_descriptors_workers_and_keys_flat(
        tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    before, after, took = soak(tmp_path, redis_url, key_prefix, CYCLES)
    print(f"\n{CYCLES} cycles in {took:.1f} s\n  before: {before.line()}\n  after:  {after.line()}")
    assert after.rss_kib - before.rss_kib <= RSS_MARGIN_KIB, (before, after)
    assert abs(after.fds - before.fds) <= FD_MARGIN, (before, after)
    assert after.workers == before.workers == WORKERS
    # (a worker past its request count is recycled once it holds no live session: between cycles)
    assert after.replaced >= before.replaced + WORKERS, (before, after)
    # a worker recycled near the end may not have started its environment host yet: fewer, never more
    assert after.processes <= before.processes, (before, after)
    assert before.keys == 0 and after.keys == 0, "deleted sessions left keys behind"
    # every cycle starts from the same initial state: one base, shared and refreshed, never more
    assert before.bases == after.bases == 1, (before, after)


def main() -> int:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"eftest-soak-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory() as folder:
        try:
            before, after, took = soak(Path(folder), url, prefix, CYCLES)
        finally:
            store = redis.Redis.from_url(url)
            keys = list(store.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                store.delete(*keys)
    print(f"{CYCLES} create/call/delete cycles ({CLIENTS} clients, {WORKERS} workers recycled every "
          f"{MAX_REQUESTS} requests) in {took:.1f} s ({CYCLES / took:.0f} cycles/s)")
    print(f"before: {before.line()}")
    print(f"after:  {after.line()}")
    print(f"RSS {(after.rss_kib - before.rss_kib) / 1024:+.1f} MiB, fds {after.fds - before.fds:+d}, "
          f"workers {after.workers - before.workers:+d}, keys {after.keys - before.keys:+d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
