"""What a worker does with each request. The worker itself never runs environment code.

Requests (all carry ``id``; those about an environment carry ``env``, its code hash):

- ``load``      {env, env_id, class_name, code, layers}  start the environment's host process (see ``envhost``)
- ``init``      {env, init_config}               -> {state}
- ``call``      {env, state, name, arguments}    -> {ok, result, error, state|None, diff}
  With ``deltas`` (and, with ``state``, the stored ``delta``), a changed tree state may come back
  as ``delta`` instead of ``state``, or as ``state`` with ``rebase`` (see ``sandbox.state.deltas``).
  Both may name a ``session`` with its ``version`` (the step it is at) and ``next_version``: the
  fork that serves it then stays, as that session's *resident*, holding the live instance, and a
  later call at the version it holds may leave ``state`` out (else it answers ``need_state``).
- ``score``     {env, state, initial, checks}    -> {checks: [{passed, error}]}
- ``validate``  {env_id, class_name, code, layers} -> {ok, failure: {kind, message}}
- ``ping``      {}                               -> {ok}
Any request may carry ``ending`` {sessions, envs}: first, the live processes of these sessions
end, and every process of these environments (the service deleted them); and ``stats``: the
answer then carries ``memory`` (see ``Runtime.memory``).

Processes: the worker forks one clean *zygote* before it reads any request; the zygote forks a
*host* per environment, which runs the module code once and keeps a ready fork of itself. For
each init, call and check the worker takes that fork, writes the request straight into it and
reads the answer from it, so session data never passes through a process that other sessions'
forks are copied from. The worker ends every fork itself (hosts and calls may signal only their
own process group) and its host reaps it and reports how it ended. A host is stopped while its
fork runs, and /tmp is emptied before the fork starts and again before the host resumes, so a
thread left by module code never sees what a call wrote. After every request the worker also
empties System V IPC objects (which the seccomp filter keeps environment code from making).
Everything a fork answers is checked and only the fields of the request's kind pass on.

A resident runs only while its own session's request is served: it is stopped (SIGSTOP) the
moment it has answered, and ended as soon as a call may have changed its instance without the
change being answered (a tool raised, timed out, ran out of memory or printed too much), or when
its host goes, it is the least recently used one past ``max_residents``, it idled too long, its
session or environment was deleted, or the worker's memory (measured from its cgroup after every
request) leaves less room than one call may take: then the least recently used go first.

Standard library only.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import socket
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from sandbox.wire import answers, protocol
from sandbox.wire.answers import error
from sandbox.wire.limits import DEFAULTS
from sandbox.worker import channel, envhost, scratch
from sandbox.worker.confine import contain, landlock, seccomp
from sandbox.worker.forks import (
    DEFAULT_TIMEOUT,
    SANDBOX_ERROR,
    Failure,
    WorkerLimits,
    close_inherited,
    decode_answer,
    end,
    exited_by,
    outcome_error,
    read_answer,
)
from sandbox.worker.memory import Gauge, share_of

# Environment hosts kept per worker; the least recently used goes first.
MAX_HOSTS = 16
# How long a host may take to hand over a fork or report on one.
HOST_GUARD = 5.0
# Descriptors the worker itself may hold (each host costs one); calls get ``open_files``.
WORKER_FILES = 4 * MAX_HOSTS + 64
# Hosts run environment code, so what they say is bounded and checked like any untrusted input.
HOST_MESSAGE_BYTES = 64 * 1024
# Live sessions a worker keeps by default, and how long an unused one stays.
MAX_RESIDENTS = DEFAULTS.residents
RESIDENT_IDLE = DEFAULTS.resident_idle
# Room kept free beyond one call's own memory limit (the worker's own work on its answer).
MEMORY_SLACK = 32 << 20
# Scenarios' initial states kept built per worker (templates), least recently used first.
MAX_TEMPLATES = 8
# A cold session whose state is kept against a template's initial state is rebuilt as a fork of
# that template, with its delta applied, when the worker holds the template; it builds the
# template first only for a state at least this large (decoding a small one is quicker).
TEMPLATE_REBUILD_BYTES = 256 * 1024
# Template keys whose ``__init__`` drew randomness, remembered so that none is built again: each
# session of one builds its own instance (sessions of one template would share its draws).
MAX_DRAWING = 4096
NEED_STATE = "need_state"


def process_budget(residents: int, processes: int) -> int:
    """The most processes one worker may run at once, all it runs counted: itself, the zygote, each host and
    each template with its ready fork and a fork ended but not yet reaped, the live sessions, the
    forks of the calls in flight, and what calls may start (a live session keeps what its calls
    started, stopped with it). Under this uid (or in this container) nothing else runs."""
    per_call = 1 + processes
    return 2 + 3 * (MAX_HOSTS + MAX_TEMPLATES) + residents * per_call + 2 * per_call + 8


class Unhealthy(Exception):
    """This worker can no longer start processes; the service must replace it."""


@dataclass
class Host:
    pid: int
    sock: socket.socket
    used: float = field(default_factory=time.monotonic)
    stopped: list[int] = field(default_factory=list)  # it and what it started, while at rest
    ready: bool = False  # it holds a ready fork (made between requests, see ``prepare``)
    # A template (a fork of an environment's host holding a scenario's instance built) names that
    # host: it rests and wakes with it, and ends with it.
    parent: Host | None = None
    pidfd: int = -1
    env: str = ""
    drew: bool = False  # a template whose ``__init__`` drew randomness (it serves no session)


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


class Runtime:
    def __init__(self, limits: WorkerLimits, *, private_tmp: bool = False, preserve: list[str] | None = None,
                 own_processes: bool = False, filter_syscalls: bool = True,
                 max_residents: int = MAX_RESIDENTS, resident_idle: float = RESIDENT_IDLE,
                 gauge: Gauge | None = None, lend: socket.socket | None = None) -> None:
        self.limits = limits
        # Where the service takes the pipes of the sessions it calls straight (see ``lends``).
        self.lend = lend
        self.ended: list[str] = []  # lent sessions whose process ended since the last answer
        self.residents: dict[str, Resident] = {}  # by session id, least recently used first
        self.max_residents = max_residents
        self.resident_idle = resident_idle
        self.gauge = gauge  # the worker's memory cgroup, when one can be read
        self.evicted = 0  # live sessions ended to keep room for a call
        self.private_tmp = private_tmp
        # Only in a PID namespace (or container) of its own may the worker stop and kill what it sees.
        self.own_processes = own_processes
        # read-only folders confinement put back inside /tmp (e.g. a checkout there): never emptied
        self.preserve = list(preserve or [])
        self.tmp_mode = stat.S_IMODE(os.stat("/tmp").st_mode) if private_tmp else 0o1777
        self.hosts: dict[str, Host] = {}
        self.templates: dict[str, Host] = {}  # by environment and template key, least recently used first
        self.drawing: dict[str, None] = {}  # template keys never to build (see ``MAX_DRAWING``), oldest first
        self.sources: dict[str, dict[str, Any]] = {}
        self.unhealthy = False
        self.running: str | None = None  # the environment whose processes may run right now
        self.filter_syscalls = filter_syscalls
        self.filter_missing: str | None = "not started"  # why the zygote holds no seccomp filter
        self.paths_missing: str | None = "not started"  # why hosts do not hide /proc, /sys and /dev
        self._set_limits()
        # Other processes of our uid (every fork runs environment code) must not read our memory,
        # which holds every session's requests, nor open our descriptors through /proc.
        contain.make_undumpable()
        contain.become_subreaper()  # orphans of a killed host come back here to be reaped
        self.zygote_pid, self.zygote = self._start_zygote()

    def _set_limits(self) -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        files = max(WORKER_FILES + 3 * self.max_residents, self.limits.open_files)
        if hard != resource.RLIM_INFINITY:
            files = min(files, hard)  # a container engine may have set it lower than we can raise
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
        if self.limits.dedicated_uid:
            cap = process_budget(self.max_residents, self.limits.processes)
            resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))

    def _start_zygote(self) -> tuple[int, socket.socket]:
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
                    if not self.filter_syscalls:
                        raise OSError("confinement is off")
                    seccomp.confine()
                    self.limits.filtered = True
                    started: dict[str, Any] = {"seccomp": None}
                except OSError as exc:
                    started = {"seccomp": str(exc)}
                self.limits.hide_paths = self.limits.filtered and landlock.abi() >= 1
                started["landlock"] = None if self.limits.hide_paths else "this kernel has no Landlock"
                channel.send(theirs, started)
                envhost.serve_zygote(theirs, self.limits)
            finally:
                os._exit(0)
        theirs.close()
        hello = channel.receive(mine, time.monotonic() + HOST_GUARD, HOST_MESSAGE_BYTES)
        if hello is None:
            raise RuntimeError("the zygote did not start")
        self.filter_missing = hello.get("seccomp")
        self.paths_missing = hello.get("landlock") if self.filter_missing is None else self.filter_missing
        return pid, mine

    @property
    def lends(self) -> bool:
        """Whether the service calls kept sessions straight (``sandbox.lane``): only where nothing
        of a call is left for this worker to tidy but /tmp, which the service empties itself (no
        process a call may start, no System V IPC, which the seccomp filter keeps calls from)."""
        return self.lend is not None and self.limits.processes == 0 and self.filter_missing is None

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        try:
            if isinstance(request.get("ending"), dict):
                self._end(request["ending"])
            if isinstance(request.get("touched"), list):
                self._touch(request["touched"])
            if op == "load":
                self._load(request)
                response: dict[str, Any] = {"ok": True}
            elif op == "ping":  # the pool checks idle workers are alive
                response = {"ok": True}
            elif op == "prepare":  # the pool asks while nothing else may run here (see ``prepare``)
                self.prepare()
                response = {"ok": True}
            elif op == "collect":
                response = self._collect(request)
            elif op == "check":  # a lent process's answer, too large for the service's event loop
                raw = request.get("answer")
                answer = decode_answer(raw) if isinstance(raw, bytes) else answers.malformed()
                response = answers.checked("call", answer, request)
            elif op == "validate":
                answer = self._zygote(request, float(request.get("timeout", DEFAULT_TIMEOUT)) + HOST_GUARD)
                response = answers.checked(op, answer, request)
            elif op in ("init", "call") and type(request.get("session")) is str:
                answer = self._session(request)
                failure = answer.get("error")
                if isinstance(failure, dict) and failure.get("type") == NEED_STATE:
                    return {"id": request.get("id"), "error": answer["error"]}
                lent = answer.pop("lent", None) is True
                response = answers.checked(op, answer, request)
                if lent:  # its descriptors are on their way, whatever the check found
                    response["lent"] = True
            elif op in ("init", "call"):
                host = self._host(request["env"])
                answer = self._run(self._template(host, request) or host, request, answers.answer_cap(request))
                response = answers.checked(op, answer, request)
            elif op == "score":
                response = self._score(request)
            else:
                response = {"error": error(SANDBOX_ERROR, f"unknown op {op!r}")}
        except Failure as exc:
            response = {"error": error(exc.kind, exc.message)}
        except Unhealthy as exc:
            self.unhealthy = True
            response = {"error": error(SANDBOX_ERROR, str(exc))}
        except Exception as exc:  # a bug here must reach the service as a sandbox error, not kill the worker
            response = {"error": error(SANDBOX_ERROR, f"worker failed: {type(exc).__name__}: {exc}")}
        finally:
            self._scrub()
        if self.unhealthy:
            response["unhealthy"] = True
        if self.ended:
            response["ended"], self.ended = self.ended, []
        if self.lend is not None:
            response["unprepared"] = self.unprepared()
        if request.get("stats") is True:
            response["memory"] = self.memory()
        response["id"] = request.get("id")
        return response

    def memory(self) -> dict[str, Any]:
        """Live sessions, what their processes hold, the worker's measured memory, evictions."""
        limit = self.gauge.limit() if self.gauge is not None else None
        return {"live": len(self.residents), "templates": len(self.templates),
                "live_bytes": sum(share_of(r.pid) for r in self.residents.values()),
                "used": self.gauge.used() if self.gauge is not None else None, "limit": limit,
                "evicted": self.evicted}

    def _end(self, ending: dict[str, Any]) -> None:
        for session in ending.get("sessions") or ():
            if session in self.residents:  # (deleted: gone without a trace before this answer)
                self._end_resident(session, reap=True)
        for key in ending.get("envs") or ():
            self.sources.pop(key, None)
            if key in self.hosts:
                self._stop_host(key)

    # -- zygote and hosts -----------------------------------------------------------------
    def _zygote(self, message: dict[str, Any], wait: float) -> dict[str, Any]:
        try:
            channel.send(self.zygote, message)
            answer = channel.receive(self.zygote, time.monotonic() + wait, HOST_MESSAGE_BYTES)
        except OSError:
            answer = None
        if answer is None:
            raise Unhealthy("the worker's zygote stopped answering")
        return answer

    def _load(self, request: dict[str, Any]) -> None:
        key = request["env"]
        spec = {k: request[k] for k in ("env", "env_id", "class_name", "code")}
        spec["layers"] = [str(layer) for layer in request.get("layers") or []]
        spec["timeout"] = float(request.get("timeout", DEFAULT_TIMEOUT))
        self.sources[key] = spec
        if key not in self.hosts:
            self._start_host(key)

    def _host(self, key: str) -> Host:
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
        keep = {os.getpid(), os.getppid(), self.zygote_pid}
        residents = self._resident_pids()
        for pid, ppid in _processes():
            if pid in keep or ppid == self.zygote_pid and pid not in owners:
                continue
            if pid in residents or ppid in residents:
                continue  # stopped between their own session's requests
            owner = owners.get(pid, owners.get(ppid))
            if owner is None:
                _signal(pid, signal.SIGKILL)
            elif owner != key:
                _signal(pid, signal.SIGSTOP)  # at rest already; this only makes sure
        self.running = key

    def _wake(self, host: Host) -> None:
        """Let ``host`` (and what it started) run, to answer the worker."""
        for pid in reversed(host.stopped):
            _signal(pid, signal.SIGCONT)
        host.stopped = []

    def _rest(self, host: Host, fork: int = -1) -> None:
        """Stop ``host`` and what it started (but ``fork``) until the worker next needs it: module
        code runs in the host, and what it left running (a thread, a process) must never run while
        a session's process does, which could leave data in /tmp."""
        host.stopped = self._freeze(host, fork)

    def _freeze(self, host: Host, fork: int) -> list[int]:
        """Stop ``host`` and its descendants except ``fork`` (and its own); kill orphans. Returns
        the stopped pids. A process is stopped before its children are listed, so it cannot
        start one unseen; a second pass catches a child whose fork was under way."""
        if self.own_processes:
            for orphan in _children_of(os.getpid()):  # they belong to no environment
                if orphan != self.zygote_pid:
                    _signal(orphan, signal.SIGKILL)
        stopped: list[int] = []
        residents = self._resident_pids()  # stopped already, and with them what they started
        for _ in range(2):
            todo = [host.pid]
            while todo:
                pid = todo.pop()
                if pid == fork or pid in residents:
                    continue
                if pid not in stopped:
                    _signal(pid, signal.SIGSTOP)
                    stopped.append(pid)
                todo.extend(_children_of(pid))
        return stopped

    def _start_host(self, key: str) -> Host:
        while len(self.hosts) >= MAX_HOSTS:
            self._stop_host(min(self.hosts, key=lambda k: self.hosts[k].used))
        spec = self.sources[key]
        answer = self._zygote({"op": "host", **spec}, HOST_GUARD)
        fds = channel.receive_fds(self.zygote, 1, time.monotonic() + HOST_GUARD) if "pid" in answer else None
        if fds is None:
            raise Unhealthy(f"the zygote could not start a host: {answer.get('error')}")
        host = Host(int(answer["pid"]), socket.socket(fileno=fds[0]))
        loaded = channel.receive(host.sock, time.monotonic() + spec["timeout"] + HOST_GUARD, HOST_MESSAGE_BYTES)
        if loaded is None or loaded.get("error"):
            self._end_host(host)
            if loaded is None:
                raise Failure("load_error", f"the module did not load within {spec['timeout']:g} s "
                                            "(its process hung, died or broke its answer)")
            kind = loaded["error"]["type"]
            raise Failure("load_timeout" if kind == "timeout" else kind, loaded["error"]["message"])
        self._rest(host)
        self.hosts[key] = host
        return host

    def _stop_host(self, key: str) -> None:
        host = self.hosts.pop(key)
        for session, resident in list(self.residents.items()):
            if resident.env == key:  # they die with their host (parent-death signal)
                del self.residents[session]
                _release(resident)
                if resident.lent:
                    self.ended.append(session)
        for name, template in list(self.templates.items()):
            if template.parent is host:  # and so do its templates
                del self.templates[name]
                _close_host(template)
        self._end_host(host)

    def _end_host(self, host: Host) -> None:
        host.sock.close()
        self._zygote({"op": "stop", "pid": host.pid}, HOST_GUARD)
        self._reap()  # forks orphaned by the host's end must not hold process slots until the request ends

    def _drop(self, host: Host) -> None:
        for key, known in list(self.hosts.items()):
            if known is host:
                self._stop_host(key)
        for key, known in list(self.templates.items()):
            if known is host:
                self._end_template(key)

    # -- running requests in forks --------------------------------------------------------
    def _take_fork(self, host: Host) -> tuple[int, int, int, int] | None:
        """Ask ``host`` for its ready fork: (pid, pidfd, request descriptor, answer descriptor), or
        None (and the host is dropped) if it does not hand one over properly.

        The host runs module code, so the pid it names is checked: it must be the host's child,
        pinned by a pidfd before the check, or the worker could be made to signal anything.
        """
        fds: list[int] | None = None
        pid, pidfd = 0, -1
        host.ready = False
        root = host.parent or host  # a template rests and wakes with its environment's host
        self._wake(root)
        try:
            handed = self._spare(host)
            # Out of processes: forks just ended may not be reaped yet, and live sessions hold
            # some; freeing those is cheaper than replacing the worker with every session on it.
            while handed is not None and handed.get("unhealthy") is True and self._free_a_process(host):
                handed = self._spare(host)
            if handed is not None and handed.get("unhealthy") is True:
                self._rest(root)
                raise Unhealthy(f"cannot start a call process: {str(handed.get('error'))[:500]}")
            offered = handed.get("pid") if handed else None
            if type(offered) is int and offered > 0:
                pid = offered
                fds = channel.receive_fds(host.sock, 2, time.monotonic() + HOST_GUARD)
                pidfd = os.pidfd_open(pid)
                if _parent_of(pid) != host.pid:
                    raise OSError(f"the host named {pid}, which is not its child")
        except OSError:
            for fd in (*(fds or ()), pidfd):
                _close(fd)
            fds = None
        if fds is None:
            self._drop(host)
            return None
        self._rest(root, fork=pid)
        _signal(pid, signal.SIGCONT)  # a spare forked after the host's last rest may since have been stopped
        return pid, pidfd, fds[0], fds[1]

    def _spare(self, host: Host) -> dict[str, Any] | None:
        channel.send(host.sock, {"op": "spare"})
        return channel.receive(host.sock, time.monotonic() + HOST_GUARD, HOST_MESSAGE_BYTES)

    def _free_a_process(self, host: Host) -> bool:
        """Reap what has ended, else end the least recently used live session (not one of
        ``host``'s own being served): whether a process slot may have come free."""
        if _reap():
            return True
        for session, resident in self.residents.items():  # least recently used first
            if resident.parent is not host and self.hosts.get(resident.env) is not host:
                self._end_resident(session, wait=True, reap=True)
                self.evicted += 1
                return True
        return False

    def _run(self, host: Host, request: dict[str, Any], cap: int) -> dict[str, Any]:
        """Run one request in a ready fork of ``host``: write it in, read the answer out.

        The host and everything it started but this fork are at rest (stopped) while the fork
        runs, and /tmp is emptied before the fork starts and after it ends, so nothing the module
        code left running (a thread, a hook, a process) can pass what one call wrote in /tmp on
        to a later fork.
        """
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        taken = self._take_fork(host)
        if taken is None and request.get("env") in self.sources:
            host = self._host(request["env"])  # it died since its last use: one fresh start
            taken = self._take_fork(host)
        if taken is None:
            return {"error": error(SANDBOX_ERROR, "the environment's process stopped answering and was restarted")}
        pid, pidfd, request_fd, answer_fd = taken
        try:
            self._empty_tmp()
            deadline = time.monotonic() + timeout
            try:
                wrote = _write_by(request_fd, protocol.encode_frame(request), deadline)
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
            self._empty_tmp()
        status = self._finish(host, pid, reply=not done)
        if done and answer is not None:
            return answer
        if status is None:
            return {"error": error(SANDBOX_ERROR, "the environment's process stopped answering and was restarted")}
        return {"error": outcome_error(outcome, status & 0xFFFF, overran, timeout, cap)}

    def unprepared(self) -> bool:
        """Whether a host or template has no ready fork (``prepare`` would make one)."""
        return any(not host.ready for host in (*self.hosts.values(), *self.templates.values()))

    def prepare(self) -> None:
        """Between requests (the answer is sent): let each host that handed over its ready fork
        make the next one, so a new session does not wait for a fork."""
        woken = False
        for host in [*self.hosts.values(), *self.templates.values()]:
            if host.ready or host.sock.fileno() < 0:
                continue
            woken = True
            root = host.parent or host
            self._wake(root)
            try:
                channel.send(host.sock, {"op": "prepare"})
                answer = channel.receive(host.sock, time.monotonic() + HOST_GUARD, HOST_MESSAGE_BYTES)
            except OSError:
                answer = None
            if answer is None:
                self._drop(host)
                continue
            host.ready = answer.get("ready") is True
            self._rest(root)
        if woken:
            self._scrub()

    # -- residents ------------------------------------------------------------------------
    def _resident_pids(self) -> set[int]:
        return {r.pid for r in self.residents.values()}

    def _session(self, request: dict[str, Any]) -> dict[str, Any]:
        """Serve an init or call of a session on its resident, starting one when the request
        brings the state (or is the init that makes it)."""
        session, key = request["session"], request["env"]
        resident = self.residents.get(session)
        fresh = request["op"] == "init" or "state" in request
        if resident is not None and (fresh or resident.env != key or resident.version != request.get("version")):
            self._end_resident(session)
            resident = None
        if resident is None and not fresh:
            return {"error": error(NEED_STATE, "this worker holds no live instance of the session at that step")}
        host = self._host(key)
        if resident is None:
            started = self._start_resident(host, request)
            if started is None:
                return {"error": error(SANDBOX_ERROR, "the environment's process stopped answering and was restarted")}
            resident = started
        else:
            del self.residents[session]  # back at the end once it answers: least recently used first
        answer, kept = self._on_resident(resident.parent or host, resident, request, answers.answer_cap(request))
        if kept:
            resident.version, resident.used = int(request.get("next_version", -1)), time.monotonic()
            self.residents[session] = resident
            while len(self.residents) > self.max_residents:
                self._end_resident(next(iter(self.residents)))
            if session in self.residents and self.lends and request.get("lend") is True and self._lent(resident):
                answer["lent"] = True  # (the answer is the process's own, new to this call)
        return answer

    def _start_resident(self, host: Host, request: dict[str, Any]) -> Resident | None:
        """A fork to become the session's resident: of the scenario's template when the request
        names one (its instance is built already), else of the environment's host."""
        key = request["env"]
        template = self._template(host, request) if request["op"] == "init" or _from_template(request) else None
        taken = self._take_fork(template) if template is not None else None
        if taken is not None and template is not None:
            return Resident(key, *taken, parent=template)
        try:
            taken = self._take_fork(host)
        except Unhealthy:
            if not self.residents:
                raise
            # Out of processes: the least recently used live sessions give theirs back.
            for _ in range(max(1, len(self.residents) // 4)):
                self._end_resident(next(iter(self.residents)))
            taken = self._take_fork(host)
        if taken is None and key in self.sources:
            host = self._host(key)  # it died since its last use: one fresh start
            taken = self._take_fork(host)
        return None if taken is None else Resident(key, *taken, parent=host)

    # -- templates ------------------------------------------------------------------------
    def _template(self, host: Host, request: dict[str, Any]) -> Host | None:
        """The template host of ``request``'s ``template`` (built now if this worker has none), or
        None when the request names none or the instance cannot be built ahead (the caller then
        forks the environment's host, and the init reports what went wrong)."""
        name = request.get("template")
        if type(name) is not str or not name:
            return None
        key = f"{request['env']}:{name}"
        # (the service leaves the config out while it expects the template built: see answers.NEED_CONFIG)
        omitted = "init_config" not in request
        if key in self.drawing:
            if omitted and request.get("op") == "init":  # each session builds its own instance
                raise Failure(answers.NEED_CONFIG, "this template's sessions build their own instances")
            return None
        template = self.templates.pop(key, None)
        if template is not None and template.sock.fileno() >= 0:
            template.used = time.monotonic()
            self.templates[key] = template  # most recently used last
            return template
        if request.get("op") != "init" and len(request.get("state") or "") < TEMPLATE_REBUILD_BYTES:
            return None  # a small state decodes faster than a template builds
        if omitted:
            raise Failure(answers.NEED_CONFIG, "the template is not built in this worker")
        while len(self.templates) >= MAX_TEMPLATES:
            self._end_template(next(iter(self.templates)))
        template = self._build_template(host, request)
        if template is not None and template.drew:
            self._end_template_process(template, wait=True)
            self.drawing[key] = None
            while len(self.drawing) > MAX_DRAWING:
                del self.drawing[next(iter(self.drawing))]
            return None
        if template is not None:
            self.templates[key] = template
        return template

    def _build_template(self, host: Host, request: dict[str, Any]) -> Host | None:
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        message = {"op": "template", "init_config": request.get("init_config") or {}, "timeout": timeout,
                   "max_state_bytes": request.get("max_state_bytes", DEFAULTS.state_bytes)}
        template: Host | None = None
        self._wake(host)
        try:
            self._empty_tmp()
            channel.send(host.sock, message)
            answer = channel.receive(host.sock, time.monotonic() + HOST_GUARD, HOST_MESSAGE_BYTES)
            offered = answer.get("pid") if answer else None
            fds = channel.receive_fds(host.sock, 1, time.monotonic() + HOST_GUARD) if type(offered) is int else None
            if fds is None or type(offered) is not int or offered <= 0:
                for fd in fds or ():
                    _close(fd)
                self._rest(host)
                self._drop(host)  # a host that cannot answer this cannot serve anything
                return None
            template = Host(offered, socket.socket(fileno=fds[0]), parent=host, env=request["env"])
            template.pidfd = os.pidfd_open(offered)  # pinned before the check: the host runs module code
            if _parent_of(offered) != host.pid:
                raise OSError(f"the host named {offered}, which is not its child")
            built = channel.receive(template.sock, time.monotonic() + timeout + HOST_GUARD, HOST_MESSAGE_BYTES)
            if built is None or built.get("ok") is not True:
                raise OSError("the scenario's instance could not be built ahead")
            template.drew = built.get("draws") is True
        except OSError:
            if template is not None:
                self._end_template_process(template)
            template = None
        finally:
            self._empty_tmp()
            self._rest(host)
        return template

    def _end_template(self, key: str, *, wait: bool = False) -> None:
        """End a template: its forks and the sessions started from it end with it (they were its
        children); those sessions go cold."""
        template = self.templates.pop(key)
        for session, resident in list(self.residents.items()):
            if resident.parent is template:
                self._end_resident(session)
        self._end_template_process(template, wait=wait)

    def _end_template_process(self, template: Host, *, wait: bool = False) -> None:
        if template.pidfd >= 0:
            end(template.pid, template.pidfd, None)
            if wait:
                exited_by(template.pid, template.pidfd, time.monotonic() + HOST_GUARD)
        _close_host(template)
        if template.parent is not None and template.parent.sock.fileno() >= 0:
            self._finish(template.parent, template.pid, reply=False)

    def _on_resident(self, host: Host, resident: Resident, request: dict[str, Any],
                     cap: int) -> tuple[dict[str, Any], bool]:
        """Run one request on ``resident``: only it runs meanwhile (as in ``_run``); it is stopped
        again once it has answered, or ended if its instance can no longer be trusted."""
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        kept, outcome, overran = False, "timeout", False
        answer: dict[str, Any] | None = None
        try:
            self._empty_tmp()
            for pid in (resident.pid, *resident.stopped):
                _signal(pid, signal.SIGCONT)
            deadline = time.monotonic() + timeout
            if _write_by(resident.request_fd, protocol.encode_frame(request), deadline):
                answer, outcome = read_answer(resident.answer_fd, deadline, cap, keep_open=True)
            kept = outcome == "done" and answer is not None and answers.untouched(answer)
            if kept:
                self._stop_resident(resident)
            else:
                ended = outcome == "done" or outcome != "ended"
                overran = end(resident.pid, resident.pidfd, None if ended else deadline)
        finally:
            if not kept:
                self._empty_tmp()  # (a kept resident is stopped already: the request's scrub empties it)
        if kept and answer is not None:
            return answer, True
        _release(resident)
        report = self._finish(host, resident.pid, reply=outcome != "done")
        if outcome == "done" and answer is not None:
            return answer, False
        if report is None:
            return {"error": error(SANDBOX_ERROR, "the environment's process stopped answering and was restarted")}, False
        return {"error": outcome_error(outcome, report & 0xFFFF, overran, timeout, cap)}, False

    def _lent(self, resident: Resident) -> bool:
        """Hand the service the kept resident's pipes and pidfd (it stays stopped; the service
        wakes it for each call). From now on this worker never writes to it: its version is the
        service's to know, so a request for it that brings no state is answered ``need_state``."""
        assert self.lend is not None
        try:
            socket.send_fds(self.lend, [protocol.LEND_MARK], [resident.request_fd, resident.answer_fd, resident.pidfd])
        except OSError:
            return False
        for fd in (resident.request_fd, resident.answer_fd):
            _close(fd)
        resident.request_fd = resident.answer_fd = -1
        resident.lent, resident.version = True, -2
        return True

    def _touch(self, sessions: list[Any]) -> None:
        """Sessions the service called straight since its last request: used now, for the order in
        which live sessions are let go."""
        now = time.monotonic()
        for session in sessions:
            resident = self.residents.pop(session, None) if type(session) is str else None
            if resident is not None:
                resident.used = now
                self.residents[session] = resident

    def _collect(self, request: dict[str, Any]) -> dict[str, Any]:
        """A lent session's process did not answer its call properly (``outcome``): end it and say
        how it ended, as the error of that call."""
        session, outcome = request.get("session"), str(request.get("outcome"))
        resident = self.residents.pop(session, None) if type(session) is str else None
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        if resident is None:  # ended here before the call reached it: the call never ran
            return {"gone": True}
        # one whose pipe closed may run on until the call's deadline (``wait`` from now): then it overran
        wait = min(max(float(request.get("wait", 0.0)), 0.0), timeout)
        overran = end(resident.pid, resident.pidfd, time.monotonic() + wait if outcome == "ended" else None)
        exited_by(resident.pid, resident.pidfd, time.monotonic() + HOST_GUARD)
        _release(resident)
        host = resident.parent or self.hosts.get(resident.env)
        status = None if host is None or host.sock.fileno() < 0 else self._finish(host, resident.pid, reply=True)
        if status is None:
            return {"error": error(SANDBOX_ERROR, "the environment's process stopped answering and was restarted")}
        return {"error": outcome_error(outcome, status & 0xFFFF, overran, timeout, int(request.get("cap", 0)))}

    def _stop_resident(self, resident: Resident) -> None:
        """Stop it and, a process at a time (each before its children are listed), what it started."""
        _signal(resident.pid, signal.SIGSTOP)
        resident.stopped = []
        if self.limits.processes == 0:
            return  # it cannot have started any
        todo = _children_of(resident.pid)
        while todo:
            pid = todo.pop()
            if pid not in resident.stopped:
                _signal(pid, signal.SIGSTOP)
                resident.stopped.append(pid)
                todo.extend(_children_of(pid))

    def _end_resident(self, session: str, *, wait: bool = False, reap: bool = False) -> None:
        """End a session's live process; with ``wait``, only return once it is gone (and its
        memory with it); with ``reap``, once its host has reaped it too (no trace of it is left)."""
        resident = self.residents.pop(session)
        if resident.lent:
            self.ended.append(session)
        end(resident.pid, resident.pidfd, None)
        if wait:
            exited_by(resident.pid, resident.pidfd, time.monotonic() + HOST_GUARD)
        _release(resident)
        host = resident.parent or self.hosts.get(resident.env)
        if host is not None and host.sock.fileno() >= 0:
            self._finish(host, resident.pid, reply=reap)

    def _finish(self, host: Host, pid: int, *, reply: bool) -> int | None:
        """Have ``host`` reap its ended fork ``pid``; with ``reply``, its wait status (None if the
        host did not answer properly, and it is dropped)."""
        if not reply:  # a host at rest reaps it when next woken, before it answers anything else
            try:
                channel.send(host.sock, {"op": "finish", "pid": pid, "reply": False})
            except OSError:
                self._drop(host)
            return None
        root = host.parent or host
        self._wake(root)
        try:
            channel.send(host.sock, {"op": "finish", "pid": pid, "reply": True})
            report = channel.receive(host.sock, time.monotonic() + HOST_GUARD, HOST_MESSAGE_BYTES)
        except OSError:
            report = None
        status = None if report is None else report.get("status")
        if report is None or type(status) is not int:
            self._drop(host)
            return None
        self._rest(root)
        return status

    def _expire_residents(self) -> None:
        idle = time.monotonic() - self.resident_idle
        for session, resident in list(self.residents.items()):
            if resident.used > idle:
                break
            self._end_resident(session)
        parents = {id(resident.parent) for resident in self.residents.values()}
        for key, template in list(self.templates.items()):
            if template.used <= idle and id(template) not in parents:
                self._end_template(key)

    def _fit_memory(self) -> None:
        """End the least recently used live sessions while the worker's memory leaves less room
        than one call may take, so that no running call, new session or worker is ever what the
        kernel ends when the group is full."""
        limit = self.gauge.limit() if self.gauge is not None else None
        if self.gauge is None or limit is None:
            return
        room = limit - self.limits.memory_bytes - MEMORY_SLACK
        while self.residents and self.gauge.used() > room:
            self._end_resident(next(iter(self.residents)), wait=True)
            self.evicted += 1
        while self.templates and self.gauge.used() > room:
            self._end_template(next(iter(self.templates)), wait=True)

    def _score(self, request: dict[str, Any]) -> dict[str, Any]:
        host = self._host(request["env"])
        results: list[dict[str, Any]] = []
        restarted = False
        for index, source in enumerate(request["checks"]):
            if host.sock.fileno() < 0:  # a check broke the host; the one restart is spent
                if restarted:
                    results.append({"passed": False, "error": "sandbox_error: not run (an earlier check broke "
                                                              "the environment's process)"})
                    continue
                host, restarted = self._host(request["env"]), True
            check = {"op": "check", "index": index, "source": source, "state": request["state"],
                     "initial": request["initial"], "timeout": request.get("timeout", DEFAULT_TIMEOUT)}
            outcome = self._run(host, check, 1 << 20)
            if type(outcome.get("passed")) is not bool:
                failure = outcome.get("error")
                if not isinstance(failure, dict):
                    failure = {"type": SANDBOX_ERROR, "message": "the check sent no answer"}
                outcome = {"passed": False, "error": f"{failure.get('type')}: {failure.get('message')}"}
            reason = outcome.get("error")
            results.append({"passed": outcome.get("passed") is True,
                            "error": None if reason is None else str(reason)[:1000]})
        return {"checks": results}

    # -- hygiene --------------------------------------------------------------------------
    def _reap(self) -> None:
        if self.zygote_pid in _reap():
            self.unhealthy = True  # without its zygote the worker can start no environment
    def _scrub(self) -> None:
        """Leave nothing from this request for the next one. Nothing here may raise: the answer is
        owed all the same, and a worker that cannot tidy up is one to replace, not to end."""
        try:
            self._expire_residents()
            self._reap()
            self._fit_memory()
            if not self.private_tmp:
                return
            self._empty_tmp()
            if self.filter_missing is not None:  # else the seccomp filter keeps environment code from making any
                contain.clear_ipc()
        except Exception:
            self.unhealthy = True

    def _empty_tmp(self) -> None:
        """Empty /tmp (see ``sandbox.worker.scratch``); one that cannot be emptied makes this worker one to
        replace, so that nothing in it reaches another session."""
        if not self.private_tmp:
            return
        try:
            tmp = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self.unhealthy = True
            return
        try:
            if os.fstat(tmp).st_uid == os.geteuid():  # (a /tmp of its own uid only where confinement is partial)
                os.fchmod(tmp, self.tmp_mode)
            emptied = scratch.empty(tmp, keep=lambda name: _preserved(f"/tmp/{name}", self.preserve))
        except OSError:
            emptied = False
        finally:
            os.close(tmp)
        if not emptied:
            self.unhealthy = True


def _preserved(path: str, preserve: list[str]) -> bool:
    """Whether ``path`` holds a folder confinement put back inside /tmp (never emptied)."""
    return any(p == path or p.startswith(path + "/") for p in preserve)


def _from_template(request: dict[str, Any]) -> bool:
    """A call bringing a state kept against a template's initial state (see ``Stored``)."""
    return request["op"] == "call" and "state" in request and isinstance(request.get("delta"), dict) \
        and type(request.get("known")) is str


def _processes() -> list[tuple[int, int]]:
    """(pid, parent pid) of every process this worker can see: its own namespace's."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    found.append((int(entry), int(stat.read().rsplit(")", 1)[1].split()[1])))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _release(resident: Resident) -> None:
    for fd in (resident.request_fd, resident.answer_fd, resident.pidfd):
        _close(fd)
    resident.request_fd = resident.answer_fd = resident.pidfd = -1


def _children_of(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (one read per thread, no scan of /proc)."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as listing:
                found.extend(int(child) for child in listing.read().split())
        except (OSError, ValueError):
            continue
    return found


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _close_host(host: Host) -> None:
    host.sock.close()
    _close(host.pidfd)
    host.pidfd = -1


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _reap() -> set[int]:
    """Wait for ended children and orphans (the worker is a subreaper, or PID 1 of its namespace)."""
    reaped: set[int] = set()
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.add(pid)


def _write_by(fd: int, data: bytes, deadline: float) -> bool:
    """Write all of ``data`` unless ``deadline`` passes first (a fork that stopped reading)."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    while view:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([], [fd], [], wait)[1]:
            return False
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue
        except OSError:
            return True  # it is gone; reading its answer tells how it ended
    return True
