"""Hostile environment code, on every backend: each attack fails or stays inside the call that made it.

The attacks are the ones measured against the sandbox as an attacker would run them (as root,
process backend): shared memory across sessions, kernel keyrings, POSIX message queues, memory
past the limit, signals to the machinery, forged answers, io_uring and user namespaces.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from sandbox.pool.calls import EnvCode
from sandbox.pool.worker import worker_memory_mb
from sandbox.state.view import view_encoded
from tests.sandbox.test_contract import PROBE, _descendants, _state, _worker_pid

pytestmark = pytest.mark.anyio

EPERM = 1

# Module code runs once per worker in the environment's host process, which every call is forked
# from: whatever it sets up there is what an attacker would use to pass data between sessions.
ATTACK = '''
import ctypes
import json
import mmap
import os
import signal
import struct

libc = ctypes.CDLL(None, use_errno=True)
AT_LOAD = {}


def attempt(name, action):
    try:
        AT_LOAD[name] = ["ok", action()]
    except BaseException as exc:
        AT_LOAD[name] = [type(exc).__name__, str(exc)]


def shared_block():
    global SHM
    SHM = mmap.mmap(-1, 65536)
    return "mapped"


def pinned_memfd():
    global PIN
    fd = os.memfd_create("pin")
    for _ in range(600):
        os.write(fd, b"x" * (1 << 20))
    return "pinned"


SHM = None
PIN = None
attempt("shared_mapping", shared_block)
attempt("memfd", pinned_memfd)
attempt("stop_everything", lambda: os.kill(-1, signal.SIGSTOP))
attempt("interrupt_init", lambda: os.kill(1, signal.SIGINT))


def syscall(number, *args):
    result = libc.syscall(number, *args)
    return [result, ctypes.get_errno() if result < 0 else 0]


def answer_pipe():
    for fd in range(3, 256):
        try:
            if os.fstat(fd).st_mode & 0o170000 == 0o010000:
                return fd
        except OSError:
            continue
    raise RuntimeError("no answer pipe")


class Attack:
    def __init__(self):
        self.n = 0

    def at_load(self) -> dict:
        return AT_LOAD

    def shm_write(self, text: str) -> str:
        SHM[: len(text)] = text.encode()
        return "written"

    def shm_read(self) -> str:
        return "" if SHM is None else bytes(SHM[:64]).rstrip(b"\\0").decode()

    def add_key(self, description: str, payload: str) -> list:
        data = payload.encode()
        return syscall(248, b"user", description.encode(), data, len(data), -4)  # KEY_SPEC_USER_KEYRING

    def find_key(self, description: str) -> list:
        return syscall(250, 10, -4, b"user", description.encode(), 0)  # KEYCTL_SEARCH

    def mq_send(self, name: str, text: str) -> list:
        fd, err = syscall(240, name.encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
        if fd < 0:
            return [fd, err]
        return syscall(242, fd, text.encode(), len(text), 0, None)

    def mq_receive(self, name: str) -> list:
        fd, err = syscall(240, name.encode(), os.O_RDONLY, 0, None)
        if fd < 0:
            return [fd, err]
        buffer = ctypes.create_string_buffer(8192)
        got, err = syscall(243, fd, buffer, 8192, None, None)
        return [got, err, buffer.raw[: max(got, 0)].decode(errors="replace")]

    def memfd_hold(self, megabytes: int) -> int:
        fd = os.memfd_create("hold")
        for _ in range(megabytes):
            os.write(fd, b"x" * (1 << 20))
        view = mmap.mmap(fd, megabytes << 20)
        return len(view) >> 20

    def shared_hold(self, megabytes: int) -> int:
        block = mmap.mmap(-1, megabytes << 20)
        block.write(b"x" * (megabytes << 20))
        return megabytes

    def signal(self, target: str, signame: str) -> str:
        pids = {"all": -1, "init": 1, "host": os.getppid(), "self": os.getpid()}
        os.kill(pids[target], getattr(signal, signame))
        return "sent"

    def die_of_unnamed_signal(self) -> None:
        os.kill(0, signal.SIGRTMIN + 6)  # the call's own process group: itself

    def kernel_surface(self) -> dict:
        params = ctypes.create_string_buffer(120)
        return {"io_uring_setup": syscall(425, 8, params), "unshare_user": syscall(272, 0x10000000),
                "unshare_net": syscall(272, 0x40000000), "clone_user": syscall(56, 0x10000000 | 17, 0, 0, 0, 0)}

    def i386_getpid(self) -> int:
        page = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=7)
        page.write(b"\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3")  # mov eax, 20 (getpid); int 0x80; ret
        return ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()

    def x32_getpid(self) -> list:
        return syscall(0x40000000 | 39)

    def forge(self, kind: str) -> None:
        empty = {"added": [], "removed": [], "changed": []}
        if kind == "unhealthy":
            text = json.dumps({"ok": True, "result": "forged", "error": None, "state": None, "diff": empty,
                               "unhealthy": True})
        elif kind == "deep":
            text = '{"ok": true, "result": ' + "[" * 100000 + "]" * 100000 + "}"
        elif kind == "big_result":
            text = json.dumps({"ok": True, "result": "x" * (8 << 20), "error": None, "state": None, "diff": empty})
        elif kind == "state_not_json":
            text = json.dumps({"ok": True, "result": None, "error": None, "state": "{not json", "diff": empty})
        elif kind == "state_not_codec":
            state = json.dumps({"n": {"$ef": "int", "v": "not hex"}})
            text = json.dumps({"ok": True, "result": None, "error": None, "state": state, "diff": empty})
        else:
            text = json.dumps({"ok": True, "result": None, "error": None, "state": "[" * 5000 + "]" * 5000,
                               "diff": empty})
        data = text.encode()
        os.write(answer_pipe(), struct.pack(">Q", len(data)) + data)
        os._exit(0)

'''

ATTACK_A = EnvCode("attack-a", "attack_a", "Attack", ATTACK)
ATTACK_B = EnvCode("attack-b", "attack_b", "Attack", ATTACK)


def _errno(outcome: Any) -> int:
    assert outcome.ok, outcome.error
    return int(outcome.result[1])


async def test_module_code_cannot_share_memory_between_sessions(pool_factory: Any) -> None:
    """A shared mapping made by module code would be the same memory in every call forked from
    its host: session A would write what session B reads. Module code cannot make one."""
    async with pool_factory(size=1) as pool:
        session_a = await pool.init_state(ATTACK_A, {})
        session_b = await pool.init_state(ATTACK_A, {})
        loaded = await pool.call(ATTACK_A, session_a, "at_load", {})
        assert loaded.ok and loaded.result["shared_mapping"][0] == "PermissionError", loaded.result
        written = await pool.call(ATTACK_A, session_a, "shm_write", {"text": "SECRET-OF-A"})
        assert not written.ok
        read = await pool.call(ATTACK_A, session_b, "shm_read", {})
        assert read.ok and "SECRET-OF-A" not in read.result


async def test_a_call_cannot_map_shared_memory(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        out = await pool.call(ATTACK_A, await pool.init_state(ATTACK_A, {}), "shared_hold", {"megabytes": 1})
        assert not out.ok and out.error["type"] == "tool_exception" and "PermissionError" in out.error["message"]


async def test_kernel_keyrings_are_out_of_reach_even_across_restarts(pool_factory: Any) -> None:
    """Keys live in the kernel per uid, so a stored key would outlive the call, the worker and
    the service; neither storing nor finding one is allowed."""
    async with pool_factory(size=1) as pool:
        state = await pool.init_state(ATTACK_A, {})
        assert _errno(await pool.call(ATTACK_A, state, "add_key", {"description": "ef-k", "payload": "S"})) == EPERM
    async with pool_factory(size=1) as restarted:
        state = await restarted.init_state(ATTACK_B, {})
        assert _errno(await restarted.call(ATTACK_B, state, "find_key", {"description": "ef-k"})) == EPERM


async def test_message_queues_do_not_carry_between_environments(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        sent = await pool.call(ATTACK_A, await pool.init_state(ATTACK_A, {}), "mq_send",
                               {"name": "/ef-queue", "text": "SECRET-OF-A"})
        assert _errno(sent) == EPERM
        got = await pool.call(ATTACK_B, await pool.init_state(ATTACK_B, {}), "mq_receive", {"name": "/ef-queue"})
        assert _errno(got) == EPERM and "SECRET-OF-A" not in json.dumps(got.result)


async def test_memory_past_the_limit_cannot_be_held(pool_factory: Any) -> None:
    """memfd pages and shared mappings live outside a process's address-space limit; both are
    refused, in calls and in module code (which would pin them for the host's lifetime)."""
    async with pool_factory(size=1, memory_mb=256) as pool:
        state = await pool.init_state(ATTACK_A, {})
        loaded = await pool.call(ATTACK_A, state, "at_load", {})
        assert loaded.ok and loaded.result["memfd"][0] == "PermissionError", loaded.result
        for tool in ("memfd_hold", "shared_hold"):
            out = await pool.call(ATTACK_A, state, tool, {"megabytes": 900})
            assert not out.ok and out.error["type"] in ("tool_exception", "resource_limit"), (tool, out)
        assert (await pool.call(PROBE, await _state(pool), "increment", {})).ok
        assert pool.replaced == 0


async def test_each_worker_has_a_memory_limit_of_its_own(pool_factory: Any) -> None:
    """Memory outside address spaces (tmpfs, shared pages) counts against a cgroup per worker:
    the container's, or one the process backend makes where the service may (root, cgroup v1,
    or v2 with the memory controller delegated)."""
    async with pool_factory(size=1, memory_mb=256) as pool:
        if os.geteuid() != 0:
            assert "memory" in pool.containment["missing"]
            return
        assert "memory" in pool.containment["applied"], pool.containment
        worker = await pool._acquire(None)
        pool._put(worker)
        if hasattr(worker.channel, "cgroup"):
            limit_file = "memory.max" if os.path.exists(os.path.join(worker.channel.cgroup, "memory.max")) \
                else "memory.limit_in_bytes"
            with open(os.path.join(worker.channel.cgroup, limit_file)) as limit:
                assert int(limit.read()) == worker_memory_mb(pool.limits) << 20  # (its live sessions share resolved)
            with open(f"/proc/{_worker_pid(worker)}/cgroup") as groups:
                assert os.path.basename(worker.channel.cgroup) in groups.read()


WATCHING_THREAD = '''
import os
import threading
import time

SEEN = []


def watch():
    while True:
        try:
            for name in os.listdir("/tmp"):
                if name not in SEEN:
                    SEEN.append(name)
        except OSError:
            pass
        time.sleep(0.005)


threading.Thread(target=watch, daemon=True).start()
'''

# The watcher is a process of its own, which reports to a thread of the host through a pipe.
WATCHING_PROCESS = '''
import os
import threading
import time

SEEN = []
reader, writer = os.pipe()
if os.fork() == 0:
    os.close(reader)
    known = set()
    while True:
        for name in os.listdir("/tmp"):
            if name not in known:
                known.add(name)
                os.write(writer, name.encode() + b"\\n")
        time.sleep(0.005)
os.close(writer)


def pump():
    while True:
        chunk = os.read(reader, 4096)
        if not chunk:
            return
        SEEN.extend(name.decode() for name in chunk.split(b"\\n") if name)


threading.Thread(target=pump, daemon=True).start()
'''

WATCHER_CLASS = '''

class Watcher:
    def __init__(self):
        self.n = 0

    def write_and_wait(self, name: str) -> str:
        with open(f"/tmp/{name}", "w") as handle:
            handle.write("x")
        time.sleep(0.3)
        return name

    def seen(self) -> list:
        return list(SEEN)  # what the module's watcher had gathered when this call was forked
'''


@pytest.mark.parametrize("watching", [WATCHING_THREAD, WATCHING_PROCESS], ids=["thread", "process"])
async def test_what_module_code_leaves_running_never_sees_what_a_call_wrote(pool_factory: Any, watching: str) -> None:
    """Module code may leave a thread or a process running beside the environment's host, which
    every call is forked from: it must not see one session's files to hand them to the next
    session's calls."""
    watcher = EnvCode(f"watcher-{len(watching)}", "watcher", "Watcher", watching + WATCHER_CLASS)
    async with pool_factory(size=1) as pool:
        session_a = await pool.init_state(watcher, {})
        session_b = await pool.init_state(watcher, {})
        assert (await pool.call(watcher, session_a, "write_and_wait", {"name": "secret-of-a"})).ok
        for _ in range(2):  # the second of these is forked after session A's call
            seen = await pool.call(watcher, session_b, "seen", {})
            assert seen.ok and "secret-of-a" not in seen.result, seen.result


CHECK_STOPS_EVERYTHING = "import os, signal\ndef check_func(final_state):\n    os.kill(-1, signal.SIGSTOP)\n    return True"


async def test_a_check_cannot_stop_the_machinery(pool_factory: Any) -> None:
    """A check doing kill(-1, SIGSTOP) would stop the zygote and every host sharing its uid."""
    async with pool_factory(size=1) as pool:
        state = await _state(pool)
        (result,) = await pool.score(PROBE, state, state, [CHECK_STOPS_EVERYTHING])
        assert result["passed"] is False and "PermissionError" in result["error"]
        for _ in range(3):  # other sessions' calls go on, on the same worker
            assert (await pool.call(PROBE, await _state(pool), "increment", {})).ok
        assert pool.replaced == 0


@pytest.mark.parametrize(("target", "signame"), [("all", "SIGSTOP"), ("init", "SIGINT"), ("init", "SIGKILL"),
                                                 ("host", "SIGKILL"), ("self", "SIGKILL")])
async def test_a_call_can_signal_only_its_own_process_group(pool_factory: Any, target: str, signame: str) -> None:
    async with pool_factory(size=1) as pool:
        state = await pool.init_state(ATTACK_A, {})
        out = await pool.call(ATTACK_A, state, "signal", {"target": target, "signame": signame})
        assert not out.ok and "PermissionError" in out.error["message"]
        assert (await pool.call(ATTACK_A, state, "at_load", {})).ok
        assert (await pool.call(PROBE, await _state(pool), "increment", {})).ok
        assert pool.replaced == 0


async def test_module_code_cannot_signal_the_machinery(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        loaded = await pool.call(ATTACK_A, await pool.init_state(ATTACK_A, {}), "at_load", {})
        assert loaded.ok
        assert loaded.result["stop_everything"][0] == "PermissionError"
        assert loaded.result["interrupt_init"][0] == "PermissionError"
        assert (await pool.call(PROBE, await _state(pool), "increment", {})).ok
        assert pool.replaced == 0


async def test_a_call_that_signals_its_own_group_is_reported_as_a_crash(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        out = await pool.call(ATTACK_A, await pool.init_state(ATTACK_A, {}), "die_of_unnamed_signal", {})
        assert not out.ok and out.error["type"] == "tool_exception" and "signal 40" in out.error["message"]


async def test_a_forged_unhealthy_flag_replaces_no_worker(pool_factory: Any) -> None:
    async with pool_factory(size=2) as pool:
        state = await pool.init_state(ATTACK_A, {})
        for _ in range(4):
            await pool.call(ATTACK_A, state, "forge", {"kind": "unhealthy"})
        assert pool.replaced == 0


def _zombies_under(root: int) -> int:
    count = 0
    for pid in _descendants(root):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                count += stat.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
    return count


async def test_a_deeply_nested_answer_is_a_sandbox_error_and_leaves_no_zombie(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        state = await pool.init_state(ATTACK_A, {})
        for _ in range(20):
            out = await pool.call(ATTACK_A, state, "forge", {"kind": "deep"})
            assert not out.ok and out.error["type"] == "sandbox_error"
        assert (await pool.call(PROBE, await _state(pool), "increment", {})).ok
        assert pool.replaced == 0
        worker = await pool._acquire(None)
        pool._put(worker)
        # A host at rest reaps its last ended fork when next woken: at most one per host (two here).
        assert _zombies_under(_worker_pid(worker)) <= 2


async def test_a_forged_state_with_unreadable_tags_harms_only_its_own_session(pool_factory: Any) -> None:
    """Tags the codec never writes are JSON all the same: the state is stored, its view marks the
    value, and the session's next call from it fails as a sandbox error; other sessions carry on."""
    async with pool_factory(size=1) as pool:
        state = await pool.init_state(ATTACK_A, {})
        out = await pool.call(ATTACK_A, state, "forge", {"kind": "state_not_codec"})
        assert out.ok and out.state is not None
        assert view_encoded(json.loads(out.state)) == {"n": {"$truncated": "invalid"}}
        after = await pool.call(ATTACK_A, out.state, "at_load", {})
        assert not after.ok and after.error["type"] == "sandbox_error", after
        assert (await pool.call(ATTACK_A, state, "at_load", {})).ok
        assert pool.replaced == 0


@pytest.mark.parametrize("kind", ["big_result", "state_not_json", "state_too_deep"])
async def test_a_forged_answer_over_the_limits_or_unreadable_is_never_committed(pool_factory: Any, kind: str) -> None:
    async with pool_factory(size=1) as pool:
        state = await pool.init_state(ATTACK_A, {})
        out = await pool.call(ATTACK_A, state, "forge", {"kind": kind})
        assert not out.ok and out.error["type"] == "sandbox_error" and out.state is None, out
        assert (await pool.call(ATTACK_A, state, "at_load", {})).ok
        assert pool.replaced == 0


async def test_io_uring_and_new_namespaces_are_refused(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        out = await pool.call(ATTACK_A, await pool.init_state(ATTACK_A, {}), "kernel_surface", {})
        assert out.ok
        assert {name: result[1] for name, result in out.result.items()} == {
            "io_uring_setup": EPERM, "unshare_user": EPERM, "unshare_net": EPERM, "clone_user": EPERM}


async def test_system_calls_of_other_abis_are_refused(pool_factory: Any) -> None:
    """The filter reads x86_64 system call numbers; an i386 (int 0x80) or x32 call would be read
    with the wrong table, so the first ends the process and the second fails."""
    async with pool_factory(size=1) as pool:
        state = await pool.init_state(ATTACK_A, {})
        i386 = await pool.call(ATTACK_A, state, "i386_getpid", {})
        assert not i386.ok and "SIGSYS" in i386.error["message"], i386.error
        assert _errno(await pool.call(ATTACK_A, state, "x32_getpid", {})) == EPERM


async def test_the_filter_is_reported(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        assert "syscalls" in pool.containment["applied"], pool.containment
