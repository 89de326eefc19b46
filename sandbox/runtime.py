"""What a worker does with each request: load classes, then run calls, inits and checks in forks.

Requests (all carry ``id``; those about an environment carry ``env`` = its code hash):

- ``load``      {env, env_id, class_name, code}  compile once into this worker
- ``init``      {env, init_config}               -> {state}
- ``call``      {env, state, name, arguments}    -> {ok, result, error, state|None, diff}
- ``score``     {env, state, initial, checks}    -> {checks: [{passed, error}]}
- ``validate``  {env_id, class_name, code}       -> {ok, failure: {kind, message}}

Standard library only.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import inspect
import io
import json
import linecache
import os
import resource
import select
import signal
import sys
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox import codec, contain

# Error types shared with the service's API contract.
UNKNOWN_TOOL = "unknown_tool"
INVALID_ARGUMENTS = "invalid_arguments"
TOOL_EXCEPTION = "tool_exception"
TIMEOUT = "timeout"
RESOURCE_LIMIT = "resource_limit"
SANDBOX_ERROR = "sandbox_error"

DEFAULT_TIMEOUT = 10.0
MAX_FD = 1 << 16
# Room for the frame's JSON around the result and state, beyond their own limits.
FRAME_SLACK = 1 << 20


@dataclass
class WorkerLimits:
    memory_bytes: int = 512 << 20
    open_files: int = 64
    processes: int = 0
    output_bytes: int = 1 << 20


class Failure(Exception):
    """A request fails with an error type from the API contract."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class _Interrupt(BaseException):
    """Raised into environment code; a BaseException so ``except Exception`` cannot swallow it."""


class _OutputLimit(_Interrupt):
    pass


class _Deadline(_Interrupt):
    pass


class CappedOutput(io.TextIOBase):
    """stdout/stderr for environment code: discards text, fails the call past a byte budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.exceeded = False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.budget -= len(text)
        if self.budget < 0:
            self.exceeded = True
            raise _OutputLimit("output limit")
        return len(text)


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": kind, "message": message}


def _describe(exc: BaseException, filename_prefix: str = "<env") -> str:
    """``Type: message`` plus the innermost environment-code line, without our frames."""
    text = f"{type(exc).__name__}: {exc}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(filename_prefix)]
    if frames:
        last = frames[-1]
        text += f" (line {last.lineno} in {last.name})"
    return text


def public_state(instance: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(instance).items() if not (k.startswith("__") and k.endswith("__"))}


def instantiate(cls: type, init_config: dict[str, Any]) -> Any:
    """EnvScaler's convention, kept exactly for compatibility with its released data."""
    try:
        instance = cls(init_config)
    except TypeError:
        instance = cls()
    for key, value in init_config.items():
        setattr(instance, key, value)
    return instance


class Runtime:
    def __init__(self, limits: WorkerLimits) -> None:
        self.limits = limits
        self.modules: dict[str, tuple[types.ModuleType, type]] = {}

    # -- limits ---------------------------------------------------------------------------
    def set_worker_limits(self, dedicated_uid: bool) -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.limits.open_files, self.limits.open_files))
        if dedicated_uid:
            # The worker owns its uid alone: itself, one call fork, and the extra processes allowed.
            cap = 2 + self.limits.processes
            resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))

    def _set_call_limits(self, timeout: float) -> None:
        memory = self.limits.memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = int(timeout) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))

    # -- dispatch -------------------------------------------------------------------------
    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        handler: Callable[[dict[str, Any]], dict[str, Any]] | None = getattr(self, f"op_{op}", None)
        if handler is None:
            return {"id": request.get("id"), "error": _error(SANDBOX_ERROR, f"unknown op {op!r}")}
        try:
            response = handler(request)
        except Failure as exc:
            response = {"error": _error(exc.kind, exc.message)}
        except Exception as exc:  # a bug here must reach the service as a sandbox error, not kill the worker
            response = {"error": _error(SANDBOX_ERROR, f"worker failed: {type(exc).__name__}: {exc}")}
        response["id"] = request.get("id")
        return response

    # -- environments ---------------------------------------------------------------------
    def _env(self, key: str) -> tuple[types.ModuleType, type]:
        try:
            return self.modules[key]
        except KeyError:
            raise Failure("not_loaded", f"environment {key[:12]} is not loaded in this worker") from None

    def op_load(self, request: dict[str, Any]) -> dict[str, Any]:
        key = request["env"]
        if key not in self.modules:
            timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
            self.modules[key] = _compile_env(
                key, request["env_id"], request["class_name"], request["code"], timeout, self.limits.output_bytes
            )
        return {"ok": True}

    def op_validate(self, request: dict[str, Any]) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            try:
                _, cls = _compile_env(
                    "validate", request["env_id"], request["class_name"], request["code"], timeout, 1 << 20
                )
            except Failure as exc:
                return {"ok": False, "failure": {"kind": exc.kind, "message": exc.message}}
            try:
                instance = instantiate(cls, {})
            except BaseException as exc:
                return {"ok": False, "failure": {"kind": "init_error", "message": _describe(exc)}}
            try:
                codec.encode_state(public_state(instance), "ef_env_validate")
            except codec.CodecError as exc:
                return {"ok": False, "failure": {"kind": "state_error", "message": f"initial state: {exc}"}}
            return {"ok": True}

        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        return self._in_fork(run, timeout)

    # -- sessions -------------------------------------------------------------------------
    def op_init(self, request: dict[str, Any]) -> dict[str, Any]:
        module, cls = self._env(request["env"])
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        max_state = int(request.get("max_state_bytes", 1 << 24))

        def run() -> dict[str, Any]:
            try:
                instance = instantiate(cls, request.get("init_config") or {})
            except BaseException as exc:
                raise Failure(TOOL_EXCEPTION, f"the environment failed to initialise: {_describe(exc)}") from None
            state = _encode(public_state(instance), module.__name__, max_state)
            return {"state": state}

        return self._in_fork(run, timeout)

    def op_call(self, request: dict[str, Any]) -> dict[str, Any]:
        module, cls = self._env(request["env"])
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        max_state = int(request.get("max_state_bytes", 1 << 24))
        max_result = int(request.get("max_result_bytes", 1 << 20))

        def run() -> dict[str, Any]:
            before_text: str = request["state"]
            before = json.loads(before_text)
            factory: Any = cls  # restore without __init__: the state is already built
            instance = factory.__new__(factory)
            instance.__dict__.update(codec.decode(before, _resolver(module)))
            method = _tool(cls, instance, request["name"])
            arguments = request.get("arguments") or {}
            try:
                inspect.signature(method).bind(**arguments)
            except TypeError as exc:
                raise Failure(INVALID_ARGUMENTS, f"{request['name']}: {exc}") from None
            try:
                result = method(**arguments)
                if inspect.iscoroutine(result):  # an async tool: run it to completion here
                    result = asyncio.run(result)
            except _Interrupt:
                raise
            except MemoryError:
                raise Failure(RESOURCE_LIMIT, "the tool ran out of memory") from None
            except BaseException as exc:
                raise Failure(TOOL_EXCEPTION, _describe(exc)) from None
            result_view = codec.view(result)
            result_text = json.dumps(result_view, ensure_ascii=False)
            if len(result_text.encode()) > max_result:
                raise Failure(
                    RESOURCE_LIMIT, f"the tool's result is {len(result_text.encode())} bytes, over the {max_result} byte limit"
                )
            after_text = _encode(public_state(instance), module.__name__, max_state)
            if after_text == before_text:
                return {"ok": True, "result": result_view, "error": None, "state": None, "diff": codec.diff({}, {})}
            change = codec.diff(codec.view_encoded(before), codec.view_encoded(json.loads(after_text)))
            return {"ok": True, "result": result_view, "error": None, "state": after_text, "diff": change}

        return self._in_fork(run, timeout, result_bytes=max_state + max_result + FRAME_SLACK)

    def op_score(self, request: dict[str, Any]) -> dict[str, Any]:
        module, _ = self._env(request["env"])
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        results = []
        for i, source in enumerate(request["checks"]):
            outcome = self._in_fork(functools.partial(_run_check, module, request, i, source), timeout)
            if "error" in outcome and "passed" not in outcome:
                outcome = {"passed": False, "error": f"{outcome['error']['type']}: {outcome['error']['message']}"}
            results.append({"passed": bool(outcome.get("passed")), "error": outcome.get("error")})
        return {"checks": results}

    # -- forks ----------------------------------------------------------------------------
    def _in_fork(
        self, run: Callable[[], dict[str, Any]], timeout: float, result_bytes: int = 64 << 20
    ) -> dict[str, Any]:
        """Run ``run`` in a fork of this worker and return its answer, or an error describing its end."""
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            raise Failure(SANDBOX_ERROR, f"cannot fork a call process: {exc}") from None
        if pid == 0:  # pragma: no cover - runs in the fork
            os.close(read_fd)
            contain.die_with_parent()  # a fork must never outlive a killed worker
            if os.getppid() != parent:
                os._exit(1)
            self._child(run, write_fd, timeout)
        os.close(write_fd)
        return self._collect(pid, read_fd, timeout, result_bytes)

    def _child(self, run: Callable[[], dict[str, Any]], write_fd: int, timeout: float) -> None:
        # Nothing the worker holds may reach environment code: above all not its protocol
        # pipes, through which a call could read or answer other sessions' requests.
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, MAX_FD)
        output = CappedOutput(self.limits.output_bytes)
        try:
            os.setpgid(0, 0)
            self._set_call_limits(timeout)
            sys.stdout = sys.stderr = output
            try:
                answer = run()
            except _OutputLimit:
                answer = {"error": _error(RESOURCE_LIMIT, f"the tool printed more than {self.limits.output_bytes} bytes")}
            except Failure as exc:
                answer = {"error": _error(exc.kind, exc.message)}
            except MemoryError:
                answer = {"error": _error(RESOURCE_LIMIT, "out of memory")}
            if output.exceeded:
                answer = {"error": _error(RESOURCE_LIMIT, f"the tool printed more than {self.limits.output_bytes} bytes")}
            try:
                payload = json.dumps(answer, ensure_ascii=False).encode()
            except UnicodeEncodeError:
                payload = json.dumps({"error": _error(
                    TOOL_EXCEPTION, "the tool produced text that is not valid Unicode (a lone surrogate)")}).encode()
        except BaseException as exc:  # last resort: the fork must always answer or die
            payload = json.dumps({"error": _error(SANDBOX_ERROR, f"{type(exc).__name__}: {exc}")}).encode()
        view = memoryview(payload)
        while view:
            written = os.write(write_fd, view)
            view = view[written:]
        os._exit(0)

    def _collect(self, pid: int, read_fd: int, timeout: float, cap: int) -> dict[str, Any]:
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + timeout
        outcome: str | None = None
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    outcome = "timeout"
                    break
                ready, _, _ = select.select([read_fd], [], [], remaining)
                if not ready:
                    continue
                chunk = os.read(read_fd, 1 << 20)
                if not chunk:
                    break
                size += len(chunk)
                if size > cap:
                    outcome = "too_big"
                    break
                chunks.append(chunk)
        finally:
            os.close(read_fd)
        if outcome is None and not _exits_by(pid, deadline):
            outcome = "timeout"  # it closed its end of the pipe but kept running
        if outcome:
            _kill_group(pid)
        _, status = os.waitpid(pid, 0)
        _kill_group(pid)  # anything the call started is gone with it
        if outcome == "timeout":
            return {"error": _error(TIMEOUT, f"the call ran longer than {timeout:g} s and was stopped")}
        if outcome == "too_big":
            return {"error": _error(RESOURCE_LIMIT, f"the call's answer exceeded {cap} bytes")}
        if chunks and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            try:
                answer: dict[str, Any] = json.loads(b"".join(chunks))
                return answer
            except ValueError:
                pass
        return {"error": _death(status)}


def _exits_by(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` exits or ``deadline`` passes; True if it exited."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = -1
    try:
        while True:
            remaining = deadline - time.monotonic()
            if pidfd >= 0:
                ready, _, _ = select.select([pidfd], [], [], max(remaining, 0))
                return bool(ready)
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            if remaining <= 0:
                return False
            time.sleep(0.001)
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _death(status: int) -> dict[str, Any]:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return _error(TIMEOUT, "the call used up its CPU time and was stopped")
        if sig == signal.SIGKILL:
            return _error(RESOURCE_LIMIT, "the call process was killed (out of memory?)")
        return _error(TOOL_EXCEPTION, f"the tool crashed its process ({signal.Signals(sig).name})")
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    return _error(TOOL_EXCEPTION, f"the tool ended its process with exit status {code} (os._exit?)")


def _encode(state: dict[str, Any], module_name: str, limit: int) -> str:
    try:
        text = codec.encode_state(state, module_name)
    except codec.CodecError as exc:
        raise Failure(TOOL_EXCEPTION, f"the state cannot be serialized: {exc}") from None
    size = len(text.encode())
    if size > limit:
        raise Failure(RESOURCE_LIMIT, f"the state would be {size} bytes, over the {limit} byte limit")
    return text


def _resolver(module: types.ModuleType) -> Callable[[str], Any]:
    def resolve(qualname: str) -> Any:
        target: Any = module
        for part in qualname.split("."):
            target = getattr(target, part)
        return target

    return resolve


def _tool(cls: type, instance: Any, name: str) -> Callable[..., Any]:
    if not isinstance(name, str) or name.startswith("_"):
        raise Failure(UNKNOWN_TOOL, f"unknown tool {name!r}")
    try:
        attribute = inspect.getattr_static(cls, name)
    except AttributeError:
        raise Failure(UNKNOWN_TOOL, f"unknown tool {name!r}") from None
    if isinstance(attribute, (property, type)) or not (
        callable(attribute) or isinstance(attribute, (staticmethod, classmethod))
    ):
        raise Failure(UNKNOWN_TOOL, f"{name!r} is not a tool")
    return getattr(instance, name)  # type: ignore[no-any-return]


def _snapshot_modules() -> dict[str, tuple[types.ModuleType, dict[str, Any]]]:
    return {name: (mod, dict(vars(mod))) for name, mod in list(sys.modules.items()) if mod is not None}


def _restore_modules(snapshot: dict[str, tuple[types.ModuleType, dict[str, Any]]]) -> None:
    """Undo what environment code did at import time to modules (stdlib, builtins) it shares."""
    for name, (mod, saved) in snapshot.items():
        if sys.modules.get(name) is not mod:
            sys.modules[name] = mod
        current = vars(mod)
        for key, value in saved.items():
            if current.get(key, _MISSING) is not value:
                current[key] = value
        for key in [k for k in current if k not in saved and not isinstance(current[k], types.ModuleType)]:
            del current[key]


_MISSING = object()


def _compile_env(key: str, env_id: str, class_name: str, code: str, timeout: float, output_bytes: int) -> tuple[types.ModuleType, type]:
    filename = f"<env {env_id}>"
    try:
        compiled = compile(code, filename, "exec")
    except SyntaxError as exc:
        raise Failure("syntax_error", f"syntax error at line {exc.lineno}: {exc.msg}") from None
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    name = f"ef_env_{key[:16]}"
    module = types.ModuleType(name)
    module.__file__ = filename
    snapshot = _snapshot_modules()
    sys.modules[name] = module
    saved_out = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = CappedOutput(output_bytes)
    previous = signal.signal(signal.SIGALRM, _raise_deadline)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        exec(compiled, module.__dict__)
    except _Deadline:
        raise Failure(TIMEOUT, f"the module took longer than {timeout:g} s to load") from None
    except ImportError as exc:
        raise Failure("import_error", _describe(exc)) from None
    except BaseException as exc:
        raise Failure("load_error", _describe(exc)) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.stdout, sys.stderr = saved_out
        _restore_modules(snapshot)
        sys.modules[name] = module
    cls = module.__dict__.get(class_name)
    if not isinstance(cls, type):
        raise Failure("missing_class", f"the code defines no class named {class_name!r}")
    return module, cls


def _raise_deadline(signum: int, frame: Any) -> None:
    raise _Deadline()


def _run_check(module: types.ModuleType, request: dict[str, Any], index: int, source: str) -> dict[str, Any]:
    resolve = _resolver(module)
    final = codec.decode(json.loads(request["state"]), resolve)
    initial = codec.decode(json.loads(request["initial"]), resolve)
    namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": f"check_{index}", "initial_state": initial}
    filename = f"<check {index}>"
    try:
        exec(compile(source, filename, "exec"), namespace)
    except SyntaxError as exc:
        return {"passed": False, "error": f"syntax error at line {exc.lineno}: {exc.msg}"}
    except BaseException as exc:
        return {"passed": False, "error": _describe(exc, "<check")}
    check = namespace.get("check_func")
    if not callable(check):
        return {"passed": False, "error": "the check defines no check_func(final_state)"}
    try:
        verdict = check(final)
    except _Interrupt:
        raise
    except BaseException as exc:
        return {"passed": False, "error": _describe(exc, "<check")}
    if type(verdict) is not bool:
        return {"passed": False, "error": f"check_func returned {type(verdict).__name__}, expected bool"}
    return {"passed": verdict, "error": None}


