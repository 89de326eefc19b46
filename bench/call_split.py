"""Where a tool call's CPU goes: the service's process, its sandbox workers, the sessions' processes.

    .venv/bin/python bench/call_split.py [--lodged] [--seconds 10] [--repeat 3]

Serves the speed bench's shop (4 KB state, Redis store, 2 process workers), makes 16 sessions and
calls one read on each at 16 connections with wrk. The service's process runs alone on CPU 0 and
everything else (its workers, the sessions' processes, wrk) on CPU 1, so neither disturbs the
other's caches or takes its turns, and each process's CPU (its threads' ``schedstat``) is charged
to the calls of the run. Prints the microseconds per call of the service's process, of the workers
and of the sessions' processes, median of ``--repeat`` runs. ``--lodged``: one session process per
worker, so that most sessions live in lodges and each call crosses its worker. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import load, servers, workload  # noqa: E402

SERVICE_CPU, OTHER_CPU = 0, 1
CONNECTIONS = 16


def _tree(root: int) -> dict[int, str]:
    """Every process under ``root``, and what it is: the service, a worker (and the process that waits
    for it outside its PID namespace, where it has one) or what a worker forks to serve sessions
    (its zygote, hosts, lodges and the sessions' processes), all of which keep its command line."""
    found, todo = {root: "service"}, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                kids = [int(k) for k in children.read().split()]
        except OSError:
            continue
        for kid in kids:
            if found[pid] == "service" or found[pid] == "worker" and not _first(pid) and _first(kid):
                found[kid] = "worker"
            else:
                found[kid] = "sessions"
            todo.append(kid)
    return found


def _first(pid: int) -> bool:
    """Whether ``pid`` is the first process of a PID namespace of its own (a confined worker is)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    return len(ids) > 1 and ids[-1] == "1"
    except OSError:
        pass
    return False


def _cpu_ns(pid: int) -> int:
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
    except (OSError, ValueError):
        pass
    return total


def _pin(root: int) -> None:
    for pid in _tree(root):
        if pid != root:
            subprocess.run(["taskset", "-pc", str(OTHER_CPU), str(pid)], capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lodged", action="store_true", help="one session process per worker (lodges beyond)")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    load.require_tools()
    logs = Path(tempfile.mkdtemp(prefix="bench-call-split-"))
    catalog = workload.write_catalog(logs / "catalog")
    if args.lodged:
        os.environ["ENVFOUNDRY_RESIDENTS"] = "1"  # (the service starts with this process's environment)
    server = servers.launch_service("call-split", catalog, SERVICE_CPU, logs, workers=2,
                                    redis_url="redis://127.0.0.1:6379/0", sandbox="process")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=60) as http:
            sessions = [http.post("/v1/sessions", json={"scenario_id": workload.scenario_id("4k")}).json()["session_id"]
                        for _ in range(CONNECTIONS)]
            for session in sessions:  # (each called once: live, or lodged, before the runs)
                http.post(f"/v1/sessions/{session}/calls", json=workload.READ).raise_for_status()
        paths = [f"/v1/sessions/{session}/calls" for session in sessions]
        body = json.dumps(workload.READ)
        _pin(server.proc.pid)
        load.run(server.url, paths, [body], CONNECTIONS, 3, OTHER_CPU)  # warm-up
        rows: list[dict[str, float]] = []
        for _ in range(args.repeat):
            before = {pid: _cpu_ns(pid) for pid in _tree(server.proc.pid)}
            sample = load.run(server.url, paths, [body], CONNECTIONS, args.seconds, OTHER_CPU)
            if sample.errors or sample.non_2xx:
                raise SystemExit(f"bench: {sample.errors} errors and {sample.non_2xx} non-2xx answers")
            row = {"service": 0.0, "worker": 0.0, "sessions": 0.0, "calls/s": sample.per_second}
            for pid, kind in _tree(server.proc.pid).items():
                row[kind] += (_cpu_ns(pid) - before.get(pid, 0)) / sample.requests / 1000
            rows.append(row)
    finally:
        server.stop()
    median = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    print(f"read 4 KB at {CONNECTIONS} connections, Redis store, 2 process workers"
          f"{', one session process per worker' if args.lodged else ''}; the service's process alone on "
          f"CPU {SERVICE_CPU}, the rest on CPU {OTHER_CPU}; median of {args.repeat} x {args.seconds} s")
    print(f"CPU per call, us: service {median['service']:.0f}, workers {median['worker']:.0f}, "
          f"sessions' processes {median['sessions']:.0f}, in all "
          f"{median['service'] + median['worker'] + median['sessions']:.0f}; {median['calls/s']:.0f} calls/s")


if __name__ == "__main__":
    main()
