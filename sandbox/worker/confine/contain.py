"""Confine the current worker process before it runs any environment code.

Linux primitives, applied in order, each reported as applied or missing:

- memory: joining the memory cgroup the service made for this worker (see ``memcg``);
- network: a fresh network namespace (only a downed loopback inside);
- filesystem: a private mount namespace with a private tmpfs on /tmp, read-only
  empty tmpfs over the other world-writable folders, and home folders that are
  closed to other users (e.g. /root) hidden except for the Python installation;
- user: a dedicated unprivileged uid/gid, no supplementary groups, no new privileges;
- environment: the service starts workers with an empty environment (checked here).

The seccomp filter on environment code (``seccomp``) is installed later, by the zygote, and
reported as ``syscalls``.

Standard library only (ctypes for the system calls Python 3.11 lacks).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_PRIVATE = 1 << 18
# The new mount API (Linux 5.2+); these numbers are the same on every architecture.
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 1
AT_RECURSIVE = 0x8000
AT_FDCWD = -100
MOVE_MOUNT_F_EMPTY_PATH = 0x4
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
IPC_RMID = 0

# What a worker's environment may hold; LC_CTYPE is set by Python itself (PEP 538).
SAFE_VARIABLES = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "HOME", "PYTHONHASHSEED")

# Folders every user may write to on a Debian host, and /run, where services keep their Unix
# sockets (a network namespace does not separate those); each gets covered by an empty tmpfs.
SHARED_WRITABLE = ("/var/tmp", "/dev/shm", "/dev/mqueue", "/run", "/var/run", "/var/lock")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl {option}")


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent dies, so no worker outlives the service."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def make_undumpable() -> None:
    """Inherited by every fork: no process of our uid may ptrace us or open our /proc files."""
    _prctl(PR_SET_DUMPABLE, 0)


def become_subreaper() -> None:
    """Orphaned descendants are re-parented here rather than to the host's init, which may not reap."""
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError:
        pass


def clear_ipc() -> None:
    """Remove the System V IPC objects of this (private) IPC namespace, which outlive processes."""
    for table, remove in (("shm", _libc.shmctl), ("sem", _libc.semctl), ("msg", _libc.msgctl)):
        try:
            with open(f"/proc/sysvipc/{table}") as listing:
                rows = listing.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 1 and fields[1].isdigit():
                if table == "sem":
                    remove(int(fields[1]), 0, IPC_RMID)
                else:
                    remove(int(fields[1]), IPC_RMID, None)


def _closed_ancestor(path: str) -> str | None:
    """The first folder on ``path`` that other users cannot enter, if any."""
    current = "/"
    for part in os.path.realpath(path).strip("/").split("/"):
        current = os.path.join(current, part)
        try:
            if os.path.isdir(current) and not os.stat(current).st_mode & 0o001:
                return current
        except OSError:
            return None
    return None


def _readable_roots(extra: tuple[str, ...] = ()) -> list[str]:
    """Folders the worker must still read after dropping privileges (``extra``: the package layers)."""
    roots = {os.path.dirname(os.__file__), os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))}
    roots.add(os.path.realpath(sys.base_prefix))
    roots.update(r for r in extra if os.path.isdir(r))
    return sorted(os.path.realpath(r) for r in roots)


def tmp_options(size_mb: int, inodes: int) -> str:
    """The private /tmp's tmpfs: root's, writable by all with the sticky bit. Environment code,
    which runs as the worker's uid, may add and remove its own entries but never change the folder
    itself (take its permissions off, say, so that the worker can no longer empty it)."""
    return f"size={size_mb}m,nr_inodes={inodes},mode=1777"


def _isolate_filesystem(uid: int, gid: int, tmp: str, extra: tuple[str, ...] = ()) -> list[str]:
    """Cover /tmp with a private tmpfs, the other world-writable folders and closed home folders
    (e.g. /root and its secrets) with empty read-only ones, then put back, read-only, the folders
    Python and this runtime are read from, wherever they lie (a checkout in /tmp included).

    Returns the folders put back under /tmp, which the worker must not empty.
    """
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # sysfs shows the network namespace of whoever mounted it: remount it for ours.
    try:
        _mount("sysfs", "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass
    shared = [f for f in SHARED_WRITABLE if os.path.isdir(f) and not os.path.islink(f)]
    roots = _outermost(_readable_roots(extra))
    # (a closed folder inside /tmp needs no cover: /tmp itself becomes a fresh private tmpfs)
    closed = {a for a in (_closed_ancestor(r) for r in roots) if a and not _under(a, "/tmp")}
    covered = ["/tmp", *shared, *sorted(closed)]
    kept = [(root, _detach_copy(root)) for root in roots if any(_under(root, c) for c in covered)]
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"{tmp},uid=0,gid=0")
    for folder in [*shared, *sorted(closed)]:
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    for root, tree in kept:
        os.makedirs(root, exist_ok=True)
        _move_mount(tree, root)
        os.close(tree)
        _mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for folder in [*shared, *sorted(closed)]:
        _mount(None, folder, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _close_terminals()
    return [root for root, _ in kept if _under(root, "/tmp")]


def _close_terminals() -> None:
    """No new pseudo-terminals (they would appear in the host's /dev/pts) and no view of the host's:
    /dev/ptmx becomes /dev/null and /dev/pts an empty read-only folder."""
    if os.path.exists("/dev/ptmx"):
        _mount("/dev/null", "/dev/ptmx", None, MS_BIND)
    if os.path.isdir("/dev/pts"):
        _mount("tmpfs", "/dev/pts", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0755")


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _outermost(paths: list[str]) -> list[str]:
    """Drop paths inside other paths of the list."""
    return [p for p in paths if not any(p != q and _under(p, q) for q in paths)]


def _detach_copy(path: str) -> int:
    """A detached copy of the mount tree at ``path`` (open_tree), to attach again after covering it."""
    fd = _libc.syscall(SYS_OPEN_TREE, AT_FDCWD, path.encode(), OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"open_tree {path}: {os.strerror(err)}")
    return int(fd)


def _move_mount(tree: int, target: str) -> None:
    _check(_libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH),
           f"move_mount {target}")


def _enter_pid_namespace() -> None:
    """Continue as PID 1 of a new PID namespace with its own /proc, so environment code sees no
    host process (command lines of the service included).

    The process the service started stays outside as a plain waiter: when the service kills it,
    the kernel kills this one (parent-death signal), and with it the whole namespace.
    """
    _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    child = os.fork()
    if child > 0:
        os.closerange(0, 1 << 16)  # the protocol belongs to the child now
        _, status = os.waitpid(child, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    die_with_parent()
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _unprivileged_namespaces() -> None:
    """Without root, a user namespace still gives a private network and /tmp."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS), "unshare")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def verify_container() -> dict[str, Any]:
    """In a container the engine confines the worker; check each primitive instead of applying it."""
    applied: list[str] = []
    missing: dict[str, str] = {}
    try:
        interfaces = sorted(os.listdir("/sys/class/net"))
    except OSError:
        interfaces = []
    if interfaces in ([], ["lo"]):
        applied.append("network")
    else:
        missing["network"] = "the container has network interfaces: " + ", ".join(interfaces)
    if os.statvfs("/").f_flag & os.ST_RDONLY:
        applied.append("filesystem")
    else:
        missing["filesystem"] = "the container's root filesystem is writable"
    if os.getuid() != 0:
        applied.append("user")
    else:
        missing["user"] = "the container runs as root"
    if _container_memory_limit() is not None:
        applied.append("memory")
    else:
        missing["memory"] = "no memory limit is visible on the container's cgroup"
    try:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
    except OSError as exc:
        missing["no_new_privs"] = str(exc)
    leaked = sorted(k for k in os.environ if k not in SAFE_VARIABLES + ("HOSTNAME",))
    if leaked:
        missing["environment"] = "variables visible to environment code: " + ", ".join(leaked)
    else:
        applied.append("environment")
    return {"applied": applied, "missing": missing, "uid": os.getuid()}


def join_cgroup(path: str) -> None:
    """Move this process (and so everything it will start) into the memory cgroup at ``path``."""
    with open(os.path.join(path, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))


def _container_memory_limit() -> int | None:
    """The memory limit the engine set on this container's cgroup (v2 or v1), if one is visible."""
    for name in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(name) as limit:
                text = limit.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def apply(uid: int, gid: int, tmp: str, cgroup: str | None = None,
          cgroup_missing: str = "no memory cgroup", readable: tuple[str, ...] = ()) -> dict[str, Any]:
    """Confine this process; return which primitives hold and why any is missing. ``readable``:
    folders besides Python and this runtime that stay readable (the package layers' root)."""
    applied: list[str] = []
    missing: dict[str, str] = {}
    kept: list[str] = []
    if cgroup:
        # First, while still root: memory that outlives address spaces (shmem, tmpfs, page
        # tables) is charged to the group, and the kernel's OOM killer acts inside it.
        try:
            join_cgroup(cgroup)
            applied.append("memory")
        except OSError as exc:
            missing["memory"] = f"cannot join the memory cgroup {cgroup} ({exc})"
    else:
        missing["memory"] = cgroup_missing
    if os.geteuid() == 0:
        try:
            _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
            applied.append("network")
        except OSError as exc:
            missing["network"] = f"cannot create a network namespace ({exc})"
        try:
            _enter_pid_namespace()
            applied.append("processes")
        except OSError as exc:
            missing["processes"] = f"cannot create a PID namespace: host processes stay visible ({exc})"
        try:
            kept = _isolate_filesystem(uid, gid, tmp, readable)
            applied.append("filesystem")
        except OSError as exc:
            missing["filesystem"] = f"cannot build a private mount namespace ({exc})"
        try:
            _drop_privileges(uid, gid)
            applied.append("user")
        except OSError as exc:
            missing["user"] = f"cannot switch to uid {uid} ({exc})"
    else:
        try:
            _unprivileged_namespaces()
            applied.append("network")
            try:
                _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, tmp)
                missing["filesystem"] = "not root: only /tmp is private; the service user's files stay writable"
            except OSError as exc:
                missing["filesystem"] = f"not root and no private /tmp ({exc})"
        except OSError as exc:
            missing["network"] = f"not root and user namespaces are unavailable ({exc})"
            missing["filesystem"] = "not root: the worker writes wherever the service user can"
        missing["user"] = f"not root: the worker runs as the service's own uid {os.getuid()}"
        missing["processes"] = "not root: no PID namespace of its own; host processes stay visible"
    try:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
    except OSError as exc:
        missing["no_new_privs"] = str(exc)
    die_with_parent()
    leaked = sorted(k for k in os.environ if k not in SAFE_VARIABLES)
    if leaked:
        missing["environment"] = "variables visible to environment code: " + ", ".join(leaked)
    else:
        applied.append("environment")
    try:
        os.chdir("/tmp")
    except OSError:
        pass
    return {"applied": applied, "missing": missing, "uid": os.getuid(), "preserve": kept}
