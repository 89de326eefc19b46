"""The docker sandbox backend against the process backend, measured in the same run.

    .venv/bin/python bench/sandbox_backends.py [--calls 200] [--pool-sizes 1,4,8]

Prints pool warm-up time per backend and size, then session-create and tool-call latency
(p50/p99) through the HTTP API with each backend, and the docker/process ratios. Needs a Docker
engine and the images from scripts/docker-images. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.servers import free_port, pct, timed, wait_ready  # noqa: E402
from sandbox.pool.requests import WorkerPool  # noqa: E402
from sandbox.wire.limits import Limits  # noqa: E402


def backend(name: str) -> object:
    if name == "docker":
        from sandbox.backends.container import DockerBackend

        return DockerBackend(os.environ.get("ENVFOUNDRY_SANDBOX_IMAGE", "envfoundry/sandbox:dev"), "efbench")
    from sandbox.backends.process import ProcessBackend

    return ProcessBackend()


async def warm_up(name: str, size: int) -> float:
    pool = WorkerPool(backend(name), size, Limits())  # type: ignore[arg-type]
    start = time.perf_counter()
    await pool.start()
    elapsed = time.perf_counter() - start
    await pool.close()
    return elapsed


def serve(sandbox: str, workers: int) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers",
                             str(workers), "--sandbox", sandbox], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(f"{url}/healthz", proc)
    return url, proc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pool-sizes", default="1,4,8")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    print("pool warm-up (seconds until every worker answered its handshake)")
    print(f"{'workers':>8}{'process':>10}{'docker':>10}{'ratio':>8}")
    for size in (int(s) for s in args.pool_sizes.split(",")):
        proc_s = asyncio.run(warm_up("process", size))
        dock_s = asyncio.run(warm_up("docker", size))
        print(f"{size:>8}{proc_s:>10.3f}{dock_s:>10.3f}{dock_s / proc_s:>7.1f}x")

    results = {}
    body = {"name": "get_member", "arguments": {"member_id": "M002"}}
    for sandbox in ("process", "docker"):
        url, proc = serve(sandbox, args.workers)
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                sid = http.post("/v1/sessions", json={"scenario_id": "lib-001"}).json()["session_id"]
                for _ in range(30):
                    http.post(f"/v1/sessions/{sid}/calls", json=body)
                create = timed(lambda: http.post("/v1/sessions", json={"scenario_id": "lib-001"}), args.calls)
                call = timed(functools.partial(http.post, f"/v1/sessions/{sid}/calls", json=body), args.calls)
                results[sandbox] = (create, call)
        finally:
            proc.terminate()
            proc.wait(30)

    print(f"\nthrough the API, {args.calls} requests each, {args.workers} workers, memory store")
    print(f"{'operation':<16}{'process p50':>12}{'p99':>8}{'docker p50':>12}{'p99':>8}{'p50 ratio':>11}")
    for index, name in enumerate(("session create", "tool call")):
        p, d = results["process"][index], results["docker"][index]
        print(f"{name:<16}{pct(p, 0.5):>12.2f}{pct(p, 0.99):>8.2f}{pct(d, 0.5):>12.2f}{pct(d, 0.99):>8.2f}"
              f"{pct(d, 0.5) / pct(p, 0.5):>10.2f}x")


if __name__ == "__main__":
    main()
