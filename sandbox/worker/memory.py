"""What a worker's memory really is: its cgroup's usage and limit, and each live session's share.

The worker budgets its live sessions by what its memory cgroup (process backend) or container
(docker backend) holds, read from the kernel after each request, not by an assumed size per
session: a live session over a 3 MB database holds ~50 MB, one over a 4 KB state ~3 MB. The
files are opened before confinement hides /sys, and read with ``pread`` afterwards.

A session's own share is the resident memory the kernel counts for its process minus the pages
it maps from files (``/proc/<pid>/statm``, readable without access to the process's memory).
Pages still shared with its environment's host count in full here, so the share over-states a
fresh fork; it ranks sessions and feeds the metrics, while eviction follows the cgroup's usage.
Standard library only.
"""

from __future__ import annotations

import os

# cgroup v2, then v1: usage and limit files, and the memory.stat entries for page cache that the
# kernel can drop (file pages but shared memory, which without swap it cannot).
FILES = (("memory.current", "memory.max", "file", "shmem"),
         ("memory.usage_in_bytes", "memory.limit_in_bytes", "total_cache", "total_shmem"))
CONTAINER_GROUPS = ("/sys/fs/cgroup", "/sys/fs/cgroup/memory")
PAGE = os.sysconf("SC_PAGE_SIZE")


class Gauge:
    """Usage and limit of one memory cgroup, through descriptors kept open."""

    def __init__(self, fds: tuple[int, int, int], cache: tuple[str, str]) -> None:
        self.usage_fd, self.limit_fd, self.stat_fd = fds
        self.cache, self.unreclaimable = cache

    @classmethod
    def of_group(cls, path: str) -> Gauge | None:
        """The group at ``path`` (made by the service), or None if it cannot be read."""
        for usage, limit, cache, shmem in FILES:
            opened: list[int] = []
            try:
                for name in (usage, limit, "memory.stat"):
                    opened.append(os.open(os.path.join(path, name), os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                for fd in opened:
                    os.close(fd)
                continue
            return cls((opened[0], opened[1], opened[2]), (cache, shmem))
        return None

    @classmethod
    def of_container(cls) -> Gauge | None:
        for path in CONTAINER_GROUPS:
            gauge = cls.of_group(path)
            if gauge is not None and gauge.limit() is not None:
                return gauge
        return None

    def used(self) -> int:
        """Bytes the group holds that the kernel could not simply drop (page cache aside)."""
        usage = _read(self.usage_fd) or 0
        try:
            stat = b"\n" + os.pread(self.stat_fd, 1 << 16, 0)
        except OSError:
            return usage
        try:  # (two entries of some forty, found rather than the whole file parsed: read after every request)
            droppable = _entry(stat, self.cache) - _entry(stat, self.unreclaimable)
        except ValueError:
            return usage
        return max(0, usage - max(0, droppable))

    def limit(self) -> int | None:
        """The group's limit; None when it has none."""
        value = _read(self.limit_fd)
        return value if value is not None and value < 1 << 60 else None


def _entry(stat: bytes, name: str) -> int:
    """The value of ``name`` in a memory.stat's text (after a newline), 0 if it is not there.
    Raises ValueError if it is no number."""
    key = b"\n" + name.encode() + b" "
    start = stat.find(key)
    if start < 0:
        return 0
    start += len(key)
    end = stat.find(b"\n", start)
    return int(stat[start:] if end < 0 else stat[start:end])


def _read(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def share_of(pid: int) -> int:
    """Bytes of memory process ``pid`` holds that are not file pages (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            fields = statm.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * PAGE
    except (OSError, IndexError, ValueError):
        return 0
