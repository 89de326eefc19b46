"""Running a piece of environment code in a fork, with limits, and turning its end into an answer.

Every call, init and check runs in a fork of a process that holds the
environment's class: the fork closes everything it inherited, sets its limits,
runs, writes one JSON answer to a pipe and exits. Whatever it does to class
attributes, globals or builtins dies with it, and however it ends (exception,
exit, signal, hang, memory) the parent gets an answer describing that.

Standard library only.
"""

from __future__ import annotations

import functools
import io
import json
import os
import resource
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, NoReturn, Protocol

from sandbox.wire import protocol
from sandbox.wire.answers import ToolError, error
from sandbox.wire.limits import DEFAULTS
from sandbox.worker import polling
from sandbox.worker.confine import contain, landlock, seccomp

# Error types of the API contract (see ``sandbox.wire.answers.ToolError``).
UNKNOWN_TOOL = ToolError.UNKNOWN_TOOL.value
INVALID_ARGUMENTS = ToolError.INVALID_ARGUMENTS.value
TOOL_EXCEPTION = ToolError.TOOL_EXCEPTION.value
TIMEOUT = ToolError.TIMEOUT.value
RESOURCE_LIMIT = ToolError.RESOURCE_LIMIT.value
SANDBOX_ERROR = ToolError.SANDBOX_ERROR.value

DEFAULT_TIMEOUT = DEFAULTS.call_timeout
MAX_FD = 1 << 16
# A fork's answer is length-prefixed, so it is complete before the fork has finished exiting.
ANSWER_HEADER = struct.Struct(">Q")


@dataclass
class WorkerLimits:
    memory_bytes: int = DEFAULTS.memory_mb << 20
    open_files: int = DEFAULTS.open_files
    processes: int = DEFAULTS.processes
    output_bytes: int = DEFAULTS.output_bytes
    layers_root: str = ""  # where package layers lie; a host may use only layers under it (and
    # ``hidden`` holds it, so each environment's processes read only their own layers)
    dedicated_uid: bool = False  # no process outside this worker shares its uid
    filtered: bool = False  # the zygote holds the seccomp filter: hosts and validations add the signal one
    hide_paths: bool = False  # hosts and validations apply the Landlock ruleset (see ``landlock``)
    hidden: tuple[str, ...] = ()  # folders hidden besides /proc, /sys and /dev


class Failure(Exception):
    """A request fails with an error type from the API contract."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class Interrupt(BaseException):
    """Raised into environment code; a BaseException so ``except Exception`` cannot swallow it."""


class OutputLimit(Interrupt):
    pass


class Deadline(Interrupt):
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
            raise OutputLimit("output limit")
        return len(text)


def describe(exc: BaseException, filename_prefix: str = "<env") -> str:
    """``Type: message`` plus the innermost environment-code line, without our frames."""
    text = f"{type(exc).__name__}: {exc}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(filename_prefix)]
    if frames:
        last = frames[-1]
        text += f" (line {last.lineno} in {last.name})"
    return text


# /proc, opened before the Landlock ruleset hides it, where calls may start processes: counting
# the uid's processes for a call's limits needs its listing. Environment code may list it too
# (one more inherited descriptor), which shows no more than probing process ids with stat would;
# the ruleset refuses opening anything in it, by any path.
_process_table: int | None = None


def hold_process_table() -> int:
    global _process_table
    if _process_table is None:
        _process_table = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    return _process_table


def hide_paths(limits: WorkerLimits, readable: tuple[str, ...] = ()) -> None:
    """Apply the Landlock ruleset to this process (a host, or a validation), once."""
    if limits.hide_paths:
        if limits.processes and limits.dedicated_uid:  # (then calls count the uid's processes)
            hold_process_table()
        landlock.restrict(limits.hidden, readable)
        limits.hide_paths = False  # applied: forks inherit it, and stacking it again would fail


def close_inherited(keep: tuple[int, ...]) -> None:
    """Close every descriptor above stderr but ``keep``: environment code must not reach
    the worker's protocol pipes, through which it could read or answer other requests."""
    if _process_table is not None:
        keep = (*keep, _process_table)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, MAX_FD)


def in_fork(run: Callable[[], dict[str, Any]], timeout: float, limits: WorkerLimits,
            result_bytes: int = 64 << 20, readable: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run ``run`` in a fork and return its answer, or an error describing how it ended.
    ``readable``: folders under ``limits.hidden`` the fork may still read (its package layers)."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        raise Failure(SANDBOX_ERROR, f"cannot fork a call process: {exc}") from None
    if pid == 0:  # pragma: no cover - runs in the fork
        contain.die_with_parent()  # a fork must never outlive its parent
        if os.getppid() != parent:
            os._exit(1)
        _child(run, write_fd, timeout, limits, readable=readable)
    os.close(write_fd)
    return _collect(pid, read_fd, timeout, result_bytes)


@dataclass
class Spare:
    """A fork made ahead of time, waiting on ``request_fd`` for the request it will run."""

    pid: int
    request_fd: int
    answer_fd: int


def spawn_spare(make_run: Callable[[dict[str, Any]], Callable[[], dict[str, Any]]], limits: WorkerLimits,
                resident: Callable[[dict[str, Any]], Session] | None = None) -> Spare:
    """Fork now, while nothing waits, so the next request skips the fork.

    The fork is a copy of a process that runs no environment code between requests, so it is
    the same fork a request would have made. It reads one request; a request for a session (with
    ``resident``) makes it that session's live process (see ``serve_session``), any other it runs,
    answers, and exits.
    """
    request_read, request_write = os.pipe()
    answer_read, answer_write = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (request_read, request_write, answer_read, answer_write):
            os.close(fd)
        raise Failure(SANDBOX_ERROR, f"cannot fork a call process: {exc}") from None
    if pid == 0:  # pragma: no cover - runs in the fork
        contain.die_with_parent()
        if os.getppid() != parent:
            os._exit(1)
        os.setpgid(0, 0)  # a group of its own at once: the host's ``kill(0, ...)`` must not reach it
        close_inherited(keep=(request_read, answer_write))
        source = os.fdopen(request_read, "rb")
        try:
            request = protocol.read_frame(source)
        except protocol.ProtocolError:
            os._exit(0)
        if resident is not None and isinstance(request.get("session"), str):
            serve_session(resident(request), request, source, answer_write, limits)
        source.close()
        # the host's signal filter holds here already: none to add on the call's clock
        _child(make_run(request), answer_write, float(request.get("timeout", DEFAULT_TIMEOUT)), limits,
               restrict_signals=False)
    os.close(request_read)
    os.close(answer_write)
    return Spare(pid, request_write, answer_read)


class Session(Protocol):
    """A session's live environment instance, as its resident process serves it."""

    def handle(self, request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The answer to ``request`` and whether this process may serve the session's next one
        (False once anything may have changed the instance without the change being answered)."""
        ...

    def address_space(self, limits: WorkerLimits) -> int:
        """The address-space limit of this process (set once: it cannot go back up)."""
        ...


def serve_session(session: Session, request: dict[str, Any], source: BinaryIO, answer_fd: int,
                  limits: WorkerLimits) -> NoReturn:
    """Serve one session's requests in this process until the worker ends it or a request fails.

    The instance stays live between requests, so a call neither decodes the state nor forks.
    Limits are those of a call fork; the CPU limit is renewed for each request. Like every
    process of its host, it is offered first to the kernel's OOM killer (see ``envhost``).
    """
    try:
        os.setpgid(0, 0)
        detach_standard_streams()
    except OSError:
        pass
    while True:
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        try:
            _set_call_limits(timeout, limits, renew=True, address_space=session.address_space(limits))
        except (OSError, ValueError):
            os._exit(1)
        payload, keep = _answer(functools.partial(session.handle, request), limits)
        _write_all(answer_fd, payload)
        if not keep:
            os._exit(0)
        try:
            request = protocol.read_frame(source)
        except protocol.ProtocolError:
            os._exit(0)


class Arriving:
    """A fork's length-prefixed answer as its bytes arrive, ``cap`` bytes at the most."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buffer = bytearray()
        self.expected: int | None = None

    def feed(self, chunk: bytes) -> str | None:
        """None while more is to come, else how it ended: ``"done"``, ``"too_big"``, or ``"ended"``
        (the pipe closed first, or more than one answer came: not a process following the protocol)."""
        if not chunk:
            return "ended"
        self.buffer += chunk
        if self.expected is None and len(self.buffer) >= ANSWER_HEADER.size:
            (self.expected,) = ANSWER_HEADER.unpack_from(self.buffer)
            if self.expected > self.cap:
                return "too_big"
        if self.expected is None or len(self.buffer) < ANSWER_HEADER.size + self.expected:
            return None
        return "done" if len(self.buffer) == ANSWER_HEADER.size + self.expected else "ended"

    def body(self) -> bytes:
        return bytes(self.buffer[ANSWER_HEADER.size:])

    def answer(self) -> dict[str, Any]:
        return decode_answer(self.body())


def decode_answer(body: bytes) -> dict[str, Any]:
    """A fork's answer from its frame body (a malformed one as a sandbox error)."""
    answer = protocol.decode_bounded(body)
    if not isinstance(answer, dict):
        return {"error": error(SANDBOX_ERROR, "the call process sent a malformed answer")}
    return answer


def read_answer(answer_fd: int, deadline: float, cap: int, *, keep_open: bool = False) -> tuple[dict[str, Any] | None, str]:
    """Read a fork's length-prefixed answer (from any process holding the pipe's read end).

    Returns the answer and ``"done"``, or None and why not: ``"timeout"``, ``"too_big"`` or
    ``"ended"`` (the pipe closed first: the fork died, exited, or closed it and may run on).
    ``keep_open`` leaves the descriptor open (a resident's next answer comes on it).
    """
    arriving = Arriving(cap)
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, "timeout"
            if not polling.ready(answer_fd, remaining):
                continue
            outcome = arriving.feed(os.read(answer_fd, 1 << 20))
            if outcome is not None:
                break
    finally:
        if not keep_open:
            os.close(answer_fd)
    return (arriving.answer() if outcome == "done" else None), outcome


def finish(pid: int, kill: bool, deadline: float) -> tuple[int, bool]:
    """End a fork (the caller is its parent): at once if ``kill``, else once it exits or ``deadline``
    passes. Anything it started goes with it. Returns its wait status and whether the deadline
    stopped it."""
    overran = not kill and not _exits_by(pid, deadline)
    _kill_group(pid)
    _kill(pid)  # it may have left its group; waiting for it must never hang
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        status = 0
    return status, overran


def reap(pid: int) -> int:
    """Wait for a fork of this process that the worker has ended; its wait status."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        status = 0
    return status


def end(pid: int, pidfd: int, deadline: float | None) -> bool:
    """End a fork from outside (the worker; its host may signal nothing): at once, or once it exits
    or ``deadline`` passes. Anything in its process group goes with it. True if the deadline
    stopped it. ``pidfd`` pins the process, so a recycled pid is never signalled."""
    overran = deadline is not None and not _exits_by(pid, deadline, pidfd)
    _kill_group(pid)
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    return overran


def exited_by(pid: int, pidfd: int, deadline: float) -> bool:
    """Wait until the fork pinned by ``pidfd`` has exited (its memory is freed then), or ``deadline``."""
    return _exits_by(pid, deadline, pidfd)


def outcome_error(outcome: str, status: int, overran: bool, timeout: float, cap: int) -> dict[str, Any]:
    """The error for a fork that did not answer, from how it ended."""
    if outcome == "timeout" or overran:
        return error(TIMEOUT, f"the call ran longer than {timeout:g} s and was stopped")
    if outcome == "too_big":
        return error(RESOURCE_LIMIT, f"the call's answer exceeded {cap} bytes")
    return _death(status)


def _set_call_limits(timeout: float, limits: WorkerLimits, renew: bool = False, address_space: int = 0) -> None:
    """Limits of one call. ``renew``: for a resident's next call, so hard limits stay where they
    were (they cannot go back up) and CPU time counts from what the process has used so far.
    ``address_space``: for a process holding more than one call's memory (a lodge)."""
    space = max(address_space, limits.memory_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (space, space))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    if renew:
        used = resource.getrusage(resource.RUSAGE_SELF)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        cpu = int(used.ru_utime + used.ru_stime) + int(timeout) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu if hard == resource.RLIM_INFINITY else min(cpu, hard), hard))
    else:
        cpu = int(timeout) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if limits.processes == 0:
        # Counted per uid, so any value at or below the processes already running forbids a fork.
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
    elif limits.dedicated_uid:
        allowed = _processes_of(os.getuid()) + limits.processes
        _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        if hard != resource.RLIM_INFINITY:
            allowed = min(allowed, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (allowed, allowed if not renew else hard))
    # (with a shared uid and extra processes allowed, the container's pids limit is the bound)


def _processes_of(uid: int) -> int:
    table = hold_process_table()
    count = 0
    for entry in os.listdir(table):
        if entry.isdigit():
            try:
                if os.stat(entry, dir_fd=table).st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count


def _child(run: Callable[[], dict[str, Any]], write_fd: int, timeout: float, limits: WorkerLimits,
           restrict_signals: bool = True, readable: tuple[str, ...] = ()) -> NoReturn:
    close_inherited(keep=(write_fd,))
    try:
        os.setpgid(0, 0)
        detach_standard_streams()
        if limits.filtered and restrict_signals:
            hide_paths(limits, readable)
            seccomp.confine_session()
        _set_call_limits(timeout, limits)
    except BaseException as exc:
        payload = json.dumps({"error": error(SANDBOX_ERROR, f"{type(exc).__name__}: {exc}")}).encode()
    else:
        payload, _ = _answer(lambda: (run(), False), limits)
    _write_all(write_fd, payload)
    os._exit(0)


def _answer(run: Callable[[], tuple[dict[str, Any], bool]], limits: WorkerLimits) -> tuple[bytes, bool]:
    """Run environment code with capped output; its answer as JSON bytes, and whether ``run``
    said the process may go on (never after a failure that escaped it)."""
    output = CappedOutput(limits.output_bytes)
    keep = False
    try:
        sys.stdout = sys.stderr = output
        try:
            answer, keep = run()
        except OutputLimit:
            answer = {"error": _printed_too_much(limits)}
        except Failure as exc:
            answer = {"error": error(exc.kind, exc.message)}
        except MemoryError:
            answer = {"error": error(RESOURCE_LIMIT, "out of memory")}
        if output.exceeded:
            answer, keep = {"error": _printed_too_much(limits)}, False
        try:
            payload = protocol.encode_body(answer, ascii_fallback=False)
        except UnicodeEncodeError:
            payload = json.dumps({"error": error(
                TOOL_EXCEPTION, "the tool produced text that is not valid Unicode (a lone surrogate)")}).encode()
            keep = False
    except BaseException as exc:  # last resort: the fork must always answer or die
        payload = json.dumps({"error": error(SANDBOX_ERROR, f"{type(exc).__name__}: {exc}")}).encode()
        keep = False
    return payload, keep


def _printed_too_much(limits: WorkerLimits) -> dict[str, Any]:
    return error(RESOURCE_LIMIT, f"the tool printed more than {limits.output_bytes} bytes")


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(ANSWER_HEADER.pack(len(payload)) + payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def detach_standard_streams() -> None:
    """Descriptors 0-2 of the process a call is forked from are whatever its (untrusted) module
    code made them, e.g. one end of a socket to a thread it left running: never inherit them."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd)
    if null > 2:
        os.close(null)


def _collect(pid: int, read_fd: int, timeout: float, cap: int) -> dict[str, Any]:
    """Read the answer of a fork this process made; stop it at the deadline or the size cap."""
    buffer = bytearray()
    expected: int | None = None
    deadline = time.monotonic() + timeout
    outcome: str | None = None
    try:
        while expected is None or len(buffer) < ANSWER_HEADER.size + expected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcome = "timeout"
                break
            if not polling.ready(read_fd, remaining):
                continue
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                break
            buffer += chunk
            if expected is None and len(buffer) >= ANSWER_HEADER.size:
                (expected,) = ANSWER_HEADER.unpack_from(buffer)
                if expected > cap:
                    outcome = "too_big"
                    break
    finally:
        os.close(read_fd)
    if outcome is None and expected is not None and len(buffer) >= ANSWER_HEADER.size + expected:
        _kill_group(pid)  # done: anything it started goes with it
        _kill(pid)
        decoded = protocol.decode_bounded(bytes(buffer[ANSWER_HEADER.size:ANSWER_HEADER.size + expected]))
        os.waitpid(pid, 0)
        if not isinstance(decoded, dict):
            return {"error": error(SANDBOX_ERROR, "the call process sent a malformed answer")}
        return decoded
    if outcome is None and not _exits_by(pid, deadline):
        outcome = "timeout"  # it closed its end of the pipe but kept running
    _kill_group(pid)
    _kill(pid)
    _, status = os.waitpid(pid, 0)
    if outcome == "timeout":
        return {"error": error(TIMEOUT, f"the call ran longer than {timeout:g} s and was stopped")}
    if outcome == "too_big":
        return {"error": error(RESOURCE_LIMIT, f"the call's answer exceeded {cap} bytes")}
    return {"error": _death(status)}


def _exits_by(pid: int, deadline: float, pidfd: int = -1) -> bool:
    """Wait until ``pid`` exits or ``deadline`` passes; True if it exited."""
    owned = pidfd < 0
    if owned:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = -1
    try:
        while True:
            remaining = deadline - time.monotonic()
            if pidfd >= 0:
                return polling.ready(pidfd, remaining)
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            if remaining <= 0:
                return False
            time.sleep(0.001)
    finally:
        if owned and pidfd >= 0:
            os.close(pidfd)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _death(status: int) -> dict[str, Any]:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return error(TIMEOUT, "the call used up its CPU time and was stopped")
        if sig == signal.SIGKILL:
            return error(RESOURCE_LIMIT, "the call process was killed (out of memory?)")
        try:
            name = signal.Signals(sig).name
        except ValueError:  # real-time and other unnamed signals
            name = f"signal {sig}"
        return error(TOOL_EXCEPTION, f"the tool crashed its process ({name})")
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    return error(TOOL_EXCEPTION, f"the tool ended its process with exit status {code} (os._exit?)")
