"""Latency and throughput of envfoundry against a bare FastAPI baseline, measured in the same run.

    .venv/bin/python bench/api_latency.py [--calls 300] [--concurrency 16] [--redis redis://127.0.0.1:6379/0]

Everything runs on loopback. The baseline is a FastAPI app with one JSON echo route served by the
same uvicorn, so the ratios show what sessions, the store and the sandbox add to a bare HTTP call.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
BASELINE = textwrap.dedent("""
    from fastapi import FastAPI
    app = FastAPI()

    @app.post("/echo")
    async def echo(body: dict) -> dict:
        return {"step": 1, "ok": True, "result": body, "error": None, "observation": "ok"}
""")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server at {url} exited")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"server at {url} not ready")


def start_baseline(folder: Path) -> tuple[str, subprocess.Popen[bytes]]:
    (folder / "baseline_app.py").write_text(BASELINE)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "baseline_app:app", "--port", str(port),
                             "--log-level", "warning"], cwd=folder)
    url = f"http://127.0.0.1:{port}"
    wait_ready(f"{url}/docs", proc)
    return url, proc


def start_service(redis_url: str | None, workers: int) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    args = [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", str(workers)]
    env = dict(os.environ)
    if redis_url:
        args += ["--redis", redis_url]
        env["ENVFOUNDRY_KEY_PREFIX"] = f"efbench-{secrets.token_hex(4)}"
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(f"{url}/healthz", proc)
    return url, proc


def timed(fn: Callable[[], object], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def throughput(fn: Callable[[httpx.Client], object], clients: int, per_client: int, url: str) -> float:
    def worker(_: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            for _ in range(per_client):
                fn(http)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(worker, range(clients)))
    return clients * per_client / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--redis")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base_url, base_proc = start_baseline(Path(tmp))
        svc_url, svc_proc = start_service(args.redis, args.workers)
        try:
            with httpx.Client(base_url=base_url, timeout=60) as base, httpx.Client(base_url=svc_url, timeout=60) as svc:
                call_body = {"name": "get_member", "arguments": {"member_id": "M002"}}
                for _ in range(30):  # warm both servers and every worker
                    base.post("/echo", json=call_body)
                sid = svc.post("/v1/sessions", json={"scenario_id": "lib-001"}).json()["session_id"]
                for _ in range(30):
                    svc.post(f"/v1/sessions/{sid}/calls", json=call_body)

                rows = []
                echo = timed(lambda: base.post("/echo", json=call_body), args.calls)
                rows.append(("baseline echo", echo))
                rows.append(("session create", timed(
                    lambda: svc.post("/v1/sessions", json={"scenario_id": "lib-001"}), args.calls)))
                rows.append(("tool call", timed(lambda: svc.post(f"/v1/sessions/{sid}/calls", json=call_body),
                                                args.calls)))
                rows.append(("state read", timed(lambda: svc.get(f"/v1/sessions/{sid}/state"), args.calls)))
                rows.append(("score (3 checks)", timed(lambda: svc.post(f"/v1/sessions/{sid}/score"),
                                                       max(30, args.calls // 5))))
                rows.append(("fork", timed(lambda: svc.post(f"/v1/sessions/{sid}/fork"), args.calls)))

                base_p50 = pct(echo, 0.5)
                store = "redis" if args.redis else "memory"
                print(f"store={store} sandbox workers={args.workers} calls={args.calls}")
                print(f"{'operation':<18}{'p50 ms':>9}{'p99 ms':>9}{'p50 / baseline p50':>21}")
                for name, samples in rows:
                    p50 = pct(samples, 0.5)
                    print(f"{name:<18}{p50:>9.2f}{pct(samples, 0.99):>9.2f}{p50 / base_p50:>21.1f}x")

                per = max(10, args.calls // args.concurrency)
                base_rps = throughput(lambda h: h.post("/echo", json=call_body), args.concurrency, per, base_url)
                sessions = [svc.post("/v1/sessions", json={"scenario_id": "lib-001"}).json()["session_id"]
                            for _ in range(args.concurrency)]
                index = iter(range(10**9))

                def one_call(http: httpx.Client) -> None:
                    http.post(f"/v1/sessions/{sessions[next(index) % len(sessions)]}/calls", json=call_body)

                svc_rps = throughput(one_call, args.concurrency, per, svc_url)
                print(f"throughput with {args.concurrency} clients: baseline {base_rps:.0f} req/s, "
                      f"tool calls {svc_rps:.0f} calls/s, ratio {svc_rps / base_rps:.2f}")
        finally:
            for proc in (base_proc, svc_proc):
                proc.terminate()
                proc.wait(15)


if __name__ == "__main__":
    main()
