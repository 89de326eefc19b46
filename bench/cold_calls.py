"""Sessions beyond what a worker can give processes of their own, against sessions that all have one.

Starts the service twice on one core (Redis store, 2 process workers): once with few live
sessions per worker (``--residents``), so that most calls must rebuild their session, and once
with room for every session. Each makes ``--sessions`` sessions of a scenario whose 4 KB state is
in ``init_config`` (as groups), calls each once, then calls them in turn for ``--rounds`` rounds
from one sequential client, and prints the CPU of the server's process tree per call and the p50,
with the calls served live, rebuilt, and (of either) by a lodge (see ``sandbox/worker/lodge.py``).
No assertion: figures, and the ratio of the first server's to the second's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import rl_batch  # noqa: E402
from bench.servers import launch_service, tree_cpu_seconds  # noqa: E402


def run(residents: int, sessions: int, rounds: int, cpu: int) -> dict[str, float]:
    logs = Path(tempfile.mkdtemp(prefix="bench-cold-calls-"))
    folder = rl_batch.catalog(logs / "catalog")
    os.environ["ENVFOUNDRY_RESIDENTS"] = str(residents)  # (the service starts with this process's environment)
    server = launch_service("cold-calls", folder, cpu, logs, workers=2, redis_url="redis://127.0.0.1:6379/0",
                            sandbox="process")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=120) as http:
            made, _ = rl_batch.make_sessions(http, "shop-4kb", sessions)
            calls = [json.loads(body) for body in rl_batch.bodies(16, 0.3)]

            def walk(turn: int) -> list[float]:
                took = []
                for i, session in enumerate(made):
                    started = time.perf_counter()
                    answer = http.post(f"/v1/sessions/{session}/calls", json=calls[(i + turn) % len(calls)])
                    took.append(time.perf_counter() - started)
                    if answer.status_code != 200:
                        raise SystemExit(f"call failed: {answer.status_code} {answer.text[:300]}")
                return took

            walk(0)  # every member's first call (a group's members are not live until then)
            before, cpu_before = rl_batch.metrics(http), tree_cpu_seconds(server.proc.pid)
            took = [t for turn in range(1, rounds + 1) for t in walk(turn)]
            spent = tree_cpu_seconds(server.proc.pid) - cpu_before
            time.sleep(1.1)  # the workers' figures are at most a second old
            after = rl_batch.metrics(http)
    finally:
        server.stop()
    count = len(took)
    return {"cpu_ms": spent / count * 1000, "p50_ms": statistics.median(took) * 1000,
            **{kind: after.get(kind, 0) - before.get(kind, 0) for kind in ("live", "rebuilt", "lodged")}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--residents", type=int, default=20, help="session processes per worker in the full run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server-cpu", type=int, default=1)
    args = parser.parse_args()
    live = run(4096, args.sessions, args.rounds, args.server_cpu)
    cold = run(args.residents, args.sessions, args.rounds, args.server_cpu)
    print(f"{args.sessions} sessions (4 KB state in init_config) called in turn, {args.rounds} rounds, one client; "
          f"server on CPU {args.server_cpu}, Redis, 2 process workers")
    print(f"{'session processes/worker':>24} {'CPU ms/call':>12} {'p50 ms':>8} {'live':>6} {'rebuilt':>8} {'lodged':>8}")
    for label, row in ((str(4096), live), (str(args.residents), cold)):
        print(f"{label:>24} {row['cpu_ms']:12.2f} {row['p50_ms']:8.2f} {row['live']:6.0f} {row['rebuilt']:8.0f} "
              f"{row['lodged']:8.0f}")
    print(f"with {args.residents} session processes per worker a call costs {cold['cpu_ms'] / live['cpu_ms']:.2f}x "
          f"the CPU of one with a process per session, p50 {cold['p50_ms'] / live['p50_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
