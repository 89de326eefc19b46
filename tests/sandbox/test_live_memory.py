"""Live sessions are budgeted by the memory they really hold, measured from the worker's cgroup.

A live session over a real benchmark's 3 MB database holds about 50 MB; sizing workers by an
assumed few MB per session let the kernel's OOM killer take running calls and whole workers.
Under pressure the least recently used live sessions now go cold instead (their next call
rebuilds them from the stored state), and no call fails for another session's memory.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from sandbox.pool.calls import EnvCode
from sandbox.pool.requests import WorkerPool
from sandbox.pool.worker import MIN_RESIDENT_MB, resident_share, usable_memory_mb, worker_memory_mb
from sandbox.wire.limits import Limits
from tests.sandbox.calls import session_call

pytestmark = pytest.mark.anyio

# About 1.3 MB of records (~25 MB live), built by the class itself so that tests need not send them.
DATABASE = '''
class Database:
    def __init__(self, config=None):
        self.records = {f"r{i:05d}": {"name": "x" * 120, "n": i, "tags": ["a", "b"]} for i in range(8000)}

    def read(self, key: str) -> dict:
        return self.records[key]

    def write(self, key: str, n: int) -> dict:
        self.records[key] = {"name": "y", "n": n, "tags": []}
        return {"success": True}
'''
ENV = EnvCode("live-memory-db", "live_memory_db", "Database", DATABASE)


async def _play(pool: WorkerPool, states: dict[str, str], session: str, step: int) -> None:
    async def stored() -> str:
        return states[session]

    read = await session_call(pool, ENV, session, step, stored, "read", {"key": "r00007"})
    assert read.ok, read.error
    wrote = await session_call(pool, ENV, session, step + 1, stored, "write", {"key": "r00008", "n": step})
    assert wrote.ok, wrote.error
    assert wrote.state is not None
    states[session] = wrote.state


async def test_under_memory_pressure_the_least_recently_used_live_sessions_go_cold(pool_factory: Any) -> None:
    async with pool_factory(size=1, memory_mb=128, resident_memory_mb=64, call_timeout=10.0) as pool:
        states: dict[str, str] = {}
        sessions = [f"s{i}" for i in range(10)]
        for session in sessions:
            states[session] = await pool.init_state(ENV, {}, session=session)
        for round_ in range(2):  # every call succeeds, those on cold sessions after a rebuild
            for session in sessions:
                await _play(pool, states, session, 2 * round_)
        (memory,) = (await pool.measure()).values()
        assert pool.replaced == 0
        assert memory.limit is not None and memory.used is not None and memory.used < memory.limit
        assert memory.evicted > 0 and 0 < memory.live < len(sessions), memory
        assert pool.rebuilt_calls > 0


def test_by_default_live_sessions_share_half_the_memory_the_service_may_use() -> None:
    """A batch's live sessions go cold under real memory pressure, not at a fixed figure: unset,
    each worker's share is half the machine's memory (or the service's cgroup limit) over the
    workers; a value set is kept as it is."""
    usable = usable_memory_mb()
    assert 0 < usable <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    assert Limits().resident_memory_mb == -1
    for workers in (1, 2, 8):
        share = resident_share(Limits(), workers).resident_memory_mb
        assert share == max(MIN_RESIDENT_MB, usable // 2 // workers)
        assert worker_memory_mb(resident_share(Limits(), workers)) == Limits().memory_mb + 128 + share
    assert resident_share(Limits(resident_memory_mb=300), 2).resident_memory_mb == 300
    assert resident_share(Limits(resident_memory_mb=0), 2).resident_memory_mb == 0  # (nothing kept live)
    assert resident_share(Limits(), 100_000).resident_memory_mb == MIN_RESIDENT_MB


def test_what_a_group_holds_is_its_usage_less_the_page_cache_it_could_drop(tmp_path: Any) -> None:
    from sandbox.worker.memory import Gauge

    (tmp_path / "memory.current").write_text("10000000\n")
    (tmp_path / "memory.max").write_text("max\n")
    stat = "anon 123\nfile 4000000\nkernel 7\nshmem 1000000\nfile_mapped 99\nshmem_thp 5\n"
    (tmp_path / "memory.stat").write_text(stat)
    gauge = Gauge.of_group(str(tmp_path))
    assert gauge is not None and gauge.limit() is None
    assert gauge.used() == 10_000_000 - (4_000_000 - 1_000_000)  # file pages but shared memory
    (tmp_path / "memory.stat").write_text("shmem 1000000\nanon 5")  # no file pages: nothing to drop
    assert gauge.used() == 10_000_000
    (tmp_path / "memory.stat").write_text("file 12000000")  # more cache than usage: never below 0
    assert gauge.used() == 0
