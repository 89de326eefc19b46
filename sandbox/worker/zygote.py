"""The worker's zygote: the clean process every environment host is forked from.

The worker forks it before it reads any request, so it holds no session's data, and it takes
the seccomp filter (when it can) that every host and call inherits; what it reports as it starts
says which confinement environment code runs under. Without it the worker can start no
environment: it is then ``Unhealthy``. Standard library only.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from sandbox.worker import channel, envhost
from sandbox.worker.confine import contain, landlock, seccomp
from sandbox.worker.forks import WorkerLimits, close_inherited

# How long a host may take to hand over a fork or report on one.
HOST_GUARD = 5.0
# Hosts run environment code, so what they say is bounded and checked like any untrusted input.
HOST_MESSAGE_BYTES = 64 * 1024


class Unhealthy(Exception):
    """This worker can no longer start processes; the service must replace it."""


class Zygote:
    def __init__(self, limits: WorkerLimits, *, filter_syscalls: bool = True) -> None:
        self.filter_missing: str | None = "not started"  # why the zygote holds no seccomp filter
        self.paths_missing: str | None = "not started"  # why hosts do not hide /proc, /sys and /dev
        self.pid, self.sock = self._start(limits, filter_syscalls)

    def _start(self, limits: WorkerLimits, filter_syscalls: bool) -> tuple[int, socket.socket]:
        mine, theirs = socket.socketpair()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the zygote
            try:
                contain.die_with_parent()
                if os.getppid() != parent:
                    os._exit(1)
                close_inherited(keep=(theirs.fileno(),))
                try:
                    if not filter_syscalls:
                        raise OSError("confinement is off")
                    seccomp.confine()
                    limits.filtered = True
                    started: dict[str, Any] = {"seccomp": None}
                except OSError as exc:
                    started = {"seccomp": str(exc)}
                limits.hide_paths = limits.filtered and landlock.abi() >= 1
                started["landlock"] = None if limits.hide_paths else "this kernel has no Landlock"
                channel.send(theirs, started)
                envhost.serve_zygote(theirs, limits)
            finally:
                os._exit(0)
        theirs.close()
        hello = channel.receive(mine, time.monotonic() + HOST_GUARD, HOST_MESSAGE_BYTES)
        if hello is None:
            raise RuntimeError("the zygote did not start")
        self.filter_missing = hello.get("seccomp")
        self.paths_missing = hello.get("landlock") if self.filter_missing is None else self.filter_missing
        return pid, mine

    def ask(self, message: dict[str, Any], wait: float) -> dict[str, Any]:
        """Its answer to ``message`` (``validate`` runs there, in a throwaway fork).

        Raises:
            Unhealthy: it did not answer within ``wait`` seconds.
        """
        try:
            channel.send(self.sock, message)
            answer = channel.receive(self.sock, time.monotonic() + wait, HOST_MESSAGE_BYTES)
        except OSError:
            answer = None
        if answer is None:
            raise Unhealthy("the worker's zygote stopped answering")
        return answer

    def start_host(self, spec: dict[str, Any]) -> tuple[int, socket.socket]:
        """Fork a host for the environment ``spec`` describes: its pid, and the socket to it.

        Raises:
            Unhealthy: it could not.
        """
        answer = self.ask({"op": "host", **spec}, HOST_GUARD)
        fds = channel.receive_fds(self.sock, 1, time.monotonic() + HOST_GUARD) if "pid" in answer else None
        if fds is None:
            raise Unhealthy(f"the zygote could not start a host: {answer.get('error')}")
        return int(answer["pid"]), socket.socket(fileno=fds[0])

    def stop_host(self, pid: int) -> None:
        self.ask({"op": "stop", "pid": pid}, HOST_GUARD)
