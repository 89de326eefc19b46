"""One sandbox worker as the pool holds it: the backend's channel to it and what the pool knows of it.

A backend only knows how to start one worker (a process, a container) and hand back a
``Channel``; ``spawn`` reads the worker's hello from it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandbox import lane
from sandbox.errors import WorkerLost
from sandbox.wire import protocol
from sandbox.wire.limits import Limits

# The worker enforces call timeouts itself; this margin only catches a worker that hangs.
GUARD_MARGIN = 5.0
# Memory a worker may use beyond the per-call limit and its live sessions (itself, its
# environment hosts, the fork's copy).
WORKER_MEMORY_OVERHEAD_MB = 128
# The least a worker's live sessions get when the machine's memory is shared out among workers.
MIN_RESIDENT_MB = 256
# How a worker's channel fails when the worker is gone (a closed transport raises RuntimeError).
LOST = (protocol.ProtocolError, OSError, EOFError, asyncio.IncompleteReadError, RuntimeError)


def resident_share(limits: Limits, workers: int) -> Limits:
    """``limits`` with ``resident_memory_mb`` set: when it is -1, half the memory this service may
    use (the machine's, or its own memory cgroup's limit if lower), shared among ``workers``, and
    at least ``MIN_RESIDENT_MB`` each. The other half is the service's, Redis's and the calls'."""
    if limits.resident_memory_mb >= 0:
        return limits
    share = usable_memory_mb() // 2 // max(1, workers)
    return dataclasses.replace(limits, resident_memory_mb=max(MIN_RESIDENT_MB, share))


def usable_memory_mb() -> int:
    """The machine's memory, or this process's memory cgroup limit (v2 or v1) if lower, in MB."""
    found = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/self/cgroup") as listing:
            groups = dict(line.rstrip("\n").split(":", 2)[1:] for line in listing)
    except (OSError, ValueError):
        groups = {}
    candidates = []
    if "" in groups:
        candidates.append(f"/sys/fs/cgroup{groups['']}/memory.max")
    for controllers, path in groups.items():
        if "memory" in controllers.split(","):
            candidates.append(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
    for candidate in candidates:
        try:
            with open(candidate) as limit:
                text = limit.read().strip()
        except OSError:
            continue
        if text.isdigit():
            found = min(found, int(text))
    return found >> 20


def worker_memory_mb(limits: Limits) -> int:
    """The size of one worker's memory cgroup or container: one call at its limit, the machinery,
    and ``resident_memory_mb`` for live sessions. The worker measures what the group holds after
    every request and ends the least recently used live sessions while less than one call's limit
    is left, so a call never meets a full group because of other sessions."""
    return limits.memory_mb + WORKER_MEMORY_OVERHEAD_MB + limits.resident_memory_mb


class Channel(Protocol):
    """One running worker as seen by the pool."""

    async def send(self, data: bytes) -> None: ...

    async def receive(self) -> bytes: ...

    async def kill(self) -> None: ...


class Backend(Protocol):
    name: str

    async def start(self) -> None:
        """Prepare the backend (e.g. remove what a crashed earlier run left)."""

    async def spawn(self, slot: int, limits: Limits) -> Channel: ...

    async def close(self) -> None: ...


@dataclass
class Worker:
    slot: int
    channel: Channel
    containment: dict[str, Any]
    loaded: set[str] = field(default_factory=set)
    requests: int = 0
    # Where it lends the processes of the sessions it keeps (see ``sandbox.lane``), and its /tmp.
    lend: socket.socket | None = None
    tmp: lane.Tmp | None = None
    unprepared: bool = False  # it has hosts without a ready fork: ask it to make them when idle
    touched: set[str] = field(default_factory=set)  # sessions called straight since its last request
    served: float = 0.0  # when it last served a request (and measured its memory)
    # It asks for a template's config when it must build it (``answers.NEED_CONFIG``): requests
    # naming a template go to it without one. A worker of an older image would build from none.
    asks_config: bool = False


@dataclass
class Ending:
    """What a worker must end before its next request: live sessions, and whole environments."""

    sessions: set[str] = field(default_factory=set)
    envs: set[str] = field(default_factory=set)


@dataclass
class WorkerMemory:
    """What a worker last said of its memory (see ``sandbox.worker.runtime.Runtime.memory``)."""

    live: int = 0
    templates: int = 0  # initial states kept built (see ``WorkerPool.init_state``)
    live_bytes: int = 0
    used: int | None = None
    limit: int | None = None
    evicted: int = 0  # live sessions ended for room, over every worker that held the slot


async def spawn(backend: Backend, slot: int, limits: Limits) -> Worker:
    """Start a worker in ``slot`` and read its hello: what confinement it applied, and whether it
    lends its sessions' processes (then the descriptor of its /tmp comes first, where it has one).

    Raises:
        WorkerLost: it did not say hello in time.
    """
    channel = await backend.spawn(slot, limits)
    try:
        hello = protocol.decode_body(await asyncio.wait_for(channel.receive(), limits.load_timeout + 20))
    except (TimeoutError, protocol.ProtocolError, OSError, EOFError) as exc:
        await channel.kill()
        raise WorkerLost(f"worker {slot} did not start: {exc!r}") from exc
    worker = Worker(slot=slot, channel=channel, containment=hello.get("containment", {}),
                    asks_config=hello.get("asks_config") is True)
    sock = getattr(channel, "lend", None)
    if hello.get("lends") is True and sock is not None:
        worker.lend = sock
        if hello.get("tmp") is True:  # (sent before the hello, so it is there already)
            fds = lane.take(sock, 1)
            if fds is None:
                worker.lend = None  # it cannot be called straight: /tmp could not be emptied
            else:
                worker.tmp = lane.Tmp(fds[0], list(worker.containment.get("preserve") or []),
                                      int(worker.containment.get("uid", -1)))
    return worker
