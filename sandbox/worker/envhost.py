"""An environment's own process: its class compiled once, every request run in a fork of it.

The worker never runs environment code itself. For each environment it forks
a host process that compiles the class (module code runs there, once) and
then serves that environment's inits, calls and checks, each in a fork of
itself. Module code therefore only ever shares a process with requests for
its own environment, and nothing a call does outlives the call.

Standard library only.
"""

from __future__ import annotations

import builtins
import functools
import gc
import json
import linecache
import os
import resource
import signal
import socket
import sys
import time
import types
from collections.abc import Callable
from typing import Any

from sandbox.state import decoder, encoder, signatures
from sandbox.state.readonly import ReadOnly
from sandbox.wire.answers import error
from sandbox.worker import channel, lodge, randomness, rehearsal
from sandbox.worker.confine import seccomp
from sandbox.worker.confine.contain import die_with_parent
from sandbox.worker.forks import (
    DEFAULT_TIMEOUT,
    SANDBOX_ERROR,
    TIMEOUT,
    TOOL_EXCEPTION,
    CappedOutput,
    Deadline,
    Failure,
    Interrupt,
    Spare,
    WorkerLimits,
    close_inherited,
    describe,
    detach_standard_streams,
    finish,
    hide_paths,
    in_fork,
    reap,
    spawn_spare,
)
from sandbox.worker.lodge import LODGE_SPACE, Lodge
from sandbox.worker.resident import LiveSession, instantiate, public_state, resolver
from sandbox.worker.templatelodge import TemplateLodge


def module_name(key: str) -> str:
    return f"ef_env_{key[:16]}"


def compile_env(key: str, env_id: str, class_name: str, code: str, timeout: float,
                output_bytes: int) -> tuple[types.ModuleType, type]:
    """Run the module code of an environment in this process and return its class.

    Raises:
        Failure: kind ``syntax_error``, ``import_error``, ``load_error``, ``timeout`` or ``missing_class``.
    """
    filename = f"<env {env_id}>"
    try:
        compiled = compile(code, filename, "exec")
    except SyntaxError as exc:
        raise Failure("syntax_error", f"syntax error at line {exc.lineno}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise Failure("syntax_error", f"source cannot be compiled ({type(exc).__name__})") from None
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    module = types.ModuleType(module_name(key))
    module.__file__ = filename
    sys.modules[module.__name__] = module  # pickle finds the environment's classes here
    try:
        _within_deadline(lambda: exec(compiled, module.__dict__), timeout, output_bytes, "load")
    except Failure:
        raise
    except ImportError as exc:
        raise Failure("import_error", describe(exc)) from None
    except BaseException as exc:
        raise Failure("load_error", describe(exc)) from None
    cls = module.__dict__.get(class_name)
    if not isinstance(cls, type):
        raise Failure("missing_class", f"the code defines no class named {class_name!r}")
    return module, cls


def use_layers(layers: list[str], root: str) -> None:
    """Put an environment's package layers first on ``sys.path``, before its module code runs.

    Only this environment's host (and its forks) gets them: other environments' hosts are forks
    of the same zygote, which never imports from a layer.

    Raises:
        Failure: kind ``import_error``, a layer outside the worker's layers root or missing.
    """
    for layer in reversed(layers):
        real = os.path.realpath(layer)
        if not root or not real.startswith(root.rstrip("/") + "/"):
            raise Failure("import_error", f"package layer {layer} is outside this worker's layers root "
                                          f"({root or 'none configured'})")
        if not os.path.isdir(real):
            raise Failure("import_error", f"package layer {layer} is not visible in this sandbox worker")
        sys.path.insert(0, real)


def _raise_deadline(signum: int, frame: Any) -> None:
    raise Deadline()


def validate(request: dict[str, Any], limits: WorkerLimits) -> dict[str, Any]:
    """Load and instantiate with ``{}``, in a throwaway fork, exactly as a real load would."""
    timeout = float(request.get("timeout", DEFAULT_TIMEOUT))

    def run() -> dict[str, Any]:
        key = request.get("env") or "validate"
        try:
            use_layers(list(layers), limits.layers_root)
            module, cls = compile_env(key, request["env_id"], request["class_name"], request["code"], timeout,
                                      limits.output_bytes)
        except Failure as exc:
            return {"ok": False, "failure": {"kind": exc.kind, "message": exc.message}}
        try:
            instance = instantiate(cls, {})
        except BaseException as exc:
            return {"ok": False, "failure": {"kind": "init_error", "message": describe(exc)}}
        try:
            encoder.encode_state(public_state(instance), module.__name__)
        except encoder.CodecError as exc:
            return {"ok": False, "failure": {"kind": "state_error", "message": f"initial state: {exc}"}}
        return {"ok": True}

    layers = tuple(os.path.realpath(str(layer)) for layer in request.get("layers") or [])
    return in_fork(run, timeout, limits, readable=layers)


class EnvHost:
    """Keeps one environment's class loaded and hands the worker ready forks of itself.

    The host never reads a request: the worker writes each one straight into a fork's pipe and
    reads the answer from it, so no session's data ever sits in the host's memory, where later
    forks would inherit it.

    Messages from the worker on ``sock``:
    - ``{"op": "spare"}``  -> ``{"pid"}`` plus the fork's request-write and answer-read descriptors
    - ``{"op": "finish", "pid", "reply"}`` -> ``{"status"}`` if ``reply``: reap a fork the worker
      has ended (a host may signal nothing but itself, so ending forks is the worker's job)
    - ``{"op": "prepare"}`` -> ``{"ready"}`` once a spare fork is made (the worker asks between
      requests, so the next one does not wait for the fork)
    - ``{"op": "template", "init_config", "timeout", "max_state_bytes"}`` -> ``{"pid"}`` plus the
      worker's end of a socket to a new host (a fork of this one) that holds the environment built
      from ``init_config``; its first frame tells how that went (``{"ok", "digest"}`` or
      ``{"error"}``). Its forks start as sessions already initialised (see ``start_template``).

    A template holds a scenario's initial state, which every session made from it shares, never a
    session's data: its forks read their requests from their own pipes, as every fork does.
    """

    def __init__(self, module: types.ModuleType, cls: type, limits: WorkerLimits,
                 prebuilt: LiveSession | None = None, readonly: ReadOnly | None = None) -> None:
        self.module = module
        self.cls = cls
        self.readonly = readonly
        self.limits = limits
        self.spare: Spare | None = None
        self.prebuilt = prebuilt  # the instance every fork starts from, in a template

    def serve(self, sock: socket.socket) -> None:
        while True:
            message = channel.receive(sock, time.monotonic() + 10 * 365 * 86400)
            if message is None:
                return
            if message.get("op") == "spare":
                self._hand_over(sock)
            elif message.get("op") == "template" and self.prebuilt is None:
                pid, worker_end = self.start_template(message)
                channel.send(sock, {"pid": pid}, fds=(worker_end,))
                os.close(worker_end)
            elif message.get("op") == "finish":
                status = reap(int(message["pid"]))
                if message.get("reply"):
                    channel.send(sock, {"status": status})
            if message.get("op") == "prepare":  # between requests: the worker waits, then rests us
                if self.spare is None:
                    try:
                        self.spare = spawn_spare(self.runner, self.limits, self.live)
                    except Failure:
                        pass  # the next "spare" reports why
                channel.send(sock, {"ready": self.spare is not None})

    def _hand_over(self, sock: socket.socket) -> None:
        spare, self.spare = self.spare, None
        if spare is None:
            try:
                spare = spawn_spare(self.runner, self.limits, self.live)
            except Failure as exc:
                # Out of processes: something this environment started holds them. The worker
                # must be replaced; nothing else frees them.
                channel.send(sock, {"error": error(SANDBOX_ERROR, exc.message), "unhealthy": True})
                return
        channel.send(sock, {"pid": spare.pid}, fds=(spare.request_fd, spare.answer_fd))
        os.close(spare.request_fd)
        os.close(spare.answer_fd)

    def runner(self, request: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        """What a fork runs for ``request`` (built in the fork, from the request it received)."""
        op = request.get("op")
        if op in ("init", "call"):  # a one-off session: what a resident would answer, then exit
            return lambda: self.live(request).handle(request)[0]
        if op == "check":
            return functools.partial(_run_check, self.module, request)
        raise Failure(SANDBOX_ERROR, f"unknown op {op!r}")

    def live(self, request: dict[str, Any]) -> LiveSession | Lodge | TemplateLodge:
        """The instance a session's resident process serves (built in the fork, from its first
        request, unless this host is a template and holds it built already); or, for a fork the
        worker keeps as a lodge, the instances of many sessions (``sandbox.worker.lodge``), or
        of a template, many sessions' deltas against it (``sandbox.worker.templatelodge``)."""
        if request.get(lodge.FLAG) is True and self.prebuilt is None:
            return Lodge(self.module, self.cls, self.readonly, request)
        if request.get(lodge.FLAG) is True and self.prebuilt is not None:
            return TemplateLodge(self.prebuilt, request)
        return self.prebuilt if self.prebuilt is not None else LiveSession(self.module, self.cls, self.readonly)

    def start_template(self, message: dict[str, Any]) -> tuple[int, int]:
        """Fork a template host: it builds the instance of ``message`` within its timeout (else the
        worker ends it) and then serves forks of itself like any host."""

        def run(sock: socket.socket) -> None:  # pragma: no cover - runs in the template
            detach_standard_streams()
            live = LiveSession(self.module, self.cls, self.readonly)
            try:
                _within_deadline(lambda: live.prepare(message), float(message.get("timeout", DEFAULT_TIMEOUT)),
                                 self.limits.output_bytes, "initialise")
            except Failure as exc:
                channel.send(sock, {"error": error(exc.kind, exc.message)})
                return
            except BaseException as exc:
                channel.send(sock, {"error": error(TOOL_EXCEPTION, describe(exc))})
                return
            if live.drew:  # each session must draw for itself: it builds its own instance
                channel.send(sock, {"ok": True, "digest": live.digest, "draws": True})
                return
            channel.send(sock, {"ok": True, "digest": live.digest})
            gc.freeze()
            EnvHost(self.module, self.cls, self.limits, prebuilt=live, readonly=self.readonly).serve(sock)

        return fork_host(run)


def _within_deadline(run: Callable[[], Any], timeout: float, output_bytes: int, what: str) -> None:
    """Run environment code in this long-lived process with capped output, stopped at ``timeout``
    (SIGALRM): module code as a host loads, a scenario's instance as a template builds it.

    Raises:
        Failure: kind ``timeout``; anything ``run`` raises passes through.
    """
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = CappedOutput(output_bytes)
    previous = signal.signal(signal.SIGALRM, _raise_deadline)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        run()
    except Deadline:
        raise Failure(TIMEOUT, f"the environment took longer than {timeout:g} s to {what}") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.stdout, sys.stderr = saved


def _run_check(module: types.ModuleType, request: dict[str, Any]) -> dict[str, Any]:
    index, source = int(request["index"]), str(request["source"])
    resolve = resolver(module)
    final = decoder.decode(json.loads(request["state"]), resolve)
    initial = decoder.decode(json.loads(request["initial"]), resolve)
    for state in (final, initial):  # a session's stored randomness is the sandbox's, not a check's
        if isinstance(state, dict):
            state.pop(randomness.HIDDEN, None)
    namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": f"check_{index}", "initial_state": initial}
    filename = f"<check {index}>"
    try:
        exec(compile(source, filename, "exec"), namespace)
    except SyntaxError as exc:
        return {"passed": False, "error": f"syntax error at line {exc.lineno}: {exc.msg}"}
    except BaseException as exc:
        return {"passed": False, "error": describe(exc, "<check")}
    check = namespace.get("check_func")
    if not callable(check):
        return {"passed": False, "error": "the check defines no check_func(final_state)"}
    try:
        verdict = check(final)
    except Interrupt:
        raise
    except BaseException as exc:
        return {"passed": False, "error": describe(exc, "<check")}
    if type(verdict) is not bool:
        return {"passed": False, "error": f"check_func returned {type(verdict).__name__}, expected bool"}
    return {"passed": verdict, "error": None}


def serve_zygote(sock: socket.socket, limits: WorkerLimits) -> None:
    """The clean process that environment hosts and validations are forked from.

    It is forked by the worker before the worker reads any request, and it is only ever sent
    environment code (public, through the API), so nothing it passes on holds session data.

    Messages from the worker:
    - ``{"op": "host", env, env_id, class_name, code, layers, timeout}`` -> ``{"pid"}`` plus the worker's
      end of a socket to the new host, whose first frame tells how loading went
    - ``{"op": "stop", "pid"}`` -> ``{"ok"}`` once that host and everything it started are gone
    - ``{"op": "validate", ...}`` -> the validation's answer
    """
    randomness.install()  # before any environment code: hosts and their forks inherit it
    rehearsal.rehearse()  # (after install: a session's path runs through it)
    gc.collect()
    gc.freeze()  # what the zygote holds now, every host and session shares (see ``_start_host``)
    while True:
        message = channel.receive(sock, time.monotonic() + 10 * 365 * 86400)
        if message is None:
            return
        op = message.get("op")
        if op == "host":
            pid, worker_end = _start_host(message, limits)
            channel.send(sock, {"pid": pid}, fds=(worker_end,))
            os.close(worker_end)
        elif op == "stop":
            finish(int(message["pid"]), True, time.monotonic())
            channel.send(sock, {"ok": True})
        elif op == "validate":
            channel.send(sock, validate(message, limits))
        else:
            channel.send(sock, {"error": error(SANDBOX_ERROR, f"unknown op {op!r}")})


def _start_host(spec: dict[str, Any], limits: WorkerLimits) -> tuple[int, int]:
    def run(sock: socket.socket) -> None:  # pragma: no cover - runs in the host
        layers = [os.path.realpath(str(layer)) for layer in spec.get("layers") or []]
        # Offered first to the kernel's OOM killer: live sessions and calls inherit this, and a
        # session's live instance is only a cache of its stored state. (Written now, because
        # the ruleset below hides /proc.)
        try:
            with open("/proc/self/oom_score_adj", "w") as adj:
                adj.write("1000")
        except OSError:
            pass
        if limits.filtered:  # before module code runs: it, its threads and its calls inherit this
            # Other environments' layers are hidden (``limits.hidden``); this one's stays readable.
            hide_paths(limits, tuple(layers))
            seccomp.confine_session()
        # A call lowers the hard limit to its own at its start; a lodge, which holds many sessions,
        # to its own above that (``sandbox.worker.lodge``): memory itself is the cgroup's to bound.
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes + LODGE_SPACE))
        try:
            use_layers(layers, limits.layers_root)
            module, cls = compile_env(spec["env"], spec["env_id"], spec["class_name"], spec["code"],
                                      float(spec.get("timeout", DEFAULT_TIMEOUT)), limits.output_bytes)
        except Failure as exc:
            channel.send(sock, {"error": error(exc.kind, exc.message)})
        else:
            channel.send(sock, {"ok": True})
            # Objects that exist now are shared with every fork; kept out of the collector's
            # walks, forks do not copy the pages holding them just to count references.
            readonly = ReadOnly(module, spec["code"], cls)  # proven once, for every session here
            signatures.warm(cls)
            gc.freeze()
            EnvHost(module, cls, limits, readonly=readonly).serve(sock)

    return fork_host(run)


def fork_host(run: Callable[[socket.socket], None]) -> tuple[int, int]:
    """Fork a host process (an environment's host, or a template of one): a process group of its
    own, dying with its parent, holding only its end of a new socket, on which ``run`` serves.
    Returns its pid and the descriptor of the other end, for the worker."""
    worker_end, host_end = socket.socketpair()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the host
        try:
            die_with_parent()
            if os.getppid() != parent:
                os._exit(1)
            close_inherited(keep=(host_end.fileno(),))
            os.setpgid(0, 0)
            run(host_end)
        finally:
            os._exit(0)
    host_end.close()
    fd = os.dup(worker_end.fileno())
    worker_end.close()
    return pid, fd
