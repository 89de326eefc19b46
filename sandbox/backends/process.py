"""The process backend: each worker is a local OS process that confines itself.

When the service runs as root, each worker gets a uid of its own (see
``UidAllocator``), which also makes the kernel's per-uid process limit a
per-worker one, and a memory cgroup of its own named after that uid (see
``memcg``), which counts the memory address-space limits do not.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import sys
from pathlib import Path

from sandbox.backends import memcg
from sandbox.pool.worker import Channel, worker_memory_mb
from sandbox.wire.limits import Limits
from sandbox.wire.protocol import HEADER, frame_length

WORKER = Path(__file__).resolve().parents[1] / "worker" / "main.py"
# Nothing of the service's environment (REDIS_URL, API keys) reaches a worker.
WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": "/tmp", "HOME": "/tmp"}
UID_SPAN = 4096  # workers' uids are taken from base .. base + UID_SPAN - 1


class ProcessChannel:
    def __init__(self, process: asyncio.subprocess.Process, cgroup: str | None = None,
                 lend: socket.socket | None = None) -> None:
        self.process = process
        self.cgroup = cgroup
        self.lend = lend  # where the worker hands over the pipes of the sessions it keeps
        assert process.stdin is not None and process.stdout is not None
        self._writer = process.stdin
        self._reader = process.stdout

    async def send(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def receive(self) -> bytes:
        header = await self._reader.readexactly(HEADER.size)
        return await self._reader.readexactly(frame_length(header))

    async def kill(self) -> None:
        if self.lend is not None:
            self.lend.close()
        if self.process.returncode is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass
        await self.process.wait()
        if self.cgroup:
            # The worker's namespace dies with it (parent-death signal), a moment later.
            for _ in range(50):
                if memcg.remove(self.cgroup):
                    break
                await asyncio.sleep(0.02)


class UidAllocator:
    """Hands each worker slot a uid no other worker on this host holds.

    Several services (replicas, test runs) may share a host; the kernel counts
    processes per uid, so a shared uid would let one service's workers use up
    another's process limit. A uid is held by an flock on a file named after
    it, which the kernel releases when this process dies, however it dies.
    """

    def __init__(self, base: int, span: int = UID_SPAN, folder: str = "/run/lock/envfoundry-uids") -> None:
        self.base = base
        self.span = span
        self.folder = folder
        self.held: dict[int, tuple[int, int]] = {}  # slot -> (uid, fd)
        self._recent: set[int] = set()  # handed out lately: prefer others while their zombies clear

    def uid_for(self, slot: int) -> int:
        """A fresh uid for ``slot``: a replaced worker's forks may linger as zombies under the old one."""
        if slot in self.held:
            os.close(self.held.pop(slot)[1])
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        for uid in sorted(range(self.base, self.base + self.span), key=lambda u: u in self._recent):
            fd = os.open(os.path.join(self.folder, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if _uid_has_processes(uid):
                # Left over from a service that was killed: its workers may
                # linger as zombies, which still count against the limit.
                os.close(fd)
                continue
            self.held[slot] = (uid, fd)
            self._recent.add(uid)
            if len(self._recent) > self.span // 2:
                self._recent.clear()
            return uid
        raise RuntimeError(f"no free sandbox uid in {self.base}..{self.base + self.span - 1}")

    def release(self) -> None:
        for _, fd in self.held.values():
            os.close(fd)
        self.held.clear()


def _uid_has_processes(uid: int) -> bool:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as status:
                for line in status:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            return True
                        break
        except OSError:
            continue
    return False


class ProcessBackend:
    name = "process"

    def __init__(self, python: str | None = None, uid_base: int = 61000, contain: bool = True) -> None:
        self.python = python or sys.executable
        self.uids = UidAllocator(uid_base)
        # Off only for debugging on hosts without namespaces; the pool then logs every missing primitive.
        self.contain = contain
        self.memory_groups, self.memory_missing = memcg.find() if contain else (None, "confinement is off")

    async def spawn(self, slot: int, limits: Limits) -> Channel:
        uid = self.uids.uid_for(slot) if os.geteuid() == 0 else os.getuid()
        cgroup, why_not = None, self.memory_missing
        if self.memory_groups is not None:
            try:
                cgroup = memcg.prepare(self.memory_groups, f"envfoundry-worker-{uid}",
                                       worker_memory_mb(limits) << 20)
            except OSError as exc:
                why_not = f"cannot make a memory cgroup for the worker ({exc})"
        # The worker hands the pipes of the sessions it keeps over this socket, so calls on them
        # go from the service straight to their process (see ``sandbox.lane``).
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        try:
            process = await self._start(uid, cgroup, why_not, limits, theirs.fileno())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return ProcessChannel(process, cgroup, ours)

    async def _start(self, uid: int, cgroup: str | None, why_not: str, limits: Limits,
                     lend_fd: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            # (no -E: the environment is exactly WORKER_ENV, and it carries PYTHONHASHSEED)
            self.python, "-S", "-s", "-B", str(WORKER),
            "--uid", str(uid), "--gid", str(uid), *limits.worker_flags(),
            *(("--cgroup", cgroup) if cgroup else ("--cgroup-missing", why_not)),
            *(() if self.contain else ("--no-contain",)),
            "--lend-fd", str(lend_fd),
            pass_fds=(lend_fd,),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={**WORKER_ENV, "PYTHONHASHSEED": str(limits.hash_seed)},
            cwd="/",
            limit=1 << 20,
        )

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self.uids.release()
