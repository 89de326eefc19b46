"""What the worker reads of its processes in /proc, and the few calls it makes on them.

Any of these processes may be gone by the time it is named (environment code runs in it), so
nothing here raises for one that is. Standard library only.
"""

from __future__ import annotations

import os
import time

from sandbox.worker import polling


def visible() -> list[tuple[int, int]]:
    """(pid, parent pid) of every process this worker can see: its own namespace's."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    found.append((int(entry), int(stat.read().rsplit(")", 1)[1].split()[1])))
            except (OSError, IndexError, ValueError):
                continue
    return found


def children_of(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (one read per thread, no scan of /proc)."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as listing:
                found.extend(map(int, listing.read().split()))
        except (OSError, ValueError):
            continue
    return found


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def kill(pid: int, sig: int) -> None:
    """``os.kill`` for a process that may be gone."""
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def close(fd: int) -> None:
    """``os.close`` for a descriptor that may be closed already (or -1: none)."""
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def reap() -> set[int]:
    """Wait for ended children and orphans (the worker is a subreaper, or PID 1 of its namespace)."""
    reaped: set[int] = set()
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.add(pid)


def write_by(fd: int, data: bytes, deadline: float) -> bool:
    """Write all of ``data`` unless ``deadline`` passes first (a fork that stopped reading)."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    while view:
        wait = deadline - time.monotonic()
        if wait <= 0 or not polling.ready(fd, wait, write=True):
            return False
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue
        except OSError:
            return True  # it is gone; reading its answer tells how it ended
    return True
