"""The processes a worker keeps between requests, and how each of them rests, wakes and ends.

The zygote forks a *host* per environment, which runs the module code once and keeps a ready
fork of itself (see ``runner``). A *template* is a fork of a host holding a scenario's instance
built (see ``templates``), and a *resident* a fork holding a session's live instance (see
``sessions``). A host is stopped while any fork runs, with everything it started, so a thread
left by module code never runs alongside a session's process; the worker ends every fork itself
(hosts and calls may signal only their own process group) and its host reaps it and reports how
it ended. Ending a host ends its templates and residents with it, which are its children.

Standard library only.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from sandbox.worker import channel, processes, scratch
from sandbox.worker.budget import MAX_HOSTS
from sandbox.worker.forks import DEFAULT_TIMEOUT, Failure, WorkerLimits, end, exited_by
from sandbox.worker.zygote import HOST_GUARD, HOST_MESSAGE_BYTES, Zygote


@dataclass
class Host:
    pid: int
    sock: socket.socket
    used: float = field(default_factory=time.monotonic)
    stopped: list[int] = field(default_factory=list)  # it and what it started, while at rest
    ready: bool = False  # it holds a ready fork (made between requests, see ``Runner.prepare``)
    # A template (a fork of an environment's host holding a scenario's instance built) names that
    # host: it rests and wakes with it, and ends with it.
    parent: Host | None = None
    pidfd: int = -1
    env: str = ""
    drew: bool = False  # a template whose ``__init__`` drew randomness (it serves no session)
    digest: str = ""  # a template's: of the initial state it holds, as it reported it when built


@dataclass
class Resident:
    """A session's live process: a fork of its environment's host that kept the instance."""

    env: str
    pid: int
    pidfd: int
    request_fd: int
    answer_fd: int
    version: int = -1
    used: float = field(default_factory=time.monotonic)
    stopped: list[int] = field(default_factory=list)  # what it started, stopped with it
    parent: Host | None = None  # the host it is a fork of, which reaps it
    lent: bool = False  # the service holds its pipes and calls it straight (see ``sandbox.lane``)


class Hosts:
    """Every process the worker keeps: environment hosts by code hash, templates by environment and
    template key, residents by session id (each dict least recently used first)."""

    def __init__(self, limits: WorkerLimits, zygote: Zygote, *, own_processes: bool = False,
                 private_tmp: bool = False, preserve: list[str] | None = None) -> None:
        self.limits = limits
        self.zygote = zygote
        # Only in a PID namespace (or container) of its own may the worker stop and kill what it sees.
        self.own_processes = own_processes
        self.private_tmp = private_tmp
        # read-only folders confinement put back inside /tmp (e.g. a checkout there): never emptied
        self.preserve = list(preserve or [])
        self.tmp_mode = stat.S_IMODE(os.stat("/tmp").st_mode) if private_tmp else 0o1777
        self.hosts: dict[str, Host] = {}
        self.templates: dict[str, Host] = {}
        self.residents: dict[str, Resident] = {}
        self.sources: dict[str, dict[str, Any]] = {}
        self.running: str | None = None  # the environment whose processes may run right now
        self.ended: list[str] = []  # lent sessions whose process ended since the last answer
        self.evicted = 0  # live sessions ended to keep room for a call
        self.unhealthy = False

    def load(self, request: dict[str, Any]) -> None:
        key = request["env"]
        spec = {k: request[k] for k in ("env", "env_id", "class_name", "code")}
        spec["layers"] = [str(layer) for layer in request.get("layers") or []]
        spec["timeout"] = float(request.get("timeout", DEFAULT_TIMEOUT))
        self.sources[key] = spec
        if key not in self.hosts:
            self._start_host(key)

    def host(self, key: str) -> Host:
        """The host of environment ``key``, started again if it is gone; only its processes may
        run from now on.

        Raises:
            Failure: the environment is not loaded here (``not_loaded``), or did not load.
            Unhealthy: the zygote could not start its host.
        """
        host = self.hosts.get(key)
        if host is None:
            if key not in self.sources:
                raise Failure("not_loaded", f"environment {key[:12]} is not loaded in this worker")
            host = self._start_host(key)  # after a crash or an eviction
        host.used = time.monotonic()
        if self.running != key and self.own_processes:
            self._isolate(key)
        return host

    def _isolate(self, key: str) -> None:
        """Let only ``key``'s processes run while its request is served.

        Environments sharing a worker share its uid and /tmp, so a thread or child that one
        environment left running could watch files or signal processes of another's calls.
        Every other environment's host and children are stopped until their own next request,
        and processes that belong to no host (daemons that left their parent) are killed.
        """
        owners = {host.pid: name for name, host in self.hosts.items()}
        owners.update({template.pid: template.env for template in self.templates.values()})
        keep = {os.getpid(), os.getppid(), self.zygote.pid}
        residents = self.resident_pids()
        for pid, ppid in processes.visible():
            if pid in keep or ppid == self.zygote.pid and pid not in owners:
                continue
            if pid in residents or ppid in residents:
                continue  # stopped between their own session's requests
            owner = owners.get(pid, owners.get(ppid))
            if owner is None:
                processes.kill(pid, signal.SIGKILL)
            elif owner != key:
                processes.kill(pid, signal.SIGSTOP)  # at rest already; this only makes sure
        self.running = key

    def resident_pids(self) -> set[int]:
        return {r.pid for r in self.residents.values()}

    def wake(self, host: Host) -> None:
        """Let ``host`` (and what it started) run, to answer the worker."""
        for pid in reversed(host.stopped):
            processes.kill(pid, signal.SIGCONT)
        host.stopped = []

    def rest(self, host: Host, fork: int = -1) -> None:
        """Stop ``host`` and what it started (but ``fork``) until the worker next needs it: module
        code runs in the host, and what it left running (a thread, a process) must never run while
        a session's process does, which could leave data in /tmp."""
        host.stopped = self._freeze(host, fork)

    def _freeze(self, host: Host, fork: int) -> list[int]:
        """Stop ``host`` and its descendants except ``fork`` (and its own); kill orphans. Returns
        the stopped pids. A process is stopped before its children are listed, so it cannot
        start one unseen; a second pass catches a child whose fork was under way."""
        if self.own_processes:
            for orphan in processes.children_of(os.getpid()):  # they belong to no environment
                if orphan != self.zygote.pid:
                    processes.kill(orphan, signal.SIGKILL)
        stopped: list[int] = []
        # Stopped already, and with them what they started. (A template's children are mostly its
        # live sessions, thousands in a batch: they are set aside as a set, not one by one.)
        skip = self.resident_pids() | {fork}
        for _ in range(2):
            todo = [host.pid]
            while todo:
                pid = todo.pop()
                if pid not in stopped:
                    processes.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                todo.extend(set(processes.children_of(pid)).difference(skip))
        return stopped

    def _start_host(self, key: str) -> Host:
        while len(self.hosts) >= MAX_HOSTS:
            self.stop_host(min(self.hosts, key=lambda k: self.hosts[k].used))
        spec = self.sources[key]
        host = Host(*self.zygote.start_host(spec))
        loaded = channel.receive(host.sock, time.monotonic() + spec["timeout"] + HOST_GUARD, HOST_MESSAGE_BYTES)
        if loaded is None or loaded.get("error"):
            self._end_host(host)
            if loaded is None:
                raise Failure("load_error", f"the module did not load within {spec['timeout']:g} s "
                                            "(its process hung, died or broke its answer)")
            kind = loaded["error"]["type"]
            raise Failure("load_timeout" if kind == "timeout" else kind, loaded["error"]["message"])
        self.rest(host)
        self.hosts[key] = host
        return host

    def stop_host(self, key: str) -> None:
        host = self.hosts.pop(key)
        for session, resident in list(self.residents.items()):
            if resident.env == key:  # they die with their host (parent-death signal)
                del self.residents[session]
                release(resident)
                if resident.lent:
                    self.ended.append(session)
        for name, template in list(self.templates.items()):
            if template.parent is host:  # and so do its templates
                del self.templates[name]
                close_host(template)
        self._end_host(host)

    def _end_host(self, host: Host) -> None:
        host.sock.close()
        self.zygote.stop_host(host.pid)
        self.reap()  # forks orphaned by the host's end must not hold process slots until the request ends

    def drop(self, host: Host) -> None:
        """Stop a host or end a template that no longer answers properly."""
        for key, known in list(self.hosts.items()):
            if known is host:
                self.stop_host(key)
        for key, known in list(self.templates.items()):
            if known is host:
                self.end_template(key)

    def finish(self, host: Host, pid: int, *, reply: bool) -> int | None:
        """Have ``host`` reap its ended fork ``pid``; with ``reply``, its wait status (None if the
        host did not answer properly, and it is dropped)."""
        if not reply:  # a host at rest reaps it when next woken, before it answers anything else
            try:
                channel.send(host.sock, {"op": "finish", "pid": pid, "reply": False})
            except OSError:
                self.drop(host)
            return None
        root = host.parent or host
        self.wake(root)
        try:
            channel.send(host.sock, {"op": "finish", "pid": pid, "reply": True})
            report = channel.receive(host.sock, time.monotonic() + HOST_GUARD, HOST_MESSAGE_BYTES)
        except OSError:
            report = None
        status = None if report is None else report.get("status")
        if report is None or type(status) is not int:
            self.drop(host)
            return None
        self.rest(root)
        return status

    def end_resident(self, session: str, *, wait: bool = False, reap: bool = False) -> None:
        """End a session's live process; with ``wait``, only return once it is gone (and its
        memory with it); with ``reap``, once its host has reaped it too (no trace of it is left)."""
        resident = self.residents.pop(session)
        if resident.lent:
            self.ended.append(session)
        end(resident.pid, resident.pidfd, None)
        if wait:
            exited_by(resident.pid, resident.pidfd, time.monotonic() + HOST_GUARD)
        release(resident)
        host = resident.parent or self.hosts.get(resident.env)
        if host is not None and host.sock.fileno() >= 0:
            self.finish(host, resident.pid, reply=reap)

    def end_template(self, key: str, *, wait: bool = False) -> None:
        """End a template: its forks and the sessions started from it end with it (they were its
        children); those sessions go cold."""
        template = self.templates.pop(key)
        for session, resident in list(self.residents.items()):
            if resident.parent is template:
                self.end_resident(session)
        self.end_template_process(template, wait=wait)

    def end_template_process(self, template: Host, *, wait: bool = False) -> None:
        if template.pidfd >= 0:
            end(template.pid, template.pidfd, None)
            if wait:
                exited_by(template.pid, template.pidfd, time.monotonic() + HOST_GUARD)
        close_host(template)
        if template.parent is not None and template.parent.sock.fileno() >= 0:
            self.finish(template.parent, template.pid, reply=False)

    def reap(self) -> None:
        if self.zygote.pid in processes.reap():
            self.unhealthy = True  # without its zygote the worker can start no environment

    def empty_tmp(self) -> None:
        """Empty /tmp (see ``sandbox.worker.scratch``); one that cannot be emptied makes this worker one to
        replace, so that nothing in it reaches another session."""
        if self.private_tmp and not scratch.empty_tmp(self.tmp_mode, self.preserve):
            self.unhealthy = True


def release(resident: Resident) -> None:
    for fd in (resident.request_fd, resident.answer_fd, resident.pidfd):
        processes.close(fd)
    resident.request_fd = resident.answer_fd = resident.pidfd = -1


def close_host(host: Host) -> None:
    host.sock.close()
    processes.close(host.pidfd)
    host.pidfd = -1
