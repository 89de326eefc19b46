"""Servers under test, each started as its own process pinned to the servers' CPU, and their clean-up."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server for {url} exited with {proc.returncode} before it was ready")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"server for {url} not ready after {timeout:.0f} s")


def timed(fn: Callable[[], object], n: int) -> list[float]:
    """Seconds each of ``n`` sequential runs of ``fn`` took."""
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def pct(samples: list[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (seconds) in milliseconds."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    key_prefix: str | None = None
    redis_url: str | None = None
    service_name: str | None = None
    notes: list[str] = field(default_factory=list)

    def wait_ready(self) -> None:
        """Raises RuntimeError, with the end of the server's log, if it exits or is not up in time; it is
        then stopped."""
        try:
            wait_ready(self.url + "/healthz", self.proc)
        except RuntimeError as exc:
            self.stop()
            tail = self.log.read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"{exc}; last lines of its log: {' | '.join(tail)}") from None

    def cpu_seconds(self) -> float:
        """CPU time used so far by this server's process tree: every live process's own time plus that
        of the children it has reaped (call forks are reaped by their hosts), so each process counts once.
        Docker workers are children of the engine and are not included."""
        return tree_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.redis_url and self.key_prefix:
            delete_keys(self.redis_url, self.key_prefix)


def _launch(name: str, args: list[str], env: dict[str, str], cpu: int, logs: Path) -> Server:
    """Start a server without waiting for it, so several can start at once; see ``Server.wait_ready``."""
    port = free_port()
    log = logs / f"{name.replace('/', '-')}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["taskset", "-c", str(cpu), *args, "--port", str(port)], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    return Server(name, f"http://127.0.0.1:{port}", proc, log)


def launch_baseline(catalog: Path, cpu: int, logs: Path) -> Server:
    env = {**os.environ, "BENCH_CATALOG": str(catalog)}
    return _launch("baseline", [sys.executable, "-m", "uvicorn", "bench.baseline_app:from_environment", "--factory",
                               "--loop", "uvloop", "--http", "httptools", "--log-level", "warning"],
                  env, cpu, logs)


def launch_service(name: str, catalog: Path, cpu: int, logs: Path, *, workers: int, redis_url: str | None,
                  sandbox: str) -> Server:
    """``envfoundry serve`` as a user would run it, with a key prefix and service name of its own."""
    tag = f"efbench-{secrets.token_hex(4)}"
    # One session per connection takes every call of a run: more than a session's default step
    # limit (10,000) once a call takes well under a millisecond.
    env = {**os.environ, "ENVFOUNDRY_KEY_PREFIX": tag, "ENVFOUNDRY_SERVICE_NAME": tag,
           "ENVFOUNDRY_MAX_STEPS": "10000000"}
    env.pop("ENVFOUNDRY_REDIS_URL", None)
    env.pop("REDIS_URL", None)
    args = [sys.executable, "-m", "service.cli", "serve", "--catalog", str(catalog), "--workers", str(workers),
            "--sandbox", sandbox]
    if redis_url:
        args += ["--redis", redis_url]
    server = _launch(name, args, env, cpu, logs)
    server.key_prefix, server.redis_url, server.service_name = tag, redis_url, tag
    return server


def pin_containers(server: Server, cpu: int) -> None:
    """Docker workers are children of the engine, not of the service: put them on the servers' CPU too."""
    ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label=envfoundry.service={server.service_name}"],
                         capture_output=True, text=True, check=False).stdout.split()
    if not ids:
        server.notes.append("no worker containers found to pin")
        return
    done = subprocess.run(["docker", "update", "--cpuset-cpus", str(cpu), *ids], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        server.notes.append(f"could not pin worker containers: {done.stderr.strip()}")
    else:
        server.notes.append(f"{len(ids)} worker containers pinned to CPU {cpu}")


def tree_cpu_seconds(root: int) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it ended while we looked
        pid = int(entry)
        parents[pid] = int(fields[1])
        # its threads' time on a CPU, and its reaped children's (cutime, cstime)
        times[pid] = _run_seconds(pid, fields, tick) + sum(int(f) for f in fields[13:15]) / tick
    total, members, frontier = 0.0, {root}, [root]
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    while frontier:
        pid = frontier.pop()
        total += times.get(pid, 0.0)
        for child in children.get(pid, []):
            if child not in members:
                members.add(child)
                frontier.append(child)
    return total


def _run_seconds(pid: int, fields: list[str], tick: int) -> float:
    """A process's time on a CPU, to the nanosecond: its threads' ``schedstat``. (``stat``'s utime
    and stime are whole clock ticks, rounded down per process: a session process that ran 5 ms
    counts 0, and a tree of hundreds of them loses most of their time.)"""
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        return sum(int(f) for f in fields[11:13]) / tick


def delete_keys(redis_url: str, prefix: str) -> int:
    """Delete every key under this run's prefix (never anything else in the database)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        deleted = 0
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += int(client.delete(*batch))
                batch = []
        if batch:
            deleted += int(client.delete(*batch))
        return deleted
    finally:
        client.close()
