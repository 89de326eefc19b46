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

Processes: the worker forks one clean *zygote* (``zygote``) before it reads any request; the
zygote forks a *host* per environment (``hosts``), which runs the module code once and keeps a
ready fork of itself. Each init, call and check runs in such a fork (``runner``), in a fork of a
scenario's instance built ahead (``templates``), or on the session's live process
(``sessions``). After every request the worker also empties /tmp and System V IPC objects (which
the seccomp filter keeps environment code from making), and lets go of what idled too long or
leaves too little memory. Everything a fork answers is checked and only the fields of the
request's kind pass on.

Standard library only.
"""

from __future__ import annotations

import socket
from typing import Any

from sandbox.wire import answers
from sandbox.wire.answers import NEED_STATE, error
from sandbox.worker import budget, lodge
from sandbox.worker.confine import contain
from sandbox.worker.forks import DEFAULT_TIMEOUT, SANDBOX_ERROR, Failure, WorkerLimits, decode_answer
from sandbox.worker.hosts import Hosts
from sandbox.worker.memory import Gauge, share_of
from sandbox.worker.runner import Runner
from sandbox.worker.sessions import MAX_RESIDENTS, RESIDENT_IDLE, Sessions
from sandbox.worker.templates import Templates
from sandbox.worker.zygote import HOST_GUARD, Unhealthy, Zygote


class Runtime:
    def __init__(self, limits: WorkerLimits, *, private_tmp: bool = False, preserve: list[str] | None = None,
                 own_processes: bool = False, filter_syscalls: bool = True,
                 max_residents: int = MAX_RESIDENTS, resident_idle: float = RESIDENT_IDLE,
                 gauge: Gauge | None = None, lend: socket.socket | None = None) -> None:
        self.limits = limits
        # Where the service takes the pipes of the sessions it calls straight (see ``lends``).
        self.lend = lend
        self.private_tmp = private_tmp
        self.gauge = gauge  # the worker's memory cgroup, when one can be read
        budget.set_limits(limits, max_residents)
        # Other processes of our uid (every fork runs environment code) must not read our memory,
        # which holds every session's requests, nor open our descriptors through /proc.
        contain.make_undumpable()
        contain.become_subreaper()  # orphans of a killed host come back here to be reaped
        self.hosts = Hosts(limits, Zygote(limits, filter_syscalls=filter_syscalls), own_processes=own_processes,
                           private_tmp=private_tmp, preserve=preserve)
        self.runner = Runner(self.hosts)
        self.templates = Templates(self.hosts)
        self.sessions = Sessions(self.hosts, self.runner, self.templates, max_residents=max_residents,
                                 resident_idle=resident_idle, gauge=gauge)

    @property
    def filter_missing(self) -> str | None:
        """Why the zygote holds no seccomp filter (None: it does)."""
        return self.hosts.zygote.filter_missing

    @property
    def paths_missing(self) -> str | None:
        """Why hosts do not hide /proc, /sys and /dev (None: they do)."""
        return self.hosts.zygote.paths_missing

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
                self.sessions.touch(request["touched"])
            match op:
                case "load":
                    self.hosts.load(request)
                    response: dict[str, Any] = {"ok": True}
                case "ping":  # the pool checks idle workers are alive
                    response = {"ok": True}
                case "prepare":  # the pool asks while nothing else may run here (see ``prepare``)
                    self.prepare()
                    response = {"ok": True}
                case "collect":
                    response = self.sessions.collect(request)
                case "check":  # a lent process's answer, too large for the service's event loop
                    raw = request.get("answer")
                    answer = decode_answer(raw) if isinstance(raw, bytes) else answers.malformed()
                    response = answers.checked("call", answer, request)
                case "validate":
                    answer = self.hosts.zygote.ask(request, float(request.get("timeout", DEFAULT_TIMEOUT)) + HOST_GUARD)
                    response = answers.checked(op, answer, request)
                case "init" | "call" if type(request.get("session")) is str:
                    answer = self.sessions.serve(request, self.lend if self.lends else None)
                    failure = answer.get("error")
                    if isinstance(failure, dict) and failure.get("type") == NEED_STATE:
                        return {"id": request.get("id"), "error": answer["error"]}
                    lent = answer.pop("lent", None) is True
                    lodged = answer.pop(answers.LODGED, None) is True
                    response = answers.checked(op, answer, request)
                    if lent:  # its descriptors are on their way, whatever the check found
                        response["lent"] = True
                    if lodged and response.get("error") is None:
                        response[answers.LODGED] = True
                case "init" | "call":
                    host = self.hosts.host(request["env"])
                    template = self.templates.template(host, request)
                    answer = self.runner.run(template or host, request, answers.answer_cap(request))
                    response = answers.checked(op, answer, request)
                case "score":
                    response = self._score(request)
                case _:
                    response = {"error": error(SANDBOX_ERROR, f"unknown op {op!r}")}
        except Failure as exc:
            response = {"error": error(exc.kind, exc.message)}
        except Unhealthy as exc:
            self.hosts.unhealthy = True
            response = {"error": error(SANDBOX_ERROR, str(exc))}
        except Exception as exc:  # a bug here must reach the service as a sandbox error, not kill the worker
            response = {"error": error(SANDBOX_ERROR, f"worker failed: {type(exc).__name__}: {exc}")}
        finally:
            self._scrub()
        if self.hosts.unhealthy:
            response["unhealthy"] = True
        if self.hosts.ended:
            response["ended"], self.hosts.ended = self.hosts.ended, []
        if self.lend is not None:
            response["unprepared"] = self.unprepared()
        if request.get("stats") is True:
            response["memory"] = self.memory()
        response["id"] = request.get("id")
        return response

    def memory(self) -> dict[str, Any]:
        """Live sessions, what their processes hold, the worker's measured memory, evictions."""
        limit = self.gauge.limit() if self.gauge is not None else None
        lodges = sum(1 for name in self.hosts.residents if lodge.is_lodge(name))
        return {"live": len(self.hosts.residents) - lodges + len(self.sessions.lodged),
                "templates": len(self.hosts.templates),
                "live_bytes": sum(share_of(r.pid) for r in self.hosts.residents.values()),
                "used": self.gauge.used() if self.gauge is not None else None, "limit": limit,
                "evicted": self.hosts.evicted}

    def unprepared(self) -> bool:
        """Whether a host or template has no ready fork (``prepare`` would make one)."""
        return self.runner.unprepared()

    def prepare(self) -> None:
        """Between requests (the answer is sent): let each host that handed over its ready fork
        make the next one, so a new session does not wait for a fork."""
        if self.runner.prepare():
            self._scrub()

    def _end(self, ending: dict[str, Any]) -> None:
        for session in ending.get("sessions") or ():
            if session in self.hosts.residents:  # (deleted: gone without a trace before this answer)
                self.hosts.end_resident(session, reap=True)
            self.sessions.forget(session)
        for key in ending.get("envs") or ():
            self.hosts.sources.pop(key, None)
            if key in self.hosts.hosts:
                self.hosts.stop_host(key)

    def _score(self, request: dict[str, Any]) -> dict[str, Any]:
        host = self.hosts.host(request["env"])
        results: list[dict[str, Any]] = []
        restarted = False
        for index, source in enumerate(request["checks"]):
            if host.sock.fileno() < 0:  # a check broke the host; the one restart is spent
                if restarted:
                    results.append({"passed": False, "error": "sandbox_error: not run (an earlier check broke "
                                                              "the environment's process)"})
                    continue
                host, restarted = self.hosts.host(request["env"]), True
            check = {"op": "check", "index": index, "source": source, "state": request["state"],
                     "initial": request["initial"], "timeout": request.get("timeout", DEFAULT_TIMEOUT)}
            outcome = self.runner.run(host, check, 1 << 20)
            if type(outcome.get("passed")) is not bool:
                failure = outcome.get("error")
                if not isinstance(failure, dict):
                    failure = {"type": SANDBOX_ERROR, "message": "the check sent no answer"}
                outcome = {"passed": False, "error": f"{failure.get('type')}: {failure.get('message')}"}
            reason = outcome.get("error")
            results.append({"passed": outcome.get("passed") is True,
                            "error": None if reason is None else str(reason)[:1000]})
        return {"checks": results}

    def _scrub(self) -> None:
        """Leave nothing from this request for the next one. Nothing here may raise: the answer is
        owed all the same, and a worker that cannot tidy up is one to replace, not to end."""
        try:
            self.sessions.expire()
            self.hosts.reap()
            self.sessions.fit_memory()
            if not self.private_tmp:
                return
            self.hosts.empty_tmp()
            if self.filter_missing is not None:  # else the seccomp filter keeps environment code from making any
                contain.clear_ipc()
        except Exception:
            self.hosts.unhealthy = True
