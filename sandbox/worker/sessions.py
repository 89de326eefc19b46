"""The sessions a worker keeps live: each one's *resident*, a fork holding its instance.

An init or call naming a ``session`` (with its ``version``, the step it is at, and
``next_version``) is served by a fork that then stays, as that session's resident, holding the
live instance; a later call at the version it holds may leave ``state`` out (else it answers
``need_state``). Where the worker lends (see ``sandbox.lane``), the service takes the resident's
pipes and calls it straight; the worker still owns the process and ends it.

A resident runs only while its own session's request is served: it is stopped (SIGSTOP) the
moment it has answered, and ended as soon as a call may have changed its instance without the
change being answered (a tool raised, timed out, ran out of memory or printed too much), or when
its host goes, it is the least recently used one past ``max_residents``, it idled too long, its
session or environment was deleted, or the worker's memory (measured from its cgroup after every
request) leaves less room than one call may take: then the least recently used go first.

Standard library only.
"""

from __future__ import annotations

import signal
import socket
import time
from typing import Any

from sandbox.wire import answers, protocol
from sandbox.wire.answers import NEED_STATE, error
from sandbox.wire.limits import DEFAULTS, MAX_LODGED
from sandbox.worker import lodge, processes, templatelodge
from sandbox.worker.forks import DEFAULT_TIMEOUT, SANDBOX_ERROR, Failure, end, exited_by, outcome_error, read_answer
from sandbox.worker.hosts import Host, Hosts, Resident, release
from sandbox.worker.memory import Gauge
from sandbox.worker.runner import RESTARTED, Runner
from sandbox.worker.templates import Templates, from_template
from sandbox.worker.zygote import HOST_GUARD, Unhealthy

# Live sessions a worker keeps by default, and how long an unused one stays.
MAX_RESIDENTS = DEFAULTS.residents
RESIDENT_IDLE = DEFAULTS.resident_idle
# The least memory a lodge's sessions may hold (beyond one call's limit) where the worker cannot
# measure its room.
LODGE_BYTES = 1 << 30
# The largest stored state a session may have to be lodged (a process of its own costs about 3 MB).
LODGE_STATE_BYTES = 128 << 10
# What a lodged session is taken to hold: its stored text times this, plus this, and a lodge holds
# the least recently used out past half the room its worker has for live sessions.
LODGED_WEIGHT = 16
LODGED_OVERHEAD = 256 << 10
# Template keys remembered as not to be lodged (see ``Sessions.unlodgeable``).
MAX_UNLODGEABLE = 4096
# Room kept free beyond one call's own memory limit (the worker's own work on its answer).
MEMORY_SLACK = 32 << 20


class Sessions:
    def __init__(self, hosts: Hosts, runner: Runner, templates: Templates, *, max_residents: int = MAX_RESIDENTS,
                 resident_idle: float = RESIDENT_IDLE, gauge: Gauge | None = None) -> None:
        self.hosts = hosts
        self.runner = runner
        self.templates = templates
        self.residents = hosts.residents  # (the hosts' own dict) by session id, least recently used first
        self.max_residents = max_residents
        self.resident_idle = resident_idle
        self.gauge = gauge  # the worker's memory cgroup, when one can be read
        # What live sessions may hold, and what the group held after the last request (``fit_memory``).
        self.room: int | None = None
        self.used = 0
        # Sessions live in a lodge (see ``sandbox.worker.lodge``): the lodge's key, the step it holds
        # the session at and the lodge's pid; each lodge's sessions (least recently used first) and
        # when each was last used; and those a lodge must drop before its next request.
        self.lodged: dict[str, tuple[str, int, int]] = {}
        self.members: dict[str, dict[str, float]] = {}
        self.forgotten: dict[str, list[str]] = {}
        # What each lodged session is taken to hold, and each lodge in all (``_weigh``).
        self.weights: dict[str, int] = {}
        self.load: dict[str, int] = {}
        self.max_lodged = MAX_LODGED
        # Templates whose lodge ended on a call it could not undo: their sessions keep processes.
        self.unlodgeable: dict[str, None] = {}

    def serve(self, request: dict[str, Any], lend: socket.socket | None) -> dict[str, Any]:
        """Serve an init or call of a session on its resident, starting one when the request
        brings the state (or is the init that makes it). With ``lend`` (where the service may
        call kept sessions straight), a kept resident the request asks to lend is lent there."""
        session, key = request["session"], request["env"]
        resident = self.residents.get(session)
        fresh = request["op"] == "init" or "state" in request or from_template(request)
        if resident is not None and (fresh or resident.env != key or resident.version != request.get("version")):
            self.hosts.end_resident(session)
            resident = None
        lodged = None
        if resident is None and request["op"] == "call":
            lodged = self._lodged(request)
        elif resident is None:
            self._unlodge(session)  # (an init makes the session anew)
        if resident is None and not fresh and lodged is None:
            return {"error": error(NEED_STATE, "this worker holds no live instance of the session at that step")}
        host = self.hosts.host(key)
        if lodged is not None or resident is None and self._full(request):
            return self._in_lodge(host, request, lodged)
        template = self._lodging_template(request) if resident is None else None
        if template is not None:
            return self._in_lodge(host, request, None, template)
        if resident is None:
            started = self._start(host, request)
            if started is None:
                return {"error": error(SANDBOX_ERROR, RESTARTED)}
            resident = started
        else:
            del self.residents[session]  # back at the end once it answers: least recently used first
        answer, kept = self._on_resident(resident.parent or host, resident, request, answers.answer_cap(request))
        if kept:
            resident.version, resident.used = int(request.get("next_version", -1)), time.monotonic()
            self.residents[session] = resident
            while len(self.residents) > self.max_residents:
                self.hosts.end_resident(next(iter(self.residents)))
            if session in self.residents and lend is not None and request.get("lend") is True \
                    and _lend(lend, resident):
                answer["lent"] = True  # (the answer is the process's own, new to this call)
        return answer

    def _start(self, host: Host, request: dict[str, Any]) -> Resident | None:
        """A fork to become the session's resident: of the scenario's template when the request
        names one (its instance is built already), else of the environment's host."""
        key = request["env"]
        template = self.templates.template(host, request) if request["op"] == "init" or from_template(request) \
            else None
        if "state" not in request and request["op"] == "call" and (template is None or template.digest != request["known"]):
            # The service kept the stored text back for the template to make (``resident.withheld``):
            # this worker's is not that state (an ``__init__`` that reads the clock builds another).
            raise Failure(NEED_STATE, "this worker's template is not the session's base: the stored state is needed")
        taken = self.runner.take(template) if template is not None else None
        if taken is not None and template is not None:
            return Resident(key, *taken, parent=template)
        return self._fork(host, key)

    def _fork_template(self, template: Host, request: dict[str, Any]) -> Resident | None:
        """A fork of ``template``, to be the lodge of its sessions (None: it broke)."""
        template.used = time.monotonic()
        taken = self.runner.take(template)
        return None if taken is None else Resident(request["env"], *taken, parent=template)

    def _fork(self, host: Host, key: str) -> Resident | None:
        """A fork of the environment's host, to serve a session (None: the host broke)."""
        try:
            taken = self.runner.take(host)
        except Unhealthy:
            if not self.residents:
                raise
            # Out of processes: the least recently used live sessions give theirs back.
            for _ in range(max(1, len(self.residents) // 4)):
                self.hosts.end_resident(next(iter(self.residents)))
            taken = self.runner.take(host)
        if taken is None and key in self.hosts.sources:
            host = self.hosts.host(key)  # it died since its last use: one fresh start
            taken = self.runner.take(host)
        return None if taken is None else Resident(key, *taken, parent=host)

    def _full(self, request: dict[str, Any]) -> bool:
        """Whether a session that must be rebuilt goes to a lodge: the worker keeps as many
        processes of live sessions as it may, or its memory (as last measured) leaves no room for
        another; the request names the tenant (``scope``) a lodge is kept for."""
        if request["op"] != "call" or type(request.get("scope")) is not str or self.max_residents <= 0:
            return False
        # A large state is cheaper in a process of its own, forked from its template, whose pages
        # it shares: a lodge holds a whole copy of every state.
        state = request.get("state")
        size = len(state) if type(state) is str else request.get("state_bytes")
        if type(size) is not int or size > LODGE_STATE_BYTES:
            return False
        return self._no_room()

    def _no_room(self) -> bool:
        """Whether the worker keeps as many live sessions' processes as it may."""
        if len(self.residents) >= self.max_residents:
            return True
        return self.room is not None and self.used > self.room - MEMORY_SLACK

    def _lodging_template(self, request: dict[str, Any]) -> Host | None:
        """The template in whose lodge a session that must be rebuilt is kept when the worker is
        full (see ``sandbox.worker.templatelodge``): its state is kept against a template this
        worker holds built, by entries changed in place, and no lodge of that template has ended
        on a call it could not undo."""
        if request["op"] != "call" or type(request.get("scope")) is not str or self.max_residents <= 0 \
                or not from_template(request) or not templatelodge.lodgeable(request["delta"]) or not self._no_room():
            return None
        key = f"{request['env']}:{request.get('template')}"
        template = self.hosts.templates.get(key)
        if template is None or key in self.unlodgeable or template.digest != request["known"] \
                or template.sock.fileno() < 0:
            return None
        return template

    def _lodged(self, request: dict[str, Any]) -> str | None:
        """The lodge holding the session live at the step the request names, if one does."""
        found = self.lodged.get(request["session"])
        if found is None:
            return None
        name, version, pid = found
        process = self.residents.get(name)
        if process is None or process.pid != pid or version != request.get("version") or \
                process.env != request["env"]:
            self._unlodge(request["session"])
            return None
        return name

    def _in_lodge(self, host: Host, request: dict[str, Any], name: str | None,
                  template: Host | None = None) -> dict[str, Any]:
        """Serve the request in the lodge of its environment and tenant (see ``sandbox.worker.lodge``),
        or of its ``template`` (``sandbox.worker.templatelodge``), where the session then stays
        live: no session's process ends to make room for it."""
        session = request["session"]
        if name is None and template is not None:
            name = lodge.key(request["scope"], request["env"], f"{request['env']}:{request['template']}")
        elif name is None:
            if "state" not in request:  # a delta for a template to complete: no fork of one is made here
                return {"error": error(NEED_STATE, "this worker keeps no more live sessions' processes: "
                                                   "the stored state is needed")}
            name = lodge.key(request["scope"], request["env"])
        # Until it answers (the lodge itself drops the instance if the call fails, and a request
        # with the state replaces whatever it held).
        self._unlodge(session, told=True)
        process = self.residents.pop(name, None)
        if process is None:
            process = self._fork(host, request["env"]) if template is None else self._fork_template(template, request)
            if process is None:
                return {"error": error(SANDBOX_ERROR, RESTARTED)}
            for gone in (*self.members.get(name, {}), session):  # whatever the last one held went with it
                self.lodged.pop(gone, None)
                self.weights.pop(gone, None)
            self.members[name], self.forgotten[name], self.load[name] = {}, [], 0
        # What its sessions may hold: the worker's room for live sessions where it is measured.
        holds = self.room if self.room is not None else LODGE_BYTES
        sent = {**request, lodge.FLAG: True, lodge.HOLDS: max(holds, LODGE_BYTES)}
        forget = self.forgotten.pop(name, None)
        if forget:
            sent[lodge.FORGET] = forget
        answer, kept = self._on_resident(process.parent or host, process, sent, answers.answer_cap(request), stays=True)
        answer.pop("stays", None)
        dropped, keeps = answer.pop(templatelodge.DROPPED, None), answer.pop(templatelodge.KEEPS, None)
        if not kept:
            self.weights.pop(session, None)
            if (key := lodge.template_of(name)) is not None:  # it could not undo a call: no more lodges of it
                self.unlodgeable[key] = None
                while len(self.unlodgeable) > MAX_UNLODGEABLE:
                    del self.unlodgeable[next(iter(self.unlodgeable))]
            return answer
        process.used = time.monotonic()
        self.residents[name] = process
        if not answers.untouched(answer) or dropped is True:  # the lodge dropped its instance
            self.load[name] = self.load.get(name, 0) - self.weights.pop(session, 0)
        else:
            members = self.members.setdefault(name, {})
            members[session] = process.used
            self.lodged[session] = (name, int(request.get("next_version", -1)), process.pid)
            if type(keeps) is int:  # (a template lodge keeps the session's delta alone)
                self._weigh(name, session, keeps)
            else:
                self._weigh(name, session, answer.get("state") or request.get("state"))
            answer[lodge.FLAG] = True
            budget = (self.room if self.room is not None else LODGE_BYTES) // 2
            while len(members) > self.max_lodged or len(members) > 1 and self.load[name] > budget:
                self._unlodge(next(iter(members)))  # the least recently used go cold
        return answer

    def _weigh(self, name: str, session: str, text: Any) -> None:
        """What a lodged session is taken to hold, from its stored text when a request or answer
        carries it, or the size of what a template lodge keeps of it (the live objects of a state
        take many times its text; ``LODGED_WEIGHT``)."""
        size = len(text) if isinstance(text, str) else text if isinstance(text, int) else None
        if size is None:
            return
        weight = LODGED_WEIGHT * size + LODGED_OVERHEAD
        self.load[name] = self.load.get(name, 0) + weight - self.weights.get(session, 0)
        self.weights[session] = weight

    def _unlodge(self, session: str, *, told: bool = False) -> None:
        """Forget that a lodge holds ``session``; it drops the instance before its next request
        (``told``: that request is this session's own, which says what to do with it)."""
        found = self.lodged.pop(session, None)
        if found is not None:
            self.members.get(found[0], {}).pop(session, None)
            if not told:  # (told: its weight stays counted until the answer says whether it stays)
                self.load[found[0]] = self.load.get(found[0], 0) - self.weights.pop(session, 0)
                self.forgotten.setdefault(found[0], []).append(session)

    def forget(self, session: str) -> None:
        """A deleted session: its lodge (if one holds it) drops the instance before this request is
        answered, as a session's own process would end."""
        found = self.lodged.get(session)
        if found is None:
            return
        self._unlodge(session)
        process = self.residents.pop(found[0], None)
        host = None if process is None else process.parent or self.hosts.hosts.get(process.env)
        if process is None or host is None:
            return
        request = {"op": "forget", "session": session, lodge.FLAG: True,
                   lodge.FORGET: self.forgotten.pop(found[0], [])}
        _, kept = self._on_resident(host, process, request, 1 << 16, stays=True)
        if kept:
            self.residents[found[0]] = process

    def _on_resident(self, host: Host, resident: Resident, request: dict[str, Any],
                     cap: int, *, stays: bool = False) -> tuple[dict[str, Any], bool]:
        """Run one request on ``resident``: only it runs meanwhile (as in ``Runner.run``); it is
        stopped again once it has answered, or ended if its instance can no longer be trusted
        (``stays``: a lodge, which says so itself, as its answer's ``stays``)."""
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        kept, outcome, overran = False, "timeout", False
        answer: dict[str, Any] | None = None
        try:
            self.hosts.empty_tmp()
            for pid in (resident.pid, *resident.stopped):
                processes.kill(pid, signal.SIGCONT)
            deadline = time.monotonic() + timeout
            if processes.write_by(resident.request_fd, protocol.encode_frame(request), deadline):
                answer, outcome = read_answer(resident.answer_fd, deadline, cap, keep_open=True)
            kept = outcome == "done" and answer is not None and (
                answer.get("stays") is True if stays else answers.untouched(answer))
            if kept:
                self._stop(resident)
            else:
                ended = outcome == "done" or outcome != "ended"
                overran = end(resident.pid, resident.pidfd, None if ended else deadline)
        finally:
            if not kept:
                self.hosts.empty_tmp()  # (a kept resident is stopped already: the request's scrub empties it)
        if kept and answer is not None:
            return answer, True
        release(resident)
        report = self.hosts.finish(host, resident.pid, reply=outcome != "done")
        if outcome == "done" and answer is not None:
            return answer, False
        if report is None:
            return {"error": error(SANDBOX_ERROR, RESTARTED)}, False
        return {"error": outcome_error(outcome, report & 0xFFFF, overran, timeout, cap)}, False

    def _stop(self, resident: Resident) -> None:
        """Stop it and, a process at a time (each before its children are listed), what it started."""
        processes.kill(resident.pid, signal.SIGSTOP)
        resident.stopped = []
        if self.hosts.limits.processes == 0:
            return  # it cannot have started any
        todo = processes.children_of(resident.pid)
        while todo:
            pid = todo.pop()
            if pid not in resident.stopped:
                processes.kill(pid, signal.SIGSTOP)
                resident.stopped.append(pid)
                todo.extend(processes.children_of(pid))

    def touch(self, sessions: list[Any]) -> None:
        """Sessions the service called straight since its last request: used now, for the order in
        which live sessions are let go."""
        now = time.monotonic()
        for session in sessions:
            resident = self.residents.pop(session, None) if type(session) is str else None
            if resident is not None:
                resident.used = now
                self.residents[session] = resident

    def collect(self, request: dict[str, Any]) -> dict[str, Any]:
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
        release(resident)
        host = resident.parent or self.hosts.hosts.get(resident.env)
        status = None if host is None or host.sock.fileno() < 0 else self.hosts.finish(host, resident.pid, reply=True)
        if status is None:
            return {"error": error(SANDBOX_ERROR, RESTARTED)}
        return {"error": outcome_error(outcome, status & 0xFFFF, overran, timeout, int(request.get("cap", 0)))}

    def expire(self) -> None:
        """End the residents, and the templates none of them came from, unused for ``resident_idle``;
        lodges drop their sessions unused for as long."""
        idle = time.monotonic() - self.resident_idle
        for members in self.members.values():
            while members and next(iter(members.values())) <= idle:
                self._unlodge(next(iter(members)))
        for session, resident in list(self.residents.items()):
            if resident.used > idle:
                break
            self.hosts.end_resident(session)
        unused = [key for key, template in self.hosts.templates.items() if template.used <= idle]
        if not unused:
            return  # (most requests: the live sessions need not be looked through)
        parents = {id(resident.parent) for resident in self.residents.values()}
        for key in unused:
            if id(self.hosts.templates[key]) not in parents:
                self.hosts.end_template(key)

    def fit_memory(self) -> None:
        """End the least recently used live sessions while the worker's memory leaves less room
        than one call may take, so that no running call, new session or worker is ever what the
        kernel ends when the group is full."""
        limit = self.gauge.limit() if self.gauge is not None else None
        if self.gauge is None or limit is None:
            return
        room = limit - self.hosts.limits.memory_bytes - MEMORY_SLACK
        used = self.gauge.used()
        while self.residents and used > room:
            self.hosts.end_resident(next(iter(self.residents)), wait=True)
            self.hosts.evicted += 1
            used = self.gauge.used()
        while self.hosts.templates and used > room:
            self.hosts.end_template(next(iter(self.hosts.templates)), wait=True)
            used = self.gauge.used()
        self.room, self.used = room, used


def _lend(sock: socket.socket, resident: Resident) -> bool:
    """Hand the service the kept resident's pipes and pidfd over ``sock`` (it stays stopped; the
    service wakes it for each call). From now on this worker never writes to it: its version is the
    service's to know, so a request for it that brings no state is answered ``need_state``."""
    try:
        socket.send_fds(sock, [protocol.LEND_MARK], [resident.request_fd, resident.answer_fd, resident.pidfd])
    except OSError:
        return False
    for fd in (resident.request_fd, resident.answer_fd):
        processes.close(fd)
    resident.request_fd = resident.answer_fd = -1
    resident.lent, resident.version = True, -2
    return True
