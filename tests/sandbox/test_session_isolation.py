"""A live session is a unit of its own, on every backend: nothing one session's code does reaches
another session's process or the machinery, although all of a worker's processes share its uid.

The attacks are the ones measured against live sessions (as root, process backend): resource
limits, priorities and scheduling set on other processes, signals delivered through a file's
owner, a session made dumpable to read another's memory, and the kernel interfaces that watch or
reach past a process (personality, landlock, inotify, pseudo-terminals, I/O priorities), and what
/proc, /sys and /dev would show of other sessions. And a
session's process ends with the session: when it is deleted, and when its environment is.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from sandbox.pool.calls import EnvCode
from sandbox.pool.requests import WorkerPool
from tests.sandbox.calls import session_call

pytestmark = pytest.mark.anyio

EPERM = 1
EACCES = 13
EINVAL = 22

TENANT = '''
import ctypes
import fcntl
import os
import resource
import signal

libc = ctypes.CDLL(None, use_errno=True)
AT_LOAD = {}


def exists(pid):
    """Whether a process id is taken: all /proc shows environment code (it cannot open anything there)."""
    try:
        os.stat(f"/proc/{pid}")
        return True
    except OSError:
        return False


def others():
    """Every other process this one could name, found as an attacker would, by probing ids (a
    worker's ids are its namespace's or container's own, so they start at 1 and stay close)."""
    me, found, pid, last = os.getpid(), [], 0, 0
    while pid - last < 4096:
        pid += 1
        if exists(pid):
            last = pid
            if pid != me:
                found.append(pid)
    return found


def outcomes(action):
    """What ``action(pid)`` did to every other process this one can see: {outcome: count}."""
    seen = {}
    for pid in others():
        try:
            action(pid)
            outcome = "ok"
        except ProcessLookupError:
            continue  # it ended meanwhile
        except OSError as exc:
            outcome = exc.errno
        seen[str(outcome)] = seen.get(str(outcome), 0) + 1
    return seen


def syscall(number, *args):
    result = libc.syscall(number, *args)
    return [result, ctypes.get_errno() if result < 0 else 0]


def become_dumpable():
    return syscall(157, 4, 1, 0, 0, 0)  # prctl(PR_SET_DUMPABLE, 1)


AT_LOAD["dumpable"] = become_dumpable()  # in the host: every session's process would inherit it


class Tenant:
    def __init__(self):
        self.secret = ""

    def keep(self, secret: str) -> int:
        self.secret = secret
        return os.getpid()

    def whoami(self) -> int:
        return os.getpid()

    def state_of(self, pid: int) -> str:
        return "running" if exists(pid) else "gone"

    def look_around(self, pid: int) -> dict:
        """What /proc, /sys and /dev show of ``pid`` and of the worker: an errno or 'read' each."""
        def opened(path, listing=False):
            try:
                if listing:
                    os.listdir(path)
                else:
                    with open(path, "rb") as source:
                        source.read(64)
                return "read"
            except OSError as exc:
                return exc.errno

        seen = {name: opened(f"/proc/{pid}/{name}") for name in ("status", "stat", "statm", "cmdline", "environ")}
        seen.update({
            "own_status": opened("/proc/self/status"),
            "proc_listing": opened("/proc", listing=True),
            "tasks": opened(f"/proc/{pid}/task", listing=True),
            "worker": opened("/proc/1/status"),
            "meminfo": opened("/proc/meminfo"),
            "cgroups": opened("/sys/fs/cgroup", listing=True),
            "terminals": opened("/dev/pts", listing=True),
            "ptmx": opened("/dev/ptmx"),
            "devices": opened("/dev", listing=True),
            "null": opened("/dev/null"),
            "urandom": opened("/dev/urandom"),
            "python": opened(os.__file__),
        })
        return seen

    def at_load(self) -> dict:
        return AT_LOAD

    def allocate(self, megabytes: int) -> int:
        block = bytearray(megabytes << 20)
        return len(block) >> 20

    def poison_limits(self) -> dict:
        small = 64 << 20
        return {
            "address_space": outcomes(lambda pid: resource.prlimit(pid, resource.RLIMIT_AS, (small, small))),
            "cpu": outcomes(lambda pid: resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1))),
            "own": resource.prlimit(0, resource.RLIMIT_NOFILE)[0] > 0,
        }

    def slow_others(self) -> dict:
        def ioprio(pid):
            result, err = syscall(251, 1, pid, (3 << 13) | 7)  # ioprio_set(IOPRIO_WHO_PROCESS, pid, IDLE)
            if result < 0:
                raise OSError(err, os.strerror(err))

        return {
            "nice": outcomes(lambda pid: os.setpriority(os.PRIO_PROCESS, pid, 19)),
            "idle_class": outcomes(lambda pid: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))),
            "affinity": outcomes(lambda pid: os.sched_setaffinity(pid, {0})),
            "ioprio": outcomes(ioprio),
            "user_nice": outcomes(lambda pid: os.setpriority(os.PRIO_USER, 0, 19)),
        }

    def signal_through_owner(self, signame: str) -> dict:
        """F_SETOWN + F_SETSIG + O_ASYNC on a pipe, then a write: the kernel would signal the owner."""
        def arm(pid):
            read_end, write_end = os.pipe()
            try:
                fcntl.fcntl(read_end, fcntl.F_SETOWN, pid)
                fcntl.fcntl(read_end, 10, getattr(signal, signame))  # F_SETSIG
                fcntl.fcntl(read_end, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
                os.write(write_end, b"x")
            finally:
                os.close(read_end)
                os.close(write_end)

        def sigio_owner(pid):
            result, err = syscall(16, 0, 0x8901, ctypes.byref(ctypes.c_int(pid)))  # ioctl(FIOSETOWN)
            if result < 0:
                raise OSError(err, os.strerror(err))

        return {"fcntl": outcomes(arm), "ioctl": outcomes(sigio_owner)}

    def read_memory_of(self, pid: int, needle: str) -> dict:
        found = {"dumpable": become_dumpable()}
        try:
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
                for line in maps:
                    start, end = (int(x, 16) for x in line.split()[0].split("-"))
                    if "rw" not in line.split()[1] or end - start > 64 << 20:
                        continue
                    try:
                        mem.seek(start)
                        if needle.encode() in mem.read(end - start):
                            found["read"] = "found"
                            break
                    except OSError:
                        continue
                else:
                    found["read"] = "not found"
        except OSError as exc:
            found["read"] = exc.errno
        return found

    def kernel_surface(self) -> dict:
        surface = {
            "personality": syscall(135, 0x0040000),  # ADDR_NO_RANDOMIZE
            "landlock": syscall(444, None, 0, 1),  # landlock_create_ruleset(NULL, 0, VERSION)
            "inotify": syscall(294, 0),
            "fanotify": syscall(300, 0, 0),
            "pdeathsig": syscall(157, 1, 15, 0, 0, 0),  # PR_SET_PDEATHSIG(SIGTERM)
            "ptracer": syscall(157, 0x59616D61, -1, 0, 0, 0),  # PR_SET_PTRACER_ANY
            "kcmp": syscall(312, 1, os.getppid(), 0, 0, 0),
        }
        try:
            os.openpty()
            surface["pty"] = [0, 0]
        except OSError as exc:
            surface["pty"] = [-1, exc.errno or -1]
        surface["personality_query"] = syscall(135, ctypes.c_ulong(0xFFFFFFFF))
        return surface
'''

VICTIM = EnvCode("isolation-victim", "isolation_victim", "Tenant", TENANT)
ATTACKER = EnvCode("isolation-attacker", "isolation_attacker", "Tenant", TENANT + "\n# another environment\n")


class Live:
    """A session kept live in the pool, with the step each call advances (as the service does)."""

    def __init__(self, pool: WorkerPool, env: EnvCode, session: str) -> None:
        self.pool, self.env, self.session, self.step = pool, env, session, 0

    @classmethod
    async def start(cls, pool: WorkerPool, env: EnvCode, session: str) -> Live:
        await pool.init_state(env, {}, session=session)
        return cls(pool, env, session)

    async def call(self, name: str, **arguments: Any) -> Any:
        async def stored_state() -> str:
            raise AssertionError("the session should still be live in its worker")

        outcome = await session_call(self.pool, self.env, self.session, self.step, stored_state, name, arguments)
        assert outcome.ok, outcome.error
        self.step += 1
        return outcome.result


async def _victim(pool: WorkerPool) -> tuple[Live, int]:
    victim = await Live.start(pool, VICTIM, "victim")
    return victim, await victim.call("whoami")


async def _unharmed(pool: WorkerPool, victim: Live, pid: int) -> None:
    """The victim's live process is still the one it was, and runs a call that needs memory."""
    assert await victim.call("whoami") == pid
    assert await victim.call("allocate", megabytes=128) == 128
    assert pool.replaced == 0


def _setting(pool_factory: Any) -> Any:
    return pool_factory(size=1, memory_mb=256)


async def test_resource_limits_of_other_sessions_cannot_be_set(pool_factory: Any) -> None:
    async with _setting(pool_factory) as pool:
        victim, pid = await _victim(pool)
        attacker = await Live.start(pool, ATTACKER, "attacker")
        poisoned = await attacker.call("poison_limits")
        assert poisoned["address_space"] and set(poisoned["address_space"]) == {str(EPERM)}, poisoned
        assert set(poisoned["cpu"]) == {str(EPERM)}, poisoned
        assert poisoned["own"] is True  # its own limits stay readable
        await _unharmed(pool, victim, pid)


async def test_other_sessions_cannot_be_reniced_or_rescheduled(pool_factory: Any) -> None:
    async with _setting(pool_factory) as pool:
        victim, pid = await _victim(pool)
        attacker = await Live.start(pool, ATTACKER, "attacker")
        slowed = await attacker.call("slow_others")
        for name, seen in slowed.items():
            assert seen and set(seen) == {str(EPERM)}, (name, slowed)
        await _unharmed(pool, victim, pid)


@pytest.mark.parametrize("signame", ["SIGKILL", "SIGSTOP"])
async def test_signals_cannot_be_sent_through_a_files_owner(pool_factory: Any, signame: str) -> None:
    async with _setting(pool_factory) as pool:
        victim, pid = await _victim(pool)
        attacker = await Live.start(pool, ATTACKER, "attacker")
        for _ in range(4):
            sent = await attacker.call("signal_through_owner", signame=signame)
            assert set(sent["fcntl"]) == {str(EPERM)} and set(sent["ioctl"]) == {str(EPERM)}, sent
        await _unharmed(pool, victim, pid)


async def test_a_session_cannot_read_another_sessions_memory(pool_factory: Any) -> None:
    """Made dumpable (by its module code in the host, or by a call), one session of an environment
    could read another's live secret through /proc/<pid>/mem. Neither may make itself dumpable."""
    async with _setting(pool_factory) as pool:
        victim = await Live.start(pool, VICTIM, "victim")
        secret = "SECRET-OF-THE-VICTIM-" + "7" * 16
        pid = await victim.call("keep", secret=secret)
        # the same environment (same host, same module code) and another one
        for env, session in ((VICTIM, "neighbour"), (ATTACKER, "attacker")):
            reader = await Live.start(pool, env, session)
            loaded = await reader.call("at_load")
            assert loaded["dumpable"] == [-1, EPERM], loaded
            found = await reader.call("read_memory_of", pid=pid, needle=secret)
            assert found["dumpable"] == [-1, EPERM] and found["read"] != "found", found
        assert await victim.call("whoami") == pid


async def test_kernel_interfaces_that_reach_past_a_session_are_refused(pool_factory: Any) -> None:
    async with _setting(pool_factory) as pool:
        attacker = await Live.start(pool, ATTACKER, "attacker")
        surface = await attacker.call("kernel_surface")
        # Not even the pseudo-terminal instance of a container's own (the engine mounts one): the
        # ruleset hides it there; on the process backend /dev/ptmx is /dev/null.
        pty = surface.pop("pty")
        assert pty == ([-1, EACCES] if pool.backend.name == "docker" else [-1, EINVAL]), pty
        refused = {name: result for name, result in surface.items() if name != "personality_query"}
        assert all(result[0] == -1 for result in refused.values()), surface
        assert {name: result[1] for name, result in refused.items()} == {
            "personality": EPERM, "landlock": EPERM, "inotify": EPERM, "fanotify": EPERM, "pdeathsig": EPERM,
            "ptracer": EPERM, "kcmp": EPERM}, surface
        assert surface["personality_query"][0] >= 0  # asking for it still works


async def test_proc_sys_and_dev_show_nothing_of_other_sessions(pool_factory: Any) -> None:
    """Another tenant's live session (its status, context switches, memory) is not seen in /proc,
    nor the worker, nor the cgroup's figures in /sys, nor terminals; a session does see that a
    process id is taken (stat answers), and opens the files any program needs."""
    async with _setting(pool_factory) as pool:
        victim, pid = await _victim(pool)
        for env, session in ((VICTIM, "neighbour"), (ATTACKER, "attacker")):
            observer = await Live.start(pool, env, session)
            seen = await observer.call("look_around", pid=pid)
            opened = {name: seen.pop(name) for name in ("null", "urandom", "python")}
            assert opened == {"null": "read", "urandom": "read", "python": "read"}, opened
            # (on the process backend /dev/ptmx is /dev/null, so it opens)
            assert seen.pop("ptmx") == (EACCES if pool.backend.name == "docker" else "read")
            assert seen == dict.fromkeys(seen, EACCES), seen
            assert await observer.call("state_of", pid=pid) == "running"
        await _unharmed(pool, victim, pid)


async def _ended(observer: Live, pid: int) -> bool:
    """Whether ``pid`` ended, as another session of the same worker sees it (bounded wait: the
    worker ends it as soon as it is idle)."""
    for _ in range(50):
        if await observer.call("state_of", pid=pid) in ("Z", "gone"):
            return True
        await anyio.sleep(0.1)
    return False


async def test_a_deleted_sessions_process_ends(pool_factory: Any) -> None:
    async with _setting(pool_factory) as pool:
        victim, pid = await _victim(pool)
        observer = await Live.start(pool, ATTACKER, "observer")
        assert await observer.call("state_of", pid=pid) not in ("Z", "gone")
        pool.end_session("victim")
        assert await _ended(observer, pid)
        assert pool.replaced == 0


async def test_a_deleted_environments_processes_end_and_others_go_on(pool_factory: Any) -> None:
    async with _setting(pool_factory) as pool:
        first, pid = await _victim(pool)
        second = await Live.start(pool, VICTIM, "second")
        other = await second.call("whoami")
        observer = await Live.start(pool, ATTACKER, "observer")
        pool.unload(VICTIM.key)
        assert await _ended(observer, pid) and await _ended(observer, other)
        assert pool.replaced == 0
        # loaded again on its next use, its sessions rebuilt from their stored state
        again = await pool.init_state(VICTIM, {}, session="third")
        assert isinstance(again, str)
