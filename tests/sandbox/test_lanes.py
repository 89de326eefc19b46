"""Calls made straight from the service to a kept session's process (``sandbox.lane``): on both
backends a lent session's calls never reach its worker, and the worker's rules still hold (only
that process runs, /tmp is emptied after it, anything unusual is collected by the worker)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest

from sandbox.pool.requests import WorkerPool
from tests.sandbox.test_residents import _session

pytestmark = pytest.mark.anyio


def _worker_requests(pool: WorkerPool) -> int:
    return sum(worker.requests for worker in pool._idle.values())


async def _settled(pool: WorkerPool) -> None:
    """Until every worker is idle (what the pool asks of them between calls is done)."""
    for _ in range(100):
        if len(pool._idle) == pool.size:
            return
        await _pause()


async def test_a_kept_sessions_calls_go_straight_to_its_process(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        stored = await _session(pool, "s1")
        await _settled(pool)
        before = _worker_requests(pool)
        for expected in range(1, 6):
            out = await stored.call(pool, "s1", "increment")
            assert out.ok and out.result == {"success": True, "data": expected}
        assert stored.reads == 0
        assert pool.lane_calls == 5
        await _settled(pool)
        assert _worker_requests(pool) == before  # not one of them went through the worker


async def test_what_a_straight_call_leaves_in_tmp_is_gone_before_any_other_call(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        writer, reader = await _session(pool, "writer"), await _session(pool, "reader")
        await writer.call(pool, "writer", "increment")
        await reader.call(pool, "reader", "increment")
        wrote = await writer.call(pool, "writer", "write_file", path="/tmp/left-behind")
        assert wrote.ok, wrote.error
        seen = await reader.call(pool, "reader", "read_file", path="/tmp/left-behind")
        assert not seen.ok and "No such file" in seen.error["message"]
        assert pool.lane_calls == 4


async def test_a_straight_call_that_overruns_is_stopped_and_the_session_rebuilt(pool_factory: Any) -> None:
    async with pool_factory(size=1, call_timeout=1.0) as pool:
        stored = await _session(pool, "s1")
        await stored.call(pool, "s1", "increment")
        out = await stored.call(pool, "s1", "spin")
        assert not out.ok and out.error["type"] == "timeout", out.error
        # the failed call is a step that changed nothing; the next one rebuilds the process
        out = await stored.call(pool, "s1", "increment")
        assert out.ok and out.result == {"success": True, "data": 2}
        assert stored.reads == 1


async def test_a_kept_process_that_died_between_calls_is_collected_and_then_rebuilt(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        stored = await _session(pool, "s1")
        await stored.call(pool, "s1", "increment")
        held = pool._lanes["s1"]
        # Its answer pipe watched as a call that waited for its answer leaves it (watched until it is
        # found readable with no call waiting: a process that ended must not make the loop spin).
        held.watch(asyncio.get_running_loop())
        held.waiter = None
        signal.pidfd_send_signal(held.pidfd, signal.SIGKILL)
        for _ in range(40):
            await _pause()
            if held.watcher is None:
                break
        assert held.watcher is None
        out = await stored.call(pool, "s1", "increment")
        assert not out.ok and out.error["type"] == "resource_limit", out.error  # killed: how the worker saw it end
        out = await stored.call(pool, "s1", "increment")
        assert out.ok and out.result == {"success": True, "data": 2}


async def test_a_deleted_sessions_lent_process_ends(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        stored = await _session(pool, "s1")
        await stored.call(pool, "s1", "increment")
        with open(f"/proc/self/fdinfo/{pool._lanes['s1'].pidfd}") as info:  # (its pid as this process sees it)
            pid = int(next(line.split()[1] for line in info if line.startswith("Pid:")))
        pool.end_session("s1")
        assert "s1" not in pool._lanes
        for _ in range(100):
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except FileNotFoundError:
                break
            await _pause()
        else:
            raise AssertionError(f"the deleted session's process {pid} still runs")
        assert stored.reads == 0


async def test_a_session_whose_process_the_worker_let_go_is_rebuilt_without_an_error(pool_factory: Any) -> None:
    """The worker ends the least recently used live sessions past ``residents``; a lent one among
    them is reported, and its next call rebuilds it from the stored state."""
    async with pool_factory(size=1, residents=1) as pool:
        first, second = await _session(pool, "first"), await _session(pool, "second")
        assert (await second.call(pool, "second", "increment")).ok
        out = await first.call(pool, "first", "increment")
        assert out.ok and out.result == {"success": True, "data": 1}
        assert first.reads == 1


async def test_calls_queued_for_their_sessions_worker_wait_for_it_rather_than_rebuild_elsewhere(
        pool_factory: Any) -> None:
    """Two sessions on one worker, called at once, while another worker idles: each waits its turn
    on its own process (a rebuild elsewhere would cost a fork and a decode, and move it)."""
    import anyio

    async with pool_factory(size=2) as pool:
        sessions = {name: await _session(pool, name) for name in ("a", "b", "c")}
        together = [name for name in sessions if pool._homes[name][0] == pool._homes["a"][0]]
        assert len(together) == 2, pool._homes  # (new sessions go to the worker holding fewest)

        async def calls(name: str) -> None:
            for _ in range(40):
                assert (await sessions[name].call(pool, name, "increment")).ok

        async with anyio.create_task_group() as group:
            for name in together:
                group.start_soon(calls, name)
        assert pool.rebuilt_calls == 0 and all(sessions[name].reads == 0 for name in together)
        assert pool.lane_calls == 80


async def test_a_worker_whose_sessions_are_called_straight_still_measures_its_memory(pool_factory: Any) -> None:
    """It lets live sessions go to keep room for a call only when it serves a request: while its
    sessions are called straight it is asked at least every ``FIT_EVERY``."""
    import time

    from sandbox.pool.workers import FIT_EVERY

    async with pool_factory(size=1) as pool:
        stored = await _session(pool, "s1")
        started, asked = time.monotonic(), []
        while time.monotonic() - started < 2.5 * FIT_EVERY:
            assert (await stored.call(pool, "s1", "increment")).ok
            asked += [worker.served for worker in pool._idle.values() if worker.served > started]
        assert len(set(asked)) >= 2, asked  # (each a request it served: a ping, which measures)
        assert pool.lane_calls > 10 and stored.reads == 0


async def _pause() -> None:
    import anyio

    await anyio.sleep(0.05)


def test_lent_descriptors_are_not_inherited_by_what_the_service_starts() -> None:
    """The pipes and pidfds the service holds are close-on-exec (``socket.recv_fds`` asks for it)."""
    import socket

    from sandbox import lane
    from sandbox.wire import protocol

    ours, theirs = socket.socketpair()
    read, write = os.pipe()
    try:
        socket.send_fds(theirs, [protocol.LEND_MARK], [read, write, read])
        fds = lane.take(ours, 3)
        assert fds is not None
        assert all(not os.get_inheritable(fd) for fd in fds)
        for fd in fds:
            os.close(fd)
    finally:
        for fd in (read, write):
            os.close(fd)
        ours.close()
        theirs.close()


@pytest.mark.parametrize("where", ["tmpfs", "other"])
def test_tmp_is_found_untouched_only_while_nothing_was_added(where: str, tmp_path: Path) -> None:
    """A worker's /tmp is a tmpfs, whose folder size counts its entries: while size and times are
    those of the last look that found it clean, it is taken at its word. Any other folder is looked
    through each time. Either way, an entry added after the last look is found, however soon."""
    from sandbox.lane import Tmp

    folder = Path(tempfile.mkdtemp(dir="/dev/shm")) if where == "tmpfs" else tmp_path / "tmp"
    folder.mkdir(exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        tmp = Tmp(fd, [], os.getuid())
        assert tmp._sized is (where == "tmpfs")
        assert tmp.untouched() and tmp.untouched()
        for name in ("a", "b"):
            (folder / name).write_text("x")
            assert not tmp.untouched()
            (folder / name).unlink()
            assert tmp.untouched()
        (folder / "c").mkdir()
        assert not tmp.untouched()
        (folder / "c").rmdir()
        assert tmp.untouched()
        (folder / "d").write_text("")
        assert not tmp.untouched() and tmp.empty() and tmp.untouched()
        assert not list(folder.iterdir())
    finally:
        os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
