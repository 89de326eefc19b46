"""/healthz latency while hostile requests run, against the same server idle, in one run.

    .venv/bin/python bench/hostile.py [--seconds 5] [--json out.json]

Each measured denial-of-service request from the service-hardening issue is sent in a loop by a
client thread while ``wrk`` (pinned with ``taskset`` to CPU 0, the server to CPU 1) measures
/healthz. The table gives /healthz p50/p99 per attack and the ratio to the idle p99, and how
each attack was answered. Loopback only; bounded by --seconds per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
LITERAL = ("from typing import List, Literal\n\nclass Picky:\n    def __init__(self):\n        self.picked = []\n\n"
           "    def pick(self, values: List[Literal[{}]]) -> dict:\n".format(", ".join(map(str, range(50_000))))
           + '        """Pick."""\n        self.picked = values\n        return {"success": True}\n')
BIG_SET = ("class Big:\n    def __init__(self):\n        self.seen = set(range(1_000_000))\n\n"
           "    def size(self) -> int:\n        \"\"\"Count.\"\"\"\n        return len(self.seen)\n")
SLEEPY = "def check_func(final_state):\n    import time\n    time.sleep(4)\n    return True\n"


def pathological(env_id: str) -> dict[str, str]:
    union = "Union[" + ", ".join(["int", "str"] * 6000) + "]"
    doc = "Args:\n" + "".join(f"            a{i} ({'List[' * 20}int{']' * 20}): x\n" for i in range(6000))
    code = (f"from typing import Union, List\n\nclass Hostile:\n    def __init__(self):\n        self.n = 0\n\n"
            f"    def go(self, value: {union}) -> int:\n        \"\"\"{doc}\"\"\"\n        return 1\n")
    return {"env_id": env_id, "class_name": "Hostile", "code": code[: (1 << 20) - 1]}


def wrk_healthz(url: str, seconds: float) -> tuple[float, float, int]:
    out = subprocess.run(["taskset", "-c", "0", "wrk", "-t1", "-c4", f"-d{seconds:g}s", "--latency", f"{url}/healthz"],
                         capture_output=True, text=True, check=True).stdout
    p50 = _ms(re.search(r"\n\s+50%\s+(\S+)", out))
    p99 = _ms(re.search(r"\n\s+99%\s+(\S+)", out))
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    return p50, p99, requests


def _ms(match: re.Match[str] | None) -> float:
    if match is None:
        return float("nan")
    value = match.group(1)
    for unit, scale in (("us", 0.001), ("ms", 1.0), ("s", 1000.0)):
        if value.endswith(unit):
            return float(value[: -len(unit)]) * scale
    return float(value)


def attacks(http: httpx.Client) -> dict[str, Callable[[], int]]:
    store_sid = http.post("/v1/sessions", json={"scenario_id": "store-001"}).json()["session_id"]
    http.post("/v1/environments", json={"env_id": "picky", "class_name": "Picky", "code": LITERAL})
    picky = http.post("/v1/sessions", json={"env_id": "picky"}).json()["session_id"]
    http.post("/v1/environments", json={"env_id": "big", "class_name": "Big", "code": BIG_SET})
    big = http.post("/v1/sessions", json={"env_id": "big"}).json()["session_id"]
    sleepy = http.post("/v1/scenarios", json={"env_id": "big", "task": "t",
                                              "checklist": [{"item": str(i), "check": SLEEPY} for i in range(14)]})
    sleepy_sid = http.post("/v1/sessions", json={"scenario_id": sleepy.json()["scenario_id"]}).json()["session_id"]
    checklist = json.dumps({"env_id": "probe", "task": "t", "checklist": [1] * 2_000_000})
    counter = iter(range(10**9))
    return {
        "place_order, items: [1]*10**6": lambda: http.post(f"/v1/sessions/{store_sid}/calls", json={
            "name": "place_order", "arguments": {"customer_id": "C001", "items": [1] * 10**6}}).status_code,
        "List[Literal[0..49999]] call": lambda: http.post(f"/v1/sessions/{picky}/calls", json={
            "name": "pick", "arguments": {"values": list(range(0, 50_000, 50))}}).status_code,
        "POST /v1/scenarios, 2M checks": lambda: http.post("/v1/scenarios", content=checklist, headers={
            "content-type": "application/json"}).status_code,
        "1 MiB hostile registration": lambda: http.post("/v1/environments",
                                                         json=pathological(f"hostile-{next(counter)}")).status_code,
        "GET /state, 1M-item set": lambda: http.get(f"/v1/sessions/{big}/state").status_code,
        "score, 14 sleeping checks": lambda: http.post(f"/v1/sessions/{sleepy_sid}/score").status_code,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench: '{tool}' is missing (apt-get install -y {'wrk' if tool == 'wrk' else 'util-linux'})")
    port = 18000 + os.getpid() % 1000
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVFOUNDRY_")}
    env["ENVFOUNDRY_MAX_ENVIRONMENTS"] = "100000"
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "server.log", "wb")
        server = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-m", "service.cli", "serve", "--port",
                                   str(port), "--catalog", str(ROOT / "catalog"), "--catalog",
                                   str(ROOT / "tests" / "fixtures" / "catalog")], cwd=ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait(url)
            results = []
            idle = wrk_healthz(url, args.seconds)
            results.append({"attack": "(idle)", "p50_ms": idle[0], "p99_ms": idle[1], "healthz": idle[2],
                            "answers": ""})
            with httpx.Client(base_url=url, timeout=120) as http:
                for name, fire in attacks(http).items():
                    results.append(_under(url, name, fire, args.seconds, idle[1]))
        finally:
            server.terminate()
            server.wait(30)
    print(f"{'attack':34} {'healthz p50':>12} {'p99':>9} {'p99/idle':>9} {'healthz n':>10}  answers")
    for r in results:
        ratio = r["p99_ms"] / idle[1] if idle[1] else float("nan")
        print(f"{r['attack']:34} {r['p50_ms']:10.2f}ms {r['p99_ms']:7.2f}ms {ratio:9.1f} {r['healthz']:10d}  "
              f"{r['answers']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _under(url: str, name: str, fire: Callable[[], int], seconds: float, idle_p99: float) -> dict[str, object]:
    statuses: dict[int, int] = {}
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            status = fire()
            statuses[status] = statuses.get(status, 0) + 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    time.sleep(0.2)
    p50, p99, n = wrk_healthz(url, seconds)
    stop.set()
    thread.join(120)
    answers = ", ".join(f"{count}x {status}" for status, count in sorted(statuses.items()))
    return {"attack": name, "p50_ms": p50, "p99_ms": p99, "healthz": n, "answers": answers}


def _wait(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("bench: the server did not start")


if __name__ == "__main__":
    sys.exit(main())
