"""What a live session costs in memory, at a 4 KB state and at a 3 MB database.

    .venv/bin/python bench/live_memory.py [--sessions 8] [--backend process|docker]

Creates ``--sessions`` live sessions of one environment in a one-worker pool and prints, per
state size, what each live session adds to the worker's memory cgroup (the kernel's own count,
page cache aside), what the kernel counts as each session process's resident memory, the
sessions still live (the worker ends the least recently used ones once fewer than one call's
memory limit is left), and how much the worker gives back once they are deleted. Before live
sessions were budgeted by measure, every one was assumed to cost 4 MB. Rows marked "t" make the
sessions from one template (as the service does for sessions of one scenario): the first builds
the initial state, the others are forks of it, sharing its pages until they change them; their
create time is the mean over all sessions, the first included.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.state_size import CODE  # noqa: E402  (the same class, at several sizes)
from sandbox.pool.calls import EnvCode  # noqa: E402
from sandbox.pool.requests import WorkerPool  # noqa: E402
from sandbox.wire.limits import Limits  # noqa: E402

ENV = EnvCode("bench-live-memory", "bench_live_memory", "World", CODE)
SIZES = {"4 KB": 25, "3 MB": 20000}
MB = 1 << 20


def _backend(name: str) -> object:
    if name == "docker":
        from sandbox.backends.container import DockerBackend

        return DockerBackend("envfoundry/sandbox:dev", "bench-live-memory")
    from sandbox.backends.process import ProcessBackend

    return ProcessBackend()


async def measure(records: int, sessions: int, backend: str, template: str | None) -> dict[str, float]:
    pool = WorkerPool(_backend(backend), 1, Limits(call_timeout=30.0))  # type: ignore[arg-type]
    await pool.start()
    try:
        await pool.init_state(ENV, {"size": records}, session="warm-up")  # the host loads the class
        pool.end_session("warm-up")
        await asyncio.sleep(0.2)
        (before,) = (await pool.measure()).values()
        state_bytes = 0
        started = time.perf_counter()
        for i in range(sessions):
            state_bytes = len(await pool.init_state(ENV, {"size": records}, session=f"s{i}", template=template))
        create = (time.perf_counter() - started) / sessions
        (held,) = (await pool.measure()).values()
        for i in range(sessions):
            pool.end_session(f"s{i}")
        await asyncio.sleep(0.5)
        (after,) = (await pool.measure()).values()
    finally:
        await pool.close()
    live = max(held.live, 1)
    return {"state_bytes": state_bytes, "create_s": create, "per_session_mb": ((held.used or 0) - (before.used or 0))
            / live / MB, "resident_mb": held.live_bytes / live / MB, "live": held.live, "evicted": held.evicted,
            "left_mb": ((after.used or 0) - (before.used or 0)) / MB, "limit_mb": (held.limit or 0) / MB}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--backend", choices=("process", "docker"), default="process")
    args = parser.parse_args()
    print(f"{args.sessions} live sessions, one {args.backend} worker, default limits")
    print(f"{'state':>6} {'encoded':>10} {'create':>8} {'per session':>12} {'its process':>12} {'live':>5} "
          f"{'evicted':>8} {'after delete':>13} {'vs 4 MB assumed':>16}")
    for (label, records), template in ((size, t) for t in (None, "bench") for size in SIZES.items()):
        m = await measure(records, args.sessions, args.backend, template)
        label = f"{label}{' t' if template else ''}"
        print(f"{label:>6} {m['state_bytes'] / 1024:>8.0f}KB {m['create_s'] * 1000:>6.0f}ms "
              f"{m['per_session_mb']:>10.1f}MB {m['resident_mb']:>10.1f}MB {m['live']:>5.0f} {m['evicted']:>8.0f} "
              f"{m['left_mb']:>11.1f}MB {m['per_session_mb'] / 4:>15.1f}x")


if __name__ == "__main__":
    asyncio.run(main())
