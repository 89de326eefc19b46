"""What environment code may open: a Landlock ruleset for each environment host and validation.

Every process of a worker shares its uid (and, on the docker backend, its container), so files
the kernel would show to one session it shows to all of them. The ruleset is applied before any
module code runs and is inherited by every live session, call and check, none of which can widen
it. Opening a path fails with EACCES when it is

- under ``/proc`` (other sessions' status, memory maps, context switches) or ``/sys`` (their
  cgroups' figures),
- under ``/dev``, except the character devices any program may need (``null``, ``zero``, ``full``,
  ``random``, ``urandom``): no terminal (``/dev/ptmx``, ``/dev/pts``) and no shared memory,
- under one of the ``hidden`` folders (the operator's package layers: each environment sees its
  own, passed as ``readable``).

Everything else keeps the access its mounts and permissions give. What Landlock does not cover:
``stat`` on a hidden path still answers (a process id's existence and owner, not its activity),
and descriptors opened before the ruleset keep working (the host holds none that matter: see
``forks.close_inherited``). Standard library only: this module runs inside the sandbox.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
import struct

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
# Filesystem rights by the first ABI that knows them (linux/landlock.h).
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
ABI1 = (1 << 13) - 1  # execute ... make_sym
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2

ALWAYS_HIDDEN = ("/proc", "/sys", "/dev")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
O_PATH = getattr(os, "O_PATH", 0o10000000)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long


def abi() -> int:
    """The kernel's Landlock ABI version, or 0 where there is none (or a filter refuses it)."""
    version = _libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(0, int(version))


def handled(version: int) -> int:
    rights = ABI1
    if version >= 2:
        rights |= REFER
    if version >= 3:
        rights |= TRUNCATE
    if version >= 5:
        rights |= IOCTL_DEV
    return rights


def plan(hidden: tuple[str, ...] = (), readable: tuple[str, ...] = ()) -> list[tuple[str, bool]]:
    """The paths to allow, each with whether it is a folder: every entry of the tree that is
    neither hidden nor above a hidden folder, the hidden folders' open paths, and ``readable``.

    Symbolic links are left out: a path through one is checked where it leads, so a link can
    neither open a hidden folder nor close an allowed one."""
    closed = {os.path.realpath(p) for p in ALWAYS_HIDDEN + hidden}
    allowed: list[tuple[str, bool]] = []

    def around(folder: str) -> None:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return
        for name in names:
            path = os.path.join(folder, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode) or path in closed:
                continue
            if stat.S_ISDIR(mode) and any(c.startswith(path + "/") for c in closed):
                around(path)
            else:
                allowed.append((path, stat.S_ISDIR(mode)))

    around("/")
    for path in DEVICES + readable:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        allowed.append((path, stat.S_ISDIR(mode)))
    return allowed


def restrict(hidden: tuple[str, ...] = (), readable: tuple[str, ...] = ()) -> None:
    """Apply the ruleset to this process and everything it starts from now on.

    Raises OSError when the kernel has no Landlock or refuses the ruleset; needs no_new_privs
    (every worker sets it) or CAP_SYS_ADMIN."""
    version = abi()
    if version < 1:
        raise OSError("this kernel has no Landlock (or a filter refuses it)")
    rights = handled(version)
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if version >= 6 else 0
    # struct landlock_ruleset_attr: handled_access_fs, handled_access_net, scoped (ABI 6).
    attr = struct.pack("=QQQ", rights, 0, scoped) if scoped else struct.pack("=Q", rights)
    buffer = ctypes.create_string_buffer(attr, len(attr))
    ruleset = int(_libc.syscall(SYS_CREATE_RULESET, buffer, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)))
    if ruleset < 0:
        _raise("landlock_create_ruleset")
    try:
        for path, folder in plan(hidden, readable):
            _allow(ruleset, path, rights if folder else rights & FILE_RIGHTS)
        if _libc.syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            _raise("landlock_restrict_self")
    finally:
        os.close(ruleset)


def _allow(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # gone since it was listed: nothing to allow
    try:
        # struct landlock_path_beneath_attr (packed): allowed_access, parent_fd.
        attr = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd), 12)
        if _libc.syscall(SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), attr,
                         ctypes.c_uint32(0)) != 0:
            _raise(f"landlock_add_rule {path}")
    finally:
        os.close(fd)


def _raise(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")
