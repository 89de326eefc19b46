"""What the fault and soak tests see of real processes: descendants, memory, descriptors, gates.

Everything is read from /proc of this host, so the figures are the kernel's, not the service's
own account of itself.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

# Tools of tests/fixtures/faults/ledger that wait for the test catch this signal while they wait.
GATE_SIGNAL = signal.SIGUSR1


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    """True for a running process; a zombie has finished and holds nothing but its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, at one moment."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _parent(int(entry))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    queue = [root]
    while queue:
        for child in children.get(queue.pop(), []):
            if _alive(child):
                found.append(child)
            queue.append(child)
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def workers(server_pid: int) -> list[int]:
    """The sandbox worker processes the API process started (its direct children running worker.py)."""
    return [pid for pid in descendants(server_pid)
            if _parent(pid) == server_pid and "sandbox/worker/main.py" in command_line(pid)]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _waits_at_gate(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (GATE_SIGNAL - 1)))
    return False


def wait_for_gate(server_pid: int, timeout: float = 30.0) -> int:
    """The pid of the call process waiting at the gate, once a gated tool call is in flight."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = [pid for pid in descendants(server_pid) if _waits_at_gate(pid)]
        if waiting:
            assert len(waiting) == 1, f"more than one process waits at the gate: {waiting}"
            return waiting[0]
        time.sleep(0.02)
    raise AssertionError(f"no gated call started within {timeout:g} s")


def worker_of(server_pid: int, pid: int) -> int:
    """The sandbox worker that ``pid`` runs under."""
    current: int | None = pid
    while current is not None and current > 1:
        parent = _parent(current)
        if parent == server_pid:
            return current
        current = parent
    raise AssertionError(f"process {pid} does not run under a worker of {server_pid}")


def wait_until(condition: object, timeout: float, what: str) -> None:
    """Poll ``condition`` (a callable) until it is true; fail saying ``what`` did not happen."""
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.05)
