"""The sandbox worker: runs environment code on behalf of the service.

Started as ``python -S -E -s sandbox/worker/main.py --uid N ...``. It confines itself
(see ``contain``), says hello, then answers one framed request at a time on
its stdin/stdout. Environment classes are compiled once per worker; every
call then runs in a fork of this process, so nothing a call does to class
attributes, module globals or builtins survives it, a crash or an exit in
environment code only ends that fork, and the committed state is whatever
the service stored last (calls are all or nothing).

Standard library only.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from typing import Any

if __package__ in (None, ""):
    # Run as a script: import ``sandbox`` as a package, and do not let environment
    # code import this folder's modules as top-level ones.
    sys.path[0] = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

from sandbox.wire import protocol
from sandbox.wire.limits import add_worker_flags, worker_arguments  # noqa: E402
from sandbox.worker import memory, polling
from sandbox.worker.confine import contain  # noqa: E402
from sandbox.worker.forks import WorkerLimits  # noqa: E402
from sandbox.worker.runtime import Runtime  # noqa: E402

# How long the worker must have been idle before it makes forks ahead of time.
IDLE_BEFORE_PREPARE = 0.005
# Modules environment code commonly imports; loaded before privileges drop so
# they come from the warm image rather than from disk at call time.
PRELOAD = (
    "collections", "copy", "dataclasses", "datetime", "decimal", "enum", "functools", "hashlib",
    "heapq", "itertools", "json", "math", "random", "re", "statistics", "string", "time",
    "typing", "uuid", "bisect", "inspect", "traceback", "textwrap", "fractions", "operator",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="envfoundry-worker")
    parser.add_argument("--uid", type=int, default=65534)
    parser.add_argument("--gid", type=int, default=65534)
    add_worker_flags(parser)  # the limits it enforces (see ``sandbox.wire.limits``)
    parser.add_argument("--cgroup", default="", help="memory cgroup to join (made by the service)")
    parser.add_argument("--cgroup-missing", default="the service made no memory cgroup for this worker",
                        help="why there is no --cgroup")
    parser.add_argument("--lend-fd", type=int, default=-1, help="a Unix socket on which the service takes the "
                        "pipes of kept sessions, to call them straight (see sandbox.lane)")
    parser.add_argument("--lend-path", default="", help="or the path of such a socket to connect to (a container's "
                        "worker: the service mounts it)")
    parser.add_argument("--no-contain", action="store_true", help="skip confinement (tests of the runtime only)")
    parser.add_argument("--container", action="store_true", help="the container engine confines us: verify only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    given = worker_arguments(args)
    # Python turns SIGINT into an exception: as PID 1 of its namespace (or behind a container's
    # init, which forwards it) the worker would otherwise die of one sent from inside.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lend = socket.socket(fileno=args.lend_fd) if args.lend_fd >= 0 else _connect(args.lend_path)
    # The protocol keeps private copies of stdin/stdout; fds 0-2 become /dev/null
    # so environment code that writes to them cannot corrupt frames.
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)  # unbuffered: select() sees what is pending
    proto_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    for name in PRELOAD:
        __import__(name)
    report: dict[str, Any]
    # (opened before confinement hides /sys; read after every request)
    gauge = memory.Gauge.of_container() if args.container else memory.Gauge.of_group(args.cgroup) if args.cgroup else None
    if args.container:
        report = contain.verify_container()
    elif args.no_contain:
        contain.die_with_parent()
        report = {"applied": [], "missing": {"all": "confinement disabled by --no-contain"}, "uid": os.getuid()}
    else:
        report = contain.apply(args.uid, args.gid, contain.tmp_options(given.tmp_mb, given.tmp_inodes), args.cgroup or None, args.cgroup_missing,
                               readable=(given.layers_root,) if given.layers_root else ())
    limits = WorkerLimits(
        memory_bytes=given.memory_mb << 20,
        open_files=given.open_files,
        processes=given.processes,
        output_bytes=given.output_bytes,
        layers_root=os.path.realpath(given.layers_root) if given.layers_root else "",
        # every environment's processes are kept out of the layers but their own (see ``landlock``)
        hidden=(os.path.realpath(given.layers_root),) if given.layers_root else (),
        # NPROC counts processes per uid, so it only bounds us when the uid is ours alone.
        dedicated_uid="user" in report["applied"] and not args.container,
    )
    # /tmp and the IPC namespace are ours to empty only when confinement made them private.
    private = args.container or "filesystem" in report["applied"]
    runtime = Runtime(limits, private_tmp=private, preserve=report.get("preserve", []),
                      own_processes=args.container or "processes" in report["applied"],
                      filter_syscalls=not args.no_contain, max_residents=max(0, given.residents),
                      resident_idle=given.resident_idle, gauge=gauge, lend=lend)
    if runtime.filter_missing is None:
        report["applied"].append("syscalls")
    else:
        report["missing"]["syscalls"] = f"no seccomp filter on environment code ({runtime.filter_missing})"
    if runtime.paths_missing is None:
        report["applied"].append("paths")
    else:
        report["missing"]["paths"] = f"/proc, /sys and /dev stay open to environment code ({runtime.paths_missing})"
    # ``asks_config``: a request naming a template may come without its config; this worker asks for
    # it where it must build the template (``answers.NEED_CONFIG``)
    hello: dict[str, Any] = {"op": "hello", "pid": os.getpid(), "containment": report, "lends": runtime.lends,
                             "asks_config": True}
    if runtime.lends and lend is not None:
        # The service empties /tmp after each call it makes straight, as this worker does after its own.
        hello["tmp"] = runtime.private_tmp
        if runtime.private_tmp:
            tmp = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            socket.send_fds(lend, [protocol.LEND_MARK], [tmp])
            os.close(tmp)
    elif lend is not None:
        lend.close()
        runtime.lend = None
    protocol.write_frame(proto_out, hello)
    while True:
        try:
            request = protocol.read_frame(proto_in)
        except protocol.ProtocolError:
            return 0
        protocol.write_frame(proto_out, runtime.handle(request))
        # Forks for the next sessions are made once the worker is idle for a moment, so the work
        # never delays the answer just sent (on a busy or single core it would). A worker that lends
        # is never idle on its own: the service may be calling its sessions, so it asks for this.
        if runtime.lend is None and runtime.unprepared() \
                and not polling.ready(proto_in, IDLE_BEFORE_PREPARE):
            runtime.prepare()


def _connect(path: str) -> socket.socket | None:
    """The lending connection (see ``--lend-path``); None if there is none to make: the service
    then sends every call through this worker."""
    if not path:
        return None
    lend = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lend.settimeout(5.0)
        lend.connect(path)
        lend.settimeout(None)
    except OSError:
        lend.close()
        return None
    return lend


if __name__ == "__main__":
    sys.exit(main())
