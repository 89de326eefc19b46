"""Seccomp filters for the processes that run environment code, written as classic BPF.

Two filters, stacked by the kernel (a syscall must pass every filter a process holds, and no
filter can ever be removed):

- ``confine()`` is installed once by the zygote, so every environment host, call, check and
  validation inherits it. It refuses the kernel interfaces through which one call could leave
  something for a later call (shared mappings, System V and POSIX IPC, memfd, keyrings), reach
  past its limits or its namespaces (io_uring, bpf, perf, userfaultfd, ptrace, the mount family,
  new namespaces), or open a socket to another process; and it refuses every ABI but x86_64's.
- ``confine_session()`` is installed by each environment host and each validation (the zygote
  itself must still end hosts), before module code runs, so every live session, call and check
  inherits it. It keeps each process to itself, since every process of a worker shares its uid
  and the kernel would let one act on another: signals may go to the caller's own process group
  (``os.kill(0, sig)``) and nowhere else, not even by the caller's own pid, nor through a file's
  owner (``F_SETOWN``/``F_SETSIG``, ``FIOSETOWN``); resource limits, scheduling and priority may
  be changed for the caller only (pid 0); no process may make itself dumpable (which would open
  its memory, and its forks', to every process of the uid), name a tracer, change its
  personality, set another parent-death signal than SIGKILL, watch files (inotify, fanotify),
  stack landlock rulesets, set I/O priorities, compare or move other processes' resources, or
  push input into a terminal. Every host and every call holds a process group of its own, so no
  machinery (worker, zygote, hosts, other sessions) can be reached.

Refused calls fail with EPERM (clone3 with ENOSYS, so the C library falls back to clone, whose
flags a filter can read). Standard library only: this module runs inside the sandbox.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import struct

# Classic BPF opcodes (linux/filter.h).
LD_ABS_W = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
# struct seccomp_data: nr, arch, instruction pointer, then six 64-bit arguments (low word first).
NR_OFFSET, ARCH_OFFSET = 0, 4


def _arg_low(index: int) -> int:
    return 16 + 8 * index


PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
MAP_SHARED = 0x01  # MAP_SHARED_VALIDATE (0x03) carries this bit too
CLONE_NEW_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
                   | 0x40000000)  # NS, CGROUP, UTS, IPC, USER, PID, NET

# x86_64 system call numbers refused outright, by what they would open up.
REFUSED = {
    "keyrings (kept by the kernel per uid, across calls and restarts)": (248, 249, 250),
    "System V IPC": (29, 30, 31, 64, 65, 66, 67, 68, 69, 70, 71, 220),
    "POSIX message queues": (240, 241, 242, 243, 244, 245),
    "memfd (memory outside the address-space limit)": (319, 447),
    "io_uring": (425, 426, 427),
    "ptrace and access to other processes' memory": (101, 310, 311, 438),
    "bpf, perf_event_open, userfaultfd": (321, 298, 323),
    "the mount family": (165, 166, 155, 161, 428, 429, 430, 431, 432, 433, 442),
    "new namespaces": (272, 308),
    "sockets (a channel to a process that outlives the call)": (41,),
    "kernel modules, kexec, reboot, swap, handles to any file": (175, 176, 313, 246, 320, 169, 167, 168, 303, 304),
    "signals by pidfd": (424,),
}
MMAP, CLONE, CLONE3 = 9, 56, 435
KILL, TKILL, TGKILL, RT_SIGQUEUEINFO, RT_TGSIGQUEUEINFO = 62, 200, 234, 129, 297
IOCTL, FCNTL, PERSONALITY, SETPRIORITY, PRCTL, PRLIMIT64 = 16, 72, 135, 141, 157, 302
# Calls that act on a process named by their first argument: allowed for the caller only (0).
SELF_ONLY = {
    "kill": KILL, "prlimit64": PRLIMIT64, "sched_setparam": 142, "sched_setscheduler": 144,
    "sched_setaffinity": 203, "sched_setattr": 314,
}
# Refused to environment code outright: each reaches another process, or watches the host.
SESSION_REFUSED = {
    "signals by thread": (TKILL, TGKILL, RT_SIGQUEUEINFO, RT_TGSIGQUEUEINFO),
    "I/O priorities": (251, 252),
    "inotify and fanotify": (253, 254, 255, 294, 300, 301),
    "landlock": (444, 445, 446),
    "other processes' resources and pages": (312, 440, 448, 256, 279, 274),  # kcmp, process_madvise, ...
}
# fcntl commands that make the kernel signal a file's owner, who may be any process of the uid.
F_SETOWN, F_SETSIG, F_SETOWN_EX, F_NOTIFY = 8, 10, 15, 1026
# ioctls that name a process or group to signal, or type into a terminal.
FIOSETOWN, SIOCSPGRP, TIOCSPGRP, TIOCSTI, TIOCSCTTY = 0x8901, 0x8902, 0x5410, 0x5412, 0x540E
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_MM, PR_SET_PTRACER = 1, 4, 35, 0x59616D61
SIGKILL = 9
PERSONALITY_QUERY = 0xFFFFFFFF
PRIO_PROCESS = 0

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _Program:
    """A tiny assembler: instructions with named jump targets, resolved to relative offsets."""

    def __init__(self) -> None:
        self.code: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def load(self, offset: int) -> None:
        self.code.append((LD_ABS_W, 0, 0, offset))

    def jump(self, op: int, value: int, if_true: str | int = 0, if_false: str | int = 0) -> None:
        self.code.append((op, if_true, if_false, value))

    def ret(self, action: int) -> None:
        self.code.append((RET_K, 0, 0, action))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def x86_64_only(self) -> None:
        """Start: a process calling by another ABI is ended ("kill"); then load the call's number."""
        self.load(ARCH_OFFSET)
        self.jump(JEQ_K, AUDIT_ARCH_X86_64, 0, "kill")
        self.load(NR_OFFSET)

    def assemble(self) -> bytes:
        out = bytearray()
        for index, (op, true, false, value) in enumerate(self.code):
            jt, jf = (self.labels[t] - index - 1 if isinstance(t, str) else t for t in (true, false))
            if not (0 <= jt <= 255 and 0 <= jf <= 255):
                raise ValueError("seccomp filter jump out of range")
            out += struct.pack("=HBBI", op, jt, jf, value & 0xFFFFFFFF)
        return bytes(out)


def confine_program() -> bytes:
    deny = RET_ERRNO | errno.EPERM
    program = _Program()
    program.x86_64_only()
    program.jump(JGE_K, X32_SYSCALL_BIT, "deny")
    for numbers in REFUSED.values():
        for number in numbers:
            program.jump(JEQ_K, number, "deny")
    program.jump(JEQ_K, CLONE3, "enosys")
    program.jump(JEQ_K, MMAP, "mmap")
    program.jump(JEQ_K, CLONE, "clone")
    program.ret(RET_ALLOW)
    program.label("mmap")
    program.load(_arg_low(3))
    program.jump(JSET_K, MAP_SHARED, "deny")
    program.ret(RET_ALLOW)
    program.label("clone")
    program.load(_arg_low(0))
    program.jump(JSET_K, CLONE_NEW_FLAGS, "deny")
    program.ret(RET_ALLOW)
    program.label("deny")
    program.ret(deny)
    program.label("enosys")
    program.ret(RET_ERRNO | errno.ENOSYS)
    program.label("kill")
    program.ret(RET_KILL_PROCESS)
    return program.assemble()


def session_program() -> bytes:
    """Keep a process to itself: see the module's docstring for what this refuses and why."""
    program = _Program()
    program.x86_64_only()
    for numbers in SESSION_REFUSED.values():
        for number in numbers:
            program.jump(JEQ_K, number, "deny")
    for number in SELF_ONLY.values():
        program.jump(JEQ_K, number, "self")
    program.jump(JEQ_K, SETPRIORITY, "setpriority")
    program.jump(JEQ_K, FCNTL, "fcntl")
    program.jump(JEQ_K, IOCTL, "ioctl")
    program.jump(JEQ_K, PRCTL, "prctl")
    program.jump(JEQ_K, PERSONALITY, "personality")
    program.ret(RET_ALLOW)
    # pid_t is 32 bits: the kernel reads only the low word of the first argument.
    program.label("self")
    program.load(_arg_low(0))
    program.jump(JEQ_K, 0, "allow", "deny")
    program.label("setpriority")  # (PRIO_PROCESS, 0): the caller itself
    program.load(_arg_low(0))
    program.jump(JEQ_K, PRIO_PROCESS, 0, "deny")
    program.load(_arg_low(1))
    program.jump(JEQ_K, 0, "allow", "deny")
    program.label("fcntl")
    program.load(_arg_low(1))
    for command in (F_SETOWN, F_SETSIG, F_SETOWN_EX, F_NOTIFY):
        program.jump(JEQ_K, command, "deny")
    program.ret(RET_ALLOW)
    program.label("ioctl")
    program.load(_arg_low(1))
    for request in (FIOSETOWN, SIOCSPGRP, TIOCSPGRP, TIOCSTI, TIOCSCTTY):
        program.jump(JEQ_K, request, "deny")
    program.ret(RET_ALLOW)
    program.label("prctl")
    program.load(_arg_low(0))
    program.jump(JEQ_K, PR_SET_PTRACER, "deny")
    program.jump(JEQ_K, PR_SET_MM, "deny")
    program.jump(JEQ_K, PR_SET_DUMPABLE, "dumpable")
    program.jump(JEQ_K, PR_SET_PDEATHSIG, "deathsig")
    program.ret(RET_ALLOW)
    program.label("dumpable")  # only ever to 0, as the worker set it
    program.load(_arg_low(1))
    program.jump(JEQ_K, 0, "allow", "deny")
    program.label("deathsig")  # only SIGKILL, as every fork sets it
    program.load(_arg_low(1))
    program.jump(JEQ_K, SIGKILL, "allow", "deny")
    program.label("personality")  # asking is fine; changing it is not
    program.load(_arg_low(0))
    program.jump(JEQ_K, PERSONALITY_QUERY, "allow", "deny")
    program.label("deny")
    program.ret(RET_ERRNO | errno.EPERM)
    program.label("allow")
    program.ret(RET_ALLOW)
    program.label("kill")
    program.ret(RET_KILL_PROCESS)
    return program.assemble()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def supported() -> bool:
    """The filters speak the x86_64 system call numbers only."""
    return platform.machine() == "x86_64"


def _install(program: bytes) -> None:
    """Install a filter on the calling thread (and everything it later starts). Needs no_new_privs."""
    if not supported():
        raise OSError(errno.ENOSYS, f"seccomp filters are written for x86_64, not {platform.machine()}")
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter: {os.strerror(err)}")


def confine() -> None:
    _install(confine_program())


def confine_session() -> None:
    _install(session_program())
