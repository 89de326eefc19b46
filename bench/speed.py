"""envfoundry's speed against a bare baseline and against the issue's targets, in one run.

    .venv/bin/python bench/speed.py [--quick] [--json out.json] [--workers 4] [--redis redis://127.0.0.1:6379/0]

Servers (each its own process, all pinned to one CPU with taskset):
  baseline           FastAPI + uvloop; each session's environment instance in memory; a call is
                     ``getattr(env, name)(**args)``; ``baseline+deepcopy`` also deep-copies the
                     state after the call, as the original method's in-process step does
  process/redis      ``envfoundry serve`` with the process sandbox and the Redis store
  process/memory     the same with the memory store
  docker/redis       the docker sandbox with the Redis store, where an engine and the image exist

Load comes from wrk pinned to another CPU, one session per connection (see bench/load.py):
c=1 for p50 latency, c=16 for calls/s. Every measurement is repeated (3 times, 1 in --quick) with
the systems interleaved, and the median is reported. The original's in-process step (call +
deepcopy) is timed in this process, pinned to the servers' CPU, in the same run. Loopback only;
Redis keys live under a prefix of their own and are deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import load, servers, workload  # noqa: E402

BASELINE, SNAPSHOT = "baseline", "baseline+deepcopy"
SERVICE_SYSTEMS = ("process/redis", "process/memory", "docker/redis")
THROUGHPUT_CONNECTIONS = 16
# Targets of issue 7, section "What to build" 3.
READ_P50_MS = 1.0
READ_PER_SECOND = 1000.0
CREATE_P50_MS = 2.0
DOCKER_OVER_PROCESS = 1.5
# Targets of issue 20 (a tool call is one straight hop), against the bare baseline in the same run.
HOP_THROUGHPUT = 0.5  # calls/s at c=16, at least this share of the baseline's
HOP_P50 = 2.5  # p50 at c=1, at most this multiple of the baseline's
HOP_CPU = 2.0  # server CPU per call at c=16, at most this multiple of the baseline's


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    kind: str  # read | write | create | fork
    size: str
    connections: int

    @property
    def throughput(self) -> bool:
        return self.connections > 1


METRICS = [
    Metric("read_4k_c1", "read 4k p50 (c=1)", "read", "4k", 1),
    Metric("read_4k_c16", "read 4k calls/s (c=16)", "read", "4k", THROUGHPUT_CONNECTIONS),
    Metric("read_400k_c1", "read 400k p50 (c=1)", "read", "400k", 1),
    Metric("write_4k_c1", "write 4k p50 (c=1)", "write", "4k", 1),
    Metric("write_400k_c1", "write 400k p50 (c=1)", "write", "400k", 1),
    Metric("create_4k_c1", "create 4k p50 (c=1)", "create", "4k", 1),
    Metric("fork_4k_c1", "fork 4k p50 (c=1)", "fork", "4k", 1),
]


@dataclass
class System:
    name: str
    server: servers.Server
    call_prefix: str = ""

    def applies(self, metric: Metric) -> bool:
        # The deep-copy variant only changes what a call does.
        return not (self.name == SNAPSHOT and metric.kind in ("create", "fork"))


def session_paths(http: httpx.Client, count: int, size: str, suffix: str, prefix: str = "") -> list[str]:
    paths = []
    for _ in range(count):
        answer = http.post("/v1/sessions", json={"scenario_id": workload.scenario_id(size)})
        answer.raise_for_status()
        paths.append(f"{prefix}/v1/sessions/{answer.json()['session_id']}{suffix}")
    return paths


def plan(system: System, http: httpx.Client, shared: dict[str, list[str]] | None) -> dict[str, list[str]]:
    """The paths each metric's connections use: sessions created before any load is applied."""
    if shared is not None:  # the deep-copy variant uses the baseline's sessions on its own route
        return {k: [system.call_prefix + p for p in v] for k, v in shared.items()}
    paths: dict[str, list[str]] = {}
    for metric in METRICS:
        if metric.kind == "create":
            paths[metric.key] = ["/v1/sessions"] * metric.connections
        elif metric.kind == "fork":
            paths[metric.key] = session_paths(http, metric.connections, metric.size, "/fork")
        else:
            paths[metric.key] = session_paths(http, metric.connections, metric.size, "/calls")
    return paths


def bodies(metric: Metric) -> list[str]:
    if metric.kind == "read":
        return [json.dumps(workload.READ)]
    if metric.kind == "write":
        return [json.dumps(w) for w in workload.WRITES]
    if metric.kind == "create":
        return [json.dumps({"scenario_id": workload.scenario_id(metric.size)})]
    return [""]


def check_answers(system: System, http: httpx.Client, paths: dict[str, list[str]]) -> None:
    """Every system must answer the bench's requests correctly before its speed means anything."""
    for metric in METRICS:
        if not system.applies(metric):
            continue
        path = paths[metric.key][0]
        for body in bodies(metric):
            answer = http.post(path, content=body, headers={"content-type": "application/json"})
            if answer.status_code not in (200, 201):
                raise RuntimeError(f"{system.name} answered {answer.status_code} to {metric.label}: {answer.text[:300]}")
            data = answer.json()
            if metric.kind in ("read", "write") and not (data.get("ok") and data["result"].get("success")):
                raise RuntimeError(f"{system.name}: {metric.label} did not succeed: {answer.text[:300]}")


def warm(system: System, http: httpx.Client, paths: dict[str, list[str]], calls: int) -> None:
    for metric in METRICS:
        if system.applies(metric):
            for path in paths[metric.key]:
                for i in range(calls):
                    body = bodies(metric)[i % len(bodies(metric))]
                    http.post(path, content=body, headers={"content-type": "application/json"})


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def in_process(cls: type, states: dict[str, Any], seconds: float, cpu: int) -> dict[str, float]:
    """The original method's per-step cost, timed here with this process on the servers' CPU."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        return {f"{kind}_{size}": workload.in_process_step_ms(cls, states[size], call, seconds)
                for size in workload.SIZES for kind, call in (("read", workload.READ), ("write", workload.WRITES[0]))}
    finally:
        os.sched_setaffinity(0, before)


def docker_unavailable(image: str) -> str | None:
    """Why the docker backend cannot be measured here, or None."""
    try:
        done = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True, timeout=30,
                              check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return f"no usable docker client/engine ({exc})"
    if done.returncode != 0:
        return f"image {image} not found or engine unreachable: {done.stderr.strip()[:200]}"
    return None


def start_systems(args: argparse.Namespace, catalog: Path, logs: Path, skipped: dict[str, str]) -> list[System]:
    wanted = [("process/redis", args.redis, "process"), ("process/memory", None, "process")]
    reason = docker_unavailable(os.environ.get("ENVFOUNDRY_SANDBOX_IMAGE", "envfoundry/sandbox:dev"))
    if args.no_docker:
        reason = "--no-docker given"
    if reason:
        skipped["docker/redis"] = reason
    else:
        wanted.append(("docker/redis", args.redis, "docker"))
    # All start at once (each takes seconds to start its sandbox workers) and are waited for in turn.
    base = servers.launch_baseline(catalog, args.server_cpu, logs)
    launched = [(base, "")] + [
        (servers.launch_service(name, catalog, args.server_cpu, logs, workers=args.workers, redis_url=redis_url,
                                sandbox=sandbox), sandbox) for name, redis_url, sandbox in wanted]
    systems: list[System] = []
    try:
        for server, sandbox in launched:
            try:
                server.wait_ready()
            except RuntimeError as exc:
                if sandbox != "docker":
                    raise
                skipped[server.name] = f"the service did not start with the docker backend: {exc}"
                continue
            if sandbox == "docker":
                servers.pin_containers(server, args.server_cpu)
            systems.append(System(server.name, server))
    except BaseException:
        for server, _ in launched:
            server.stop()
        raise
    return [systems[0], System(SNAPSHOT, base, "/snap"), *systems[1:]]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    repeats, seconds = (1, 1) if args.quick else (3, 2)
    step_seconds = 0.2 if args.quick else 0.5
    skipped: dict[str, str] = {}
    started = time.monotonic()
    load_before = os.getloadavg()
    states = {size: workload.make_state(target) for size, target in workload.SIZES.items()}
    cls = workload.load_class()
    with tempfile.TemporaryDirectory(prefix="efbench-") as tmp:
        catalog = workload.write_catalog(Path(tmp) / "catalog")
        logs = Path(tmp) / "logs"
        logs.mkdir()
        systems: list[System] = []
        try:
            systems = start_systems(args, catalog, logs, skipped)
            paths: dict[str, dict[str, list[str]]] = {}
            for system in systems:
                with httpx.Client(base_url=system.server.url, timeout=60) as http:
                    shared = paths.get(BASELINE) if system.name == SNAPSHOT else None
                    paths[system.name] = plan(system, http, shared)
                    check_answers(system, http, paths[system.name])
                    warm(system, http, paths[system.name], 3 if args.quick else 10)
            print(f"servers ready in {time.monotonic() - started:.0f} s; measuring "
                  f"({repeats} x {seconds} s per point)", file=sys.stderr, flush=True)
            samples: dict[str, dict[str, list[dict[str, Any]]]] = {m.key: {} for m in METRICS}
            steps: dict[str, list[float]] = {}
            for repeat in range(repeats):
                for key, value in in_process(cls, states, step_seconds, args.server_cpu).items():
                    steps.setdefault(key, []).append(value)
                for metric in METRICS:
                    order = systems[repeat % len(systems):] + systems[:repeat % len(systems)]
                    for system in order:
                        if not system.applies(metric):
                            continue
                        cpu_before = system.server.cpu_seconds()
                        sample = load.run(system.server.url, paths[system.name][metric.key], bodies(metric),
                                          metric.connections, seconds, args.load_cpu)
                        spent = system.server.cpu_seconds() - cpu_before
                        run = sample.to_json()
                        run["cpu_ms_per_request"] = spent * 1000 / sample.requests if sample.requests else None
                        samples[metric.key].setdefault(system.name, []).append(run)
                print(f"  repeat {repeat + 1}/{repeats} done at {time.monotonic() - started:.0f} s",
                      file=sys.stderr, flush=True)
        finally:
            for system in systems:
                if system.name != SNAPSHOT:
                    system.server.stop()
    results: dict[str, dict[str, Any]] = {}
    for metric in METRICS:
        results[metric.key] = {}
        for name, runs in samples[metric.key].items():
            results[metric.key][name] = {
                "p50_ms": median([r["p50_ms"] for r in runs]),
                "p99_ms": median([r["p99_ms"] for r in runs]),
                "per_second": median([r["per_second"] for r in runs]),
                "failed_requests": sum(r["errors"] + r["non_2xx"] for r in runs),
                "cpu_ms_per_request": None if name.startswith("docker") else median(
                    [r["cpu_ms_per_request"] for r in runs if r["cpu_ms_per_request"] is not None]),
                "runs": runs,
            }
    return {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "config": {"quick": args.quick, "repeats": repeats, "seconds_per_point": seconds, "workers": args.workers,
                   "server_cpu": args.server_cpu, "load_cpu": args.load_cpu, "redis": args.redis,
                   "state_bytes": {s: len(json.dumps(v)) for s, v in states.items()},
                   # The machine may be shared: a load average above its CPU count means the figures are noisy.
                   "load_average_before": load_before[0], "load_average_after": os.getloadavg()[0]},
        "systems": [s.name for s in systems],
        "notes": {s.name: s.server.notes for s in systems if s.server.notes},
        "skipped": skipped,
        "in_process_step_ms": {k: median(v) for k, v in steps.items()},
        "results": results,
        "elapsed_s": round(time.monotonic() - started, 1),
    }


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue as {system, target, value, limit, met}."""
    res, step = report["results"], report["in_process_step_ms"]
    rows: list[dict[str, Any]] = []

    def add(system: str, target: str, value: float, limit: float, met: bool) -> None:
        rows.append({"system": system, "target": target, "value": value, "limit": limit, "met": met})

    for name in SERVICE_SYSTEMS:
        if name not in res["read_4k_c1"]:
            continue

        def get(key: str, field: str = "p50_ms", name: str = name) -> float:
            return float(res[key][name][field])

        read = get("read_4k_c1")
        add(name, "read 4k p50 <= 1.0 ms", read, READ_P50_MS, read <= READ_P50_MS)
        rate = get("read_4k_c16", "per_second")
        add(name, "read 4k c=16 >= 1000 calls/s", rate, READ_PER_SECOND, rate >= READ_PER_SECOND)
        base_rate = res["read_4k_c16"][BASELINE]["per_second"]
        add(name, "aim: read 4k calls/s >= half the baseline's", rate, base_rate / 2, rate >= base_rate / 2)
        for kind in ("read", "write"):
            value, limit = get(f"{kind}_400k_c1"), step[f"{kind}_400k"]
            add(name, f"{kind} 400k p50 < in-process {kind} step (call + deepcopy)", value, limit, value < limit)
        create = get("create_4k_c1")
        add(name, "create 4k p50 <= 2.0 ms", create, CREATE_P50_MS, create <= CREATE_P50_MS)
        fork = get("fork_4k_c1")
        add(name, "fork p50 <= read 4k p50", fork, read, fork <= read)
        cpu = res["read_4k_c16"][name]["cpu_ms_per_request"]
        if cpu is not None:
            # Independent of what else the shared CPU ran: the CPU a call costs bounds calls/s per core.
            add(name, "read 4k CPU per call <= 1.0 ms (1000 calls/s per core)", cpu, 1000 / READ_PER_SECOND,
                cpu <= 1000 / READ_PER_SECOND)
    base = res["read_4k_c16"].get(BASELINE)
    for name in SERVICE_SYSTEMS:
        if base is None or name not in res["read_4k_c1"]:
            continue
        rate = res["read_4k_c16"][name]["per_second"]
        add(name, "hop: read 4k calls/s (c=16) >= 0.5x baseline", rate / base["per_second"], HOP_THROUGHPUT,
            rate >= HOP_THROUGHPUT * base["per_second"])
        p50 = res["read_4k_c1"][name]["p50_ms"]
        add(name, "hop: read 4k p50 (c=1) <= 2.5x baseline", p50 / res["read_4k_c1"][BASELINE]["p50_ms"], HOP_P50,
            p50 <= HOP_P50 * res["read_4k_c1"][BASELINE]["p50_ms"])
        cpu, base_cpu = res["read_4k_c16"][name]["cpu_ms_per_request"], base["cpu_ms_per_request"]
        if cpu is not None and base_cpu:
            add(name, "hop: CPU per call (c=16) <= 2x baseline's", cpu / base_cpu, HOP_CPU, cpu <= HOP_CPU * base_cpu)
    if "docker/redis" in res["read_4k_c1"] and "process/redis" in res["read_4k_c1"]:
        for metric in METRICS:
            if metric.throughput:
                continue
            docker, process = res[metric.key]["docker/redis"]["p50_ms"], res[metric.key]["process/redis"]["p50_ms"]
            add("docker/redis", f"{metric.label}: <= 1.5x process/redis", docker, DOCKER_OVER_PROCESS * process,
                docker <= DOCKER_OVER_PROCESS * process)
    return rows


def cell(metric: Metric, result: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    if result is None:
        return "-"
    failed = "!" if result["failed_requests"] else ""
    if metric.throughput:
        value, ratio = result["per_second"], (result["per_second"] / base["per_second"] if base else None)
        text = f"{value:,.0f}/s"
    else:
        value, ratio = result["p50_ms"], (result["p50_ms"] / base["p50_ms"] if base else None)
        text = f"{value:.2f} ms"
    return f"{text}{failed}" + (f" ({ratio:.2f}x)" if ratio is not None else "")


def render(report: dict[str, Any]) -> str:
    res = report["results"]
    names = report["systems"]
    lines = [f"state sizes {report['config']['state_bytes']} bytes; {report['config']['repeats']} interleaved "
             f"repeats of {report['config']['seconds_per_point']} s, medians; servers on CPU "
             f"{report['config']['server_cpu']}, wrk on CPU {report['config']['load_cpu']}; "
             f"{report['config']['workers']} sandbox workers; load average {report['config']['load_average_before']:.1f}"
             f" before, {report['config']['load_average_after']:.1f} after, on {report['machine']['cpus']} CPUs",
             "ratios in brackets are against the baseline (calls/s: system/baseline, p50: system/baseline)", ""]
    width = 24
    lines.append(f"{'':<26}" + "".join(f"{n:>{width}}" for n in names))
    for metric in METRICS:
        row = res[metric.key]
        base = row.get(BASELINE)
        cells = [cell(metric, row.get(n), None if n == BASELINE else base) for n in names]
        lines.append(f"{metric.label:<26}" + "".join(f"{c:>{width}}" for c in cells))
    lines += ["", "server CPU per request, ms (whole process tree; 1000/x = requests/s one core could serve)"]
    for metric in METRICS:
        row = res[metric.key]
        cells = [f"{row[n]['cpu_ms_per_request']:.2f}" if n in row and row[n]["cpu_ms_per_request"] is not None
                 else "-" for n in names]
        lines.append(f"{metric.label:<26}" + "".join(f"{c:>{width}}" for c in cells))
    step = report["in_process_step_ms"]
    lines += ["", "original's in-process step (call + deepcopy), timed in this run: " + ", ".join(
        f"{k} {v:.3f} ms" for k, v in step.items())]
    if any(r["failed_requests"] for row in res.values() for r in row.values()):
        lines.append("! some requests failed (socket errors or non-2xx answers): see failed_requests in the JSON")
    for name, reason in report["skipped"].items():
        lines.append(f"skipped {name}: {reason}")
    for name, notes in report["notes"].items():
        lines.append(f"note {name}: {'; '.join(notes)}")
    lines += ["", "targets (issue 7; 'hop:' issue 20, as ratios to the baseline)"]
    for row in report["targets"]:
        unit = "/s" if row["target"].startswith(("read 4k c=16", "aim:")) else \
            "x" if row["target"].startswith("hop:") else " ms"
        lines.append(f"  [{'met ' if row['met'] else 'MISS'}] {row['system']:<15} {row['target']:<58} "
                     f"{row['value']:.2f}{unit} vs {row['limit']:.2f}{unit}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat of 1 s per point (about a minute)")
    parser.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    parser.add_argument("--workers", type=int, default=4, help="sandbox workers per envfoundry server")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis for the redis-store systems")
    parser.add_argument("--no-docker", action="store_true", help="leave out the docker backend")
    cpus = sorted(os.sched_getaffinity(0))
    parser.add_argument("--server-cpu", type=int, default=cpus[-1], help="CPU every server process is pinned to")
    parser.add_argument("--load-cpu", type=int, default=cpus[0], help="CPU wrk is pinned to")
    args = parser.parse_args()
    load.require_tools()
    if args.server_cpu == args.load_cpu:
        print("bench: the load generator and the servers need different CPUs (this machine offers "
              f"{cpus})", file=sys.stderr)
        return 2
    report = measure(args)
    report["targets"] = targets(report)
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
