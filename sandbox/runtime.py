"""What a worker does with each request. The worker itself never runs environment code.

Requests (all carry ``id``; those about an environment carry ``env``, its code hash):

- ``load``      {env, env_id, class_name, code}  start the environment's host process (see ``envhost``)
- ``init``      {env, init_config}               -> {state}
- ``call``      {env, state, name, arguments}    -> {ok, result, error, state|None, diff}
- ``score``     {env, state, initial, checks}    -> {checks: [{passed, error}]}
- ``validate``  {env_id, class_name, code}       -> {ok, failure: {kind, message}}

``init``, ``call`` and ``score`` are passed to the environment's host process,
which runs each in a fork of itself. A host that dies or hangs is killed and
started again on the next request. After every request the worker empties its
private /tmp and System V IPC objects, so nothing a call leaves there reaches
a later one.

Standard library only.
"""

from __future__ import annotations

import os
import resource
import select
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from sandbox import contain, envhost, protocol
from sandbox.forks import DEFAULT_TIMEOUT, SANDBOX_ERROR, TIMEOUT, Failure, WorkerLimits, close_inherited, error

# Environment hosts kept per worker; the least recently used goes first.
MAX_HOSTS = 16
# Beyond the host's own per-fork deadlines: how long a silent host is given before it is killed.
HOST_GUARD = 2.0


@dataclass
class Host:
    pid: int
    to_host: int
    from_host: int
    used: float = field(default_factory=time.monotonic)


class Runtime:
    def __init__(self, limits: WorkerLimits, *, private_tmp: bool = False, preserve: list[str] | None = None) -> None:
        self.limits = limits
        self.private_tmp = private_tmp
        # read-only folders confinement put back inside /tmp (e.g. a checkout there): never emptied
        self.preserve = list(preserve or [])
        self.hosts: dict[str, Host] = {}
        self.sources: dict[str, dict[str, Any]] = {}

    def set_worker_limits(self) -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.limits.open_files, self.limits.open_files))
        if self.limits.dedicated_uid:
            # Everything under this uid is ours: the hosts, their spare forks, one call fork, and
            # what calls may start.
            cap = 2 * MAX_HOSTS + 8 + self.limits.processes
            resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))
        contain.become_subreaper()  # orphans of a killed host come back here to be reaped

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        try:
            if op == "load":
                self._load(request)
                response: dict[str, Any] = {"ok": True}
            elif op == "validate":
                response = envhost.validate(request, self.limits)
            elif op in ("init", "call", "score"):
                response = self._forward(request)
            else:
                response = {"error": error(SANDBOX_ERROR, f"unknown op {op!r}")}
        except Failure as exc:
            response = {"error": error(exc.kind, exc.message)}
        except Exception as exc:  # a bug here must reach the service as a sandbox error, not kill the worker
            response = {"error": error(SANDBOX_ERROR, f"worker failed: {type(exc).__name__}: {exc}")}
        finally:
            self._scrub()
        response["id"] = request.get("id")
        return response

    # -- hosts ----------------------------------------------------------------------------
    def _load(self, request: dict[str, Any]) -> None:
        key = request["env"]
        self.sources[key] = {k: request[k] for k in ("env", "env_id", "class_name", "code")}
        self.sources[key]["timeout"] = float(request.get("timeout", DEFAULT_TIMEOUT))
        if key not in self.hosts:
            self._start_host(key)

    def _start_host(self, key: str) -> Host:
        while len(self.hosts) >= MAX_HOSTS:
            oldest = min(self.hosts, key=lambda k: self.hosts[k].used)
            self._stop_host(oldest)
        spec = self.sources[key]
        to_read, to_write = os.pipe()
        from_read, from_write = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the host process
            try:
                contain.die_with_parent()
                if os.getppid() != parent:
                    os._exit(1)
                close_inherited(keep=(to_read, from_write))
                os.setpgid(0, 0)
                memory = self.limits.memory_bytes
                resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
                source, sink = os.fdopen(to_read, "rb"), os.fdopen(from_write, "wb")
                try:
                    module, cls = envhost.compile_env(key, spec["env_id"], spec["class_name"], spec["code"],
                                                      spec["timeout"], self.limits.output_bytes)
                except Failure as exc:
                    protocol.write_frame(sink, {"error": error(exc.kind, exc.message)})
                else:
                    protocol.write_frame(sink, {"ok": True})
                    envhost.EnvHost(module, cls, self.limits).serve(source, sink)
            finally:
                os._exit(0)
        os.close(to_read)
        os.close(from_write)
        host = Host(pid, to_write, from_read)
        deadline = time.monotonic() + spec["timeout"] + HOST_GUARD
        answer = _read_answer(host.from_host, deadline)
        if answer is None or answer.get("error"):
            _kill(host)
            if answer is None and time.monotonic() >= deadline:
                raise Failure(TIMEOUT, f"the module did not load within {spec['timeout']:g} s")
            if answer is None:
                raise Failure("load_error", "the module's process died or broke its answer while loading")
            raise Failure(answer["error"]["type"], answer["error"]["message"])
        self.hosts[key] = host
        return host

    def _stop_host(self, key: str) -> None:
        _kill(self.hosts.pop(key))

    def _forward(self, request: dict[str, Any]) -> dict[str, Any]:
        key = request["env"]
        host = self.hosts.get(key)
        if host is None:
            if key not in self.sources:
                raise Failure("not_loaded", f"environment {key[:12]} is not loaded in this worker")
            host = self._start_host(key)  # after a crash or an eviction
        host.used = time.monotonic()
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        rounds = max(1, len(request.get("checks", ()))) if request["op"] == "score" else 1
        try:
            _write_all(host.to_host, protocol.encode_frame(request))
            answer = _read_answer(host.from_host, time.monotonic() + timeout * rounds + HOST_GUARD)
        except OSError:
            answer = None
        if answer is None:
            self._stop_host(key)
            return {"error": error(SANDBOX_ERROR, "the environment's process stopped answering and was restarted")}
        return answer

    # -- hygiene --------------------------------------------------------------------------
    def _scrub(self) -> None:
        """Leave nothing from this request for the next one."""
        _reap()
        if not self.private_tmp:
            return
        for entry in os.scandir("/tmp"):
            if any(p == entry.path or p.startswith(entry.path + "/") for p in self.preserve):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass
        contain.clear_ipc()


def _kill(host: Host) -> None:
    try:
        os.killpg(host.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(host.pid, 0)
    except ChildProcessError:
        pass
    for fd in (host.to_host, host.from_host):
        try:
            os.close(fd)
        except OSError:
            pass


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, size: int, deadline: float) -> bytes | None:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        wait = deadline - time.monotonic()
        if wait <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            continue
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_answer(fd: int, deadline: float) -> dict[str, Any] | None:
    """One frame from a host, or None if it closed, hung or sent garbage."""
    header = _read_exact(fd, protocol.HEADER.size, deadline)
    if header is None:
        return None
    try:
        body = _read_exact(fd, protocol.frame_length(header), deadline)
        answer = None if body is None else protocol.decode_body(body)
    except protocol.ProtocolError:
        return None
    return answer if isinstance(answer, dict) else None
