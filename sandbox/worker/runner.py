"""One request run in a ready fork of a host: the fork taken, the request written in, the answer
read out, the fork ended; and, between requests, the next forks made ahead.

For each init, call and check the worker takes its host's ready fork, writes the request straight
into it and reads the answer from it, so session data never passes through a process that other
sessions' forks are copied from. The host and everything it started but this fork are at rest
(stopped) while the fork runs, and /tmp is emptied before the fork starts and again before the
host resumes, so a thread left by module code never sees what a call wrote.

Standard library only.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from sandbox.wire import protocol
from sandbox.wire.answers import error
from sandbox.worker import channel, processes
from sandbox.worker.forks import DEFAULT_TIMEOUT, SANDBOX_ERROR, end, outcome_error, read_answer
from sandbox.worker.hosts import Host, Hosts
from sandbox.worker.zygote import HOST_GUARD, HOST_MESSAGE_BYTES, Unhealthy

# What a request answers when the process serving it broke and was dropped.
RESTARTED = "the environment's process stopped answering and was restarted"


class Runner:
    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts

    def take(self, host: Host) -> tuple[int, int, int, int] | None:
        """Ask ``host`` for its ready fork: (pid, pidfd, request descriptor, answer descriptor), or
        None (and the host is dropped) if it does not hand one over properly.

        The host runs module code, so the pid it names is checked: it must be the host's child,
        pinned by a pidfd before the check, or the worker could be made to signal anything.

        Raises:
            Unhealthy: no process can be started, even once live sessions gave theirs back.
        """
        fds: list[int] | None = None
        pid, pidfd = 0, -1
        host.ready = False
        root = host.parent or host  # a template rests and wakes with its environment's host
        self.hosts.wake(root)
        try:
            handed = self._spare(host)
            # Out of processes: forks just ended may not be reaped yet, and live sessions hold
            # some; freeing those is cheaper than replacing the worker with every session on it.
            while handed is not None and handed.get("unhealthy") is True and self._free_a_process(host):
                handed = self._spare(host)
            if handed is not None and handed.get("unhealthy") is True:
                self.hosts.rest(root)
                raise Unhealthy(f"cannot start a call process: {str(handed.get('error'))[:500]}")
            offered = handed.get("pid") if handed else None
            if type(offered) is int and offered > 0:
                pid = offered
                fds = channel.receive_fds(host.sock, 2, time.monotonic() + HOST_GUARD)
                pidfd = os.pidfd_open(pid)
                if processes.parent_of(pid) != host.pid:
                    raise OSError(f"the host named {pid}, which is not its child")
        except OSError:
            for fd in (*(fds or ()), pidfd):
                processes.close(fd)
            fds = None
        if fds is None:
            self.hosts.drop(host)
            return None
        self.hosts.rest(root, fork=pid)
        processes.kill(pid, signal.SIGCONT)  # a spare forked after the host's last rest may since have been stopped
        return pid, pidfd, fds[0], fds[1]

    def _spare(self, host: Host) -> dict[str, Any] | None:
        channel.send(host.sock, {"op": "spare"})
        return channel.receive(host.sock, time.monotonic() + HOST_GUARD, HOST_MESSAGE_BYTES)

    def _free_a_process(self, host: Host) -> bool:
        """Reap what has ended, else end the least recently used live session (not one of
        ``host``'s own being served): whether a process slot may have come free."""
        if processes.reap():
            return True
        for session, resident in self.hosts.residents.items():  # least recently used first
            if resident.parent is not host and self.hosts.hosts.get(resident.env) is not host:
                self.hosts.end_resident(session, wait=True, reap=True)
                self.hosts.evicted += 1
                return True
        return False

    def run(self, host: Host, request: dict[str, Any], cap: int) -> dict[str, Any]:
        """Run one request in a ready fork of ``host``: write it in, read the answer out (at most
        ``cap`` bytes). A host that died since its last use is started again once."""
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        taken = self.take(host)
        if taken is None and request.get("env") in self.hosts.sources:
            host = self.hosts.host(request["env"])  # it died since its last use: one fresh start
            taken = self.take(host)
        if taken is None:
            return {"error": error(SANDBOX_ERROR, RESTARTED)}
        pid, pidfd, request_fd, answer_fd = taken
        try:
            self.hosts.empty_tmp()
            deadline = time.monotonic() + timeout
            try:
                wrote = processes.write_by(request_fd, protocol.encode_frame(request), deadline)
            finally:
                os.close(request_fd)
            if wrote:
                answer, outcome = read_answer(answer_fd, deadline, cap)
            else:
                os.close(answer_fd)
                answer, outcome = None, "timeout"
            done = outcome == "done"
            # A fork that answered is ended at once; one whose pipe closed may run on until the deadline.
            overran = end(pid, pidfd, None if done or outcome != "ended" else deadline)
        finally:
            os.close(pidfd)
            self.hosts.empty_tmp()
        status = self.hosts.finish(host, pid, reply=not done)
        if done and answer is not None:
            return answer
        if status is None:
            return {"error": error(SANDBOX_ERROR, RESTARTED)}
        return {"error": outcome_error(outcome, status & 0xFFFF, overran, timeout, cap)}

    def unprepared(self) -> bool:
        """Whether a host or template has no ready fork (``prepare`` would make one)."""
        return any(not host.ready for host in (*self.hosts.hosts.values(), *self.hosts.templates.values()))

    def prepare(self) -> bool:
        """Between requests (the answer is sent): let each host that handed over its ready fork
        make the next one, so a new session does not wait for a fork. Returns whether any host
        was woken (and the worker must be tidied again)."""
        woken = False
        for host in [*self.hosts.hosts.values(), *self.hosts.templates.values()]:
            if host.ready or host.sock.fileno() < 0:
                continue
            woken = True
            root = host.parent or host
            self.hosts.wake(root)
            try:
                channel.send(host.sock, {"op": "prepare"})
                answer = channel.receive(host.sock, time.monotonic() + HOST_GUARD, HOST_MESSAGE_BYTES)
            except OSError:
                answer = None
            if answer is None:
                self.hosts.drop(host)
                continue
            host.ready = answer.get("ready") is True
            self.hosts.rest(root)
        return woken
