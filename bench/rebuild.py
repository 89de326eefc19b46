"""What a cold session costs to come back, in CPU, against a bare fork and a live call.

    .venv/bin/python bench/rebuild.py [--sessions 300] [--size 16] [--repeat 3]

A session goes cold when its process is ended (memory wanted elsewhere, a replica that never
held it); its next call rebuilds it. Here one process worker (the pool alone, no HTTP, no store)
holds a scenario's initial state in ``init_config`` as a template (``--size`` orders, 16 is about
4 KB of JSON), and each of ``--sessions`` sessions stored as that template's state plus a
one-order delta is called once, cold, then ended: a rebuild as a fork of the template with the
delta applied, the call, and the process's end, which a full worker pays for each session it
rebuilds; ``--live`` more sessions of the template stay live meanwhile, as in a batch. The same with the state decoded whole (no template), a call on a live session, and
a bare ``fork`` + ``_exit`` + ``waitpid`` of a process the size of this one, all measured in
this run.

CPU is what the kernel charges every process of this run, those that ended included: a cgroup
v1 ``cpuacct`` group (or a cgroup v2 group) made for this run, left when it ends. Without one
it says so and stops. Target (issue 36): a rebuild at 4 KB in <= 3 ms of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rl_batch import CODE, orders  # noqa: E402  (the same shop, its state in init_config)
from sandbox.backends.process import ProcessBackend  # noqa: E402
from sandbox.pool.calls import CallOutcome, EnvCode, Stored  # noqa: E402
from sandbox.pool.requests import WorkerPool  # noqa: E402
from sandbox.wire.limits import Limits  # noqa: E402

ENV = EnvCode("bench-rebuild", "bench_rebuild", "Shop", CODE)
TEMPLATE = "bench-rebuild-template"


class CpuGroup:
    """A cgroup holding this process (and so everything it starts): CPU charged to any of them."""

    def __init__(self) -> None:
        name = f"ef-bench-rebuild-{os.getpid()}"
        v1 = "/sys/fs/cgroup/cpuacct"
        self.path = f"{v1}/{name}" if os.path.isdir(v1) else f"/sys/fs/cgroup/{name}"
        self.v1 = self.path.startswith(v1)
        os.makedirs(self.path)
        with open(f"{self.path}/cgroup.procs", "w") as procs:
            procs.write(str(os.getpid()))

    def seconds(self) -> float:
        if self.v1:
            with open(f"{self.path}/cpuacct.usage") as usage:
                return int(usage.read()) / 1e9
        with open(f"{self.path}/cpu.stat") as stat:
            return int(stat.readline().split()[1]) / 1e6

    def leave(self) -> None:
        parent = os.path.dirname(self.path)
        with open(f"{parent}/cgroup.procs", "w") as procs:
            procs.write(str(os.getpid()))
        for _ in range(50):  # (it can be removed once the processes it held are gone)
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def bare_forks(count: int) -> None:
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)


async def measure(args: argparse.Namespace, group: CpuGroup) -> dict[str, float]:
    config = orders(args.size)
    pool = WorkerPool(ProcessBackend(), 1, Limits(call_timeout=30.0))
    await pool.start()
    try:
        for i in range(args.live):  # live sessions of the template beside those measured
            await pool.init_state(ENV, config, session=f"live-{i}", template=TEMPLATE, deltas=True)
        base = await pool.init_state(ENV, config, session="first", template=TEMPLATE, deltas=True)
        digest = pool._initial[TEMPLATE][0]
        order = next(iter(config["orders"]))
        written = await pool.session_call(ENV, "first", 0, "set_order_note", {"order_id": order, "note": "x"},
                                          deltas=True)
        assert isinstance(written, CallOutcome) and written.delta is not None, written
        fields = dict(written.delta["set"])  # (as a store keeps a delta: the fields it set, those it unset gone)
        stored = Stored(base, fields, TEMPLATE, config, digest)
        await pool.init_state(ENV, config, session="second", template=TEMPLATE)
        plain = await pool.session_call(ENV, "second", 0, "set_order_note", {"order_id": order, "note": "x"})
        assert isinstance(plain, CallOutcome) and plain.state is not None, plain
        whole = Stored(plain.state)
        read = ("get_order", {"order_id": order})
        found: dict[str, float] = {}

        async def rebuilds(name: str, state: Stored) -> None:
            started, own = group.seconds(), time.process_time()
            for i in range(args.sessions):
                session = f"{name}-{i}"
                outcome = await pool.session_call(ENV, session, 1, *read, state, deltas=True)
                assert isinstance(outcome, CallOutcome) and outcome.ok, outcome
                pool.end_session(session)
            await asyncio.sleep(0.3)  # (the ends are done off the call path: let them be charged)
            found[name] = (group.seconds() - started) / args.sessions
            found[f"{name} here"] = (time.process_time() - own) / args.sessions

        await rebuilds("template", stored)
        await rebuilds("decoded", whole)
        started = group.seconds()
        for step in range(1, args.sessions + 1):  # (each call is a step, a read too)
            outcome = await pool.session_call(ENV, "first", step, *read, deltas=True)
            assert isinstance(outcome, CallOutcome) and outcome.ok, outcome
        found["live"] = (group.seconds() - started) / args.sessions
    finally:
        await pool.close()
    started = group.seconds()
    bare_forks(args.sessions)
    found["fork"] = (group.seconds() - started) / args.sessions
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--size", type=int, default=16, help="orders in the template's state (16: about 4 KB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--live", type=int, default=0, help="live sessions the worker holds meanwhile")
    args = parser.parse_args()
    try:
        group = CpuGroup()
    except OSError as exc:
        sys.exit(f"no cgroup to charge this run's CPU to ({exc}): run as root on a machine with cgroups")
    try:
        runs = [asyncio.run(measure(args, group)) for _ in range(args.repeat)]
    finally:
        group.leave()
    found = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    print(f"{args.sessions} sessions x {args.repeat} runs, {args.size} orders in init_config, one process worker "
          f"holding {args.live} other live sessions; "
          f"CPU per session (median of runs), load average {os.getloadavg()[0]:.1f}")
    for name, label in (("template", "rebuild: fork of the template + delta, call, end"),
                        ("decoded", "rebuild: state decoded whole, call, end"),
                        ("live", "call on a live session"), ("fork", "bare fork + exit + wait")):
        here = f", {found[name + ' here'] * 1000:.2f} ms of it in the service's process" if name + " here" in found else ""
        print(f"  {label:<52} {found[name] * 1000:6.2f} ms  {found[name] / found['fork']:5.1f}x bare fork{here}")
    verdict = "met" if found["template"] <= 0.003 else "missed"
    print(f"target: rebuild at this size <= 3 ms of a core: {found['template'] * 1000:.2f} ms, {verdict}")


if __name__ == "__main__":
    main()
