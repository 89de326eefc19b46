"""Memory cgroups for process-backend workers (service side).

An address-space limit counts only what a process maps; shared memory, tmpfs pages and kernel
memory do not show in it. A memory cgroup counts them all, for every process of a worker, and
the kernel's OOM killer acts inside the group when it is full. Each worker gets a group of its
own under the service's, named after the worker's uid (which the uid lock makes this service's
alone, so a group left by a killed service is simply taken over). cgroup v2 and v1 are both
handled; where neither can be written, ``reason`` says why and the worker reports it missing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

V2_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


@dataclass(frozen=True)
class Hierarchy:
    version: int
    path: str  # the service's own group, under which worker groups go


def _own_groups() -> dict[str, str]:
    """controller list -> path, from /proc/self/cgroup ('' is the v2 hierarchy)."""
    groups: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as listing:
            for line in listing:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                groups[controllers] = path
    except OSError:
        pass
    return groups


def find() -> tuple[Hierarchy | None, str]:
    """The hierarchy worker groups can be made in, or None and why not."""
    if os.geteuid() != 0:
        return None, "not root: no memory cgroup per worker"
    groups = _own_groups()
    if "" in groups:
        for root in V2_ROOTS:
            base = root + groups[""].rstrip("/")
            try:
                with open(os.path.join(root, "cgroup.controllers")) as listing:
                    available = listing.read().split()
            except OSError:
                continue
            if "memory" in available and _delegates_memory(base):
                return Hierarchy(2, base), ""
    for controllers, path in groups.items():
        if "memory" in controllers.split(","):
            base = "/sys/fs/cgroup/memory" + path.rstrip("/")
            if os.access(base, os.W_OK):
                return Hierarchy(1, base), ""
    return None, "no writable memory cgroup (cgroup v2 with the memory controller delegated, or v1)"


def _delegates_memory(base: str) -> bool:
    """v2 hands a controller to child groups only if the parent enables it in subtree_control."""
    control = os.path.join(base, "cgroup.subtree_control")
    try:
        with open(control) as enabled:
            if "memory" in enabled.read().split():
                return True
        with open(control, "w") as enabling:  # fails while the group itself holds processes
            enabling.write("+memory")
        return True
    except OSError:
        return False


def prepare(hierarchy: Hierarchy, name: str, limit_bytes: int) -> str:
    """Create (or take over) the group ``name`` with a hard limit, swap included; its path.

    Raises:
        OSError: the group cannot be made or limited.
    """
    path = os.path.join(hierarchy.path, name)
    os.makedirs(path, exist_ok=True)
    if hierarchy.version == 2:
        _write(path, "memory.max", str(limit_bytes))
        _write(path, "memory.swap.max", "0", required=False)
    else:
        # memsw may not be lower than the memory limit: raise it first when growing.
        _write(path, "memory.memsw.limit_in_bytes", "-1", required=False)
        _write(path, "memory.limit_in_bytes", str(limit_bytes))
        _write(path, "memory.memsw.limit_in_bytes", str(limit_bytes), required=False)
    return path


def remove(path: str) -> bool:
    """Remove an emptied group; False while processes remain in it."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _write(path: str, name: str, value: str, required: bool = True) -> None:
    try:
        with open(os.path.join(path, name), "w") as control:
            control.write(value)
    except OSError:
        if required:
            raise
