"""/healthz latency while hostile requests run, against the same server idle, in one run.

    .venv/bin/python bench/hostile.py [--seconds 5] [--json out.json] [--redis URL] [--root DIR]

Each measured denial-of-service request of the hardening rounds is sent in a loop by client
threads of an attacking tenant while ``wrk`` (pinned with ``taskset`` to CPU 0, the server to
CPU 1) measures /healthz. The table gives /healthz p50/p99 per attack and the ratio to the idle
p99, how each attack was answered, the slowest answer to another tenant's request made during
it (the victim; '-' where the attack has none), and the server's resident memory after it.
``--root`` serves another checkout's code (e.g. the main branch, for figures before a change);
``--redis`` uses a Redis store (a fresh key prefix, removed after). The attacking tenant may store
64 MiB (ENVFOUNDRY_MAX_TENANT_BYTES). Loopback only; bounded by --seconds per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from service.api.auth import new_key  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LITERAL = ("from typing import List, Literal\n\nclass Picky:\n    def __init__(self):\n        self.picked = []\n\n"
           "    def pick(self, values: List[Literal[{}]]) -> dict:\n".format(", ".join(map(str, range(50_000))))
           + '        """Pick."""\n        self.picked = values\n        return {"success": True}\n')
BIG_SET = ("class Big:\n    def __init__(self):\n        self.seen = set(range(1_000_000))\n\n"
           "    def size(self) -> int:\n        \"\"\"Count.\"\"\"\n        return len(self.seen)\n")
SLEEPY = "def check_func(final_state):\n    import time\n    time.sleep(4)\n    return True\n"
FLIPPER = ("class Flipper:\n    def __init__(self):\n        self.cells = [[] for _ in range(1_500_000)]\n\n"
           "    def flip(self) -> int:\n        \"\"\"Flip.\"\"\"\n"
           "        self.cells = [[] if c else [0] for c in self.cells]\n        return len(self.cells)\n")
SHARED = ("class Shared:\n    def __init__(self):\n        shared = tuple(range(6000))\n"
          "        self.index = {(i, shared): i for i in range(560)}\n\n"
          "    def size(self) -> int:\n        \"\"\"Count.\"\"\"\n        return len(self.index)\n")
HOARD = ("class Hoard:\n    def __init__(self):\n        self.blobs = []\n\n"
         "    def hoard(self, megabytes: int) -> int:\n        \"\"\"Keep a blob.\"\"\"\n"
         "        self.blobs.append('x' * (megabytes << 20))\n        return len(self.blobs)\n")
TMP_ABUSE = """
import os, select, stat, struct


class Abuse:
    def __init__(self):
        self.n = 0

    def chmod_tmp(self) -> str:
        \"\"\"Take /tmp's permissions off.\"\"\"
        try:
            os.chmod("/tmp", 0)
        except OSError as exc:
            return type(exc).__name__
        return "changed"

    def links(self) -> int:
        \"\"\"Hard links until /tmp refuses more.\"\"\"
        open("/tmp/f", "w").close()
        made = 0
        try:
            for n in range(600_000):
                os.link("/tmp/f", f"/tmp/l{n}")
                made += 1
        except OSError:
            pass
        return made

    def nest(self) -> int:
        \"\"\"Folders 3,000 deep.\"\"\"
        fd = os.open("/tmp", os.O_RDONLY)
        for _ in range(3000):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(fd)
        return 3000

    def forge(self) -> str:
        \"\"\"An answer of 5.5 M empty lists on the answer pipe.\"\"\"
        body = b'{"ok":true,"error":null,"state":null,"diff":{"added":[],"removed":[],"changed":[]},"result":[' \\
            + b"[]," * 5_499_999 + b"[]]}"
        for fd in range(3, 256):
            try:
                if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                    continue
                os.write(fd, b"")
            except OSError:
                continue
            data = memoryview(struct.pack(">Q", len(body)) + body)
            while data:
                try:
                    data = data[os.write(fd, data):]
                except BlockingIOError:
                    select.select([], [fd], [])
            os._exit(0)
        return "no pipe"
"""
PLAIN = "class Plain:\n    def go(self) -> int:\n        \"\"\"Go.\"\"\"\n        return 1\n"


@dataclass
class Attack:
    fire: Callable[[], object]  # one hostile request; its answer (a status) is counted
    threads: int = 1
    victim: Callable[[], int] | None = None  # another tenant's request, timed during the attack
    cleanup: Callable[[], None] | None = None


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


def attacks(http: httpx.Client, victim: httpx.Client, url: str, attacker_run: str) -> dict[str, Attack]:
    store_sid = http.post("/v1/sessions", json={"scenario_id": "store-001"}).json()["session_id"]
    http.post("/v1/environments", json={"env_id": "picky", "class_name": "Picky", "code": LITERAL})
    picky = http.post("/v1/sessions", json={"env_id": "picky"}).json()["session_id"]
    http.post("/v1/environments", json={"env_id": "big", "class_name": "Big", "code": BIG_SET})
    big = _created(http.post("/v1/sessions", json={"env_id": "big"}))
    sleepy = http.post("/v1/scenarios", json={"env_id": "big", "task": "t",
                                              "checklist": [{"item": str(i), "check": SLEEPY} for i in range(14)]})
    sleepy_sid = _created(http.post("/v1/sessions", json={"scenario_id": sleepy.json()["scenario_id"]}))
    checklist = json.dumps({"env_id": "probe", "task": "t", "checklist": [1] * 2_000_000})
    counter = iter(range(10**9))
    http.post("/v1/environments", json={"env_id": "hoard", "class_name": "Hoard", "code": HOARD})
    heavy = http.post("/v1/sessions", json={"env_id": "hoard"}).json()["session_id"]
    http.post(f"/v1/sessions/{heavy}/calls", json={"name": "hoard", "arguments": {"megabytes": 4}})
    http.post("/v1/environments", json={"env_id": "flipper", "class_name": "Flipper", "code": FLIPPER})
    flipper = http.post("/v1/sessions", json={"env_id": "flipper"}).json()["session_id"]
    http.post("/v1/environments", json={"env_id": "shared", "class_name": "Shared", "code": SHARED})
    shared = http.post("/v1/sessions", json={"env_id": "shared"}).json()["session_id"]
    spinners = [http.post("/v1/sessions", json={"scenario_id": "probe-001"}).json()["session_id"] for _ in range(8)]
    victim_sid = victim.post("/v1/sessions", json={"scenario_id": "probe-001"}).json()["session_id"]
    http.post("/v1/environments", json={"env_id": "abuse", "class_name": "Abuse", "code": TMP_ABUSE})
    abusers = [http.post("/v1/sessions", json={"env_id": "abuse"}).json()["session_id"] for _ in range(3)]
    abuse_turn = iter(range(10**9))

    def abuse(tool: str) -> Callable[[], object]:
        def fire() -> object:
            sid = abusers[next(abuse_turn) % len(abusers)]
            answer = http.post(f"/v1/sessions/{sid}/calls", json={"name": tool})
            if answer.status_code != 200:
                return answer.status_code
            body = answer.json()
            return body["result"] if body["ok"] else body["error"]["type"]
        return fire
    held: list[socket.socket] = []
    spin_turn = iter(range(10**9))

    def big_argument() -> int:
        sid = http.post("/v1/sessions", json={"scenario_id": "probe-001"}).json().get("session_id")
        if sid is None:
            return 429
        status = http.post(f"/v1/sessions/{sid}/calls", json={"name": "tag", "arguments": {
            "tag": "a" * 900_000}}).status_code
        http.delete(f"/v1/sessions/{sid}")
        return status

    def fork_32() -> int:
        answer = http.post(f"/v1/sessions/{heavy}/fork", json={"n": 32})
        for sid in answer.json().get("session_ids", []) if answer.status_code == 201 else []:
            http.delete(f"/v1/sessions/{sid}")
        return answer.status_code

    def idle_socket() -> str:
        if len(held) >= 3000:
            time.sleep(0.01)
            return "held"
        try:
            held.append(socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5))
            return "open"
        except OSError:
            return "refused"

    def websocket(key: str | None) -> Callable[[], str]:
        """Upgrade to an OpenEnv WebSocket and keep it (up to 1,100 per attack)."""
        port = int(url.rsplit(":", 1)[1])
        auth = f"authorization: Bearer {key}\r\n" if key else ""

        def fire() -> str:
            if len(held) >= 1100:
                time.sleep(0.01)
                return "held"
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.sendall((f"GET /openenv/probe/ws HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\n"
                              f"connection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                              f"sec-websocket-version: 13\r\n{auth}\r\n").encode())
                status = sock.recv(64).split(b" ", 2)[1].decode()
            except (OSError, IndexError):
                return "cut"
            held.append(sock)
            return status
        return fire

    def big_head() -> str:
        try:
            with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: ")
                chunk = b"a" * (1 << 20)
                for _ in range(48):
                    sock.sendall(chunk)
                return "sent"
        except OSError:
            return "cut"

    def drop_sockets() -> None:
        for sock in held:
            sock.close()
        held.clear()

    def victim_call() -> int:
        return victim.post(f"/v1/sessions/{victim_sid}/calls", json={"name": "increment"}).status_code

    def victim_registration() -> int:
        return victim.post("/v1/environments", json={"env_id": f"plain-{next(counter)}", "class_name": "Plain",
                                                      "code": PLAIN}).status_code

    def victim_listing() -> int:
        return victim.get("/v1/environments").status_code

    return {
        "place_order, items: [1]*10**6": Attack(lambda: http.post(f"/v1/sessions/{store_sid}/calls", json={
            "name": "place_order", "arguments": {"customer_id": "C001", "items": [1] * 10**6}}).status_code),
        "List[Literal[0..49999]] call": Attack(lambda: http.post(f"/v1/sessions/{picky}/calls", json={
            "name": "pick", "arguments": {"values": list(range(0, 50_000, 50))}}).status_code),
        "POST /v1/scenarios, 2M checks": Attack(lambda: http.post("/v1/scenarios", content=checklist, headers={
            "content-type": "application/json"}).status_code),
        "1 MiB hostile registration": Attack(lambda: http.post(
            "/v1/environments", json=pathological(f"hostile-{next(counter)}")).status_code),
        "GET /state, 1M-item set": Attack(lambda: http.get(f"/v1/sessions/{big}/state").status_code),
        "score, 14 sleeping checks": Attack(lambda: http.post(f"/v1/sessions/{sleepy_sid}/score").status_code),
        "call with a 900 KB argument": Attack(big_argument, victim=victim_call),
        "fork n=32 of a 4 MB session": Attack(fork_32, victim=victim_call),
        "3000 idle connections": Attack(idle_socket, victim=victim_listing, cleanup=drop_sockets),
        "1,100 WebSockets, run-only key": Attack(websocket(attacker_run), victim=victim_listing, cleanup=drop_sockets),
        "1,100 WebSockets, no key": Attack(websocket(None), victim=victim_listing, cleanup=drop_sockets),
        "8 unfinished 48 MiB heads": Attack(big_head, threads=8, victim=victim_listing),
        "4x GET /state, 560 shared keys": Attack(lambda: http.get(f"/v1/sessions/{shared}/state").status_code,
                                                 threads=4),
        "flip 1.5M empty lists": Attack(lambda: http.post(f"/v1/sessions/{flipper}/calls", json={
            "name": "flip"}).status_code),
        "8 hostile submissions vs a plain": Attack(lambda: http.post(
            "/v1/environments", json=pathological(f"hostile-{next(counter)}")).status_code, threads=8,
            victim=victim_registration),
        "chmod /tmp 0": Attack(abuse("chmod_tmp"), victim=victim_call),
        "600,000 hard links in /tmp, 3 sessions": Attack(abuse("links"), threads=3, victim=victim_call),
        "3,000 nested folders in /tmp": Attack(abuse("nest"), victim=victim_call),
        "forged 16.5 MB answer": Attack(abuse("forge"), victim=victim_call),
        "8 spinning calls vs a 1 ms call": Attack(lambda: http.post(
            f"/v1/sessions/{spinners[next(spin_turn) % 8]}/calls", json={"name": "spin"}).status_code, threads=8,
            victim=victim_call),
    }


def _created(answer: httpx.Response) -> str:
    if answer.status_code != 201:
        raise SystemExit(f"bench: could not set up an attack: {answer.status_code} {answer.text[:500]}")
    return str(answer.json()["session_id"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--redis", metavar="URL", help="serve sessions from this Redis (default: memory)")
    parser.add_argument("--root", metavar="DIR", default=str(ROOT), help="the checkout whose code is served")
    parser.add_argument("--only", metavar="TEXT", help="run the attacks whose name holds TEXT")
    args = parser.parse_args()
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench: '{tool}' is missing (apt-get install -y {'wrk' if tool == 'wrk' else 'util-linux'})")
    root = Path(args.root).resolve()
    port = 18000 + os.getpid() % 1000
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVFOUNDRY_") and k != "REDIS_URL"}
    env["ENVFOUNDRY_MAX_ENVIRONMENTS"] = "100000"
    env["ENVFOUNDRY_MAX_TENANT_BYTES"] = str(64 << 20)  # a fork of 32 copies of 4 MB passes it
    attacker_key, attacker_line = new_key("attacker", ["run", "admin"])
    victim_key, victim_line = new_key("victim", ["run", "admin"])
    run_key, run_line = new_key("attacker", ["run"])
    env["ENVFOUNDRY_API_KEYS"] = f"{attacker_line};{victim_line};{run_line}"
    prefix = f"efbench-{secrets.token_hex(4)}"
    command = ["taskset", "-c", "1", sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--catalog",
               str(root / "catalog"), "--catalog", str(root / "tests" / "fixtures" / "catalog")]
    if args.redis:
        command += ["--redis", args.redis]
        env["ENVFOUNDRY_KEY_PREFIX"] = prefix
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "server.log", "wb")
        server = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait(url)
            results: list[dict[str, Any]] = []
            idle = wrk_healthz(url, args.seconds)
            results.append({"attack": "(idle)", "p50_ms": idle[0], "p99_ms": idle[1], "healthz": idle[2],
                            "answers": "", "victim": "-", "rss_mib": _rss_mib(server.pid)})
            with httpx.Client(base_url=url, timeout=120, headers={"authorization": f"Bearer {attacker_key}"}) as http, \
                    httpx.Client(base_url=url, timeout=120, headers={"authorization": f"Bearer {victim_key}"}) as victim:
                for name, attack in attacks(http, victim, url, run_key).items():
                    if args.only and args.only not in name:
                        continue
                    results.append(_under(url, name, attack, args.seconds, server.pid))
        finally:
            server.terminate()
            server.wait(30)
            if args.redis:
                _drop_prefix(args.redis, prefix)
    print(f"{'attack':34} {'healthz p50':>12} {'p99':>9} {'p99/idle':>9} {'healthz n':>10} {'victim':>14} "
          f"{'rss':>8}  answers")
    for r in results:
        ratio = r["p99_ms"] / idle[1] if idle[1] else float("nan")
        print(f"{r['attack']:34} {r['p50_ms']:10.2f}ms {r['p99_ms']:7.2f}ms {ratio:9.1f} {r['healthz']:10d} "
              f"{r['victim']:>14} {r['rss_mib']:6.0f}Mi  {r['answers']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _under(url: str, name: str, attack: Attack, seconds: float, pid: int) -> dict[str, object]:
    statuses: dict[object, int] = {}
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                status = attack.fire()
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(attack.threads)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    victim: list[tuple[float, object]] = []

    def probe() -> None:
        time.sleep(min(1.0, seconds / 3))
        for _ in range(3):
            started = time.perf_counter()
            try:
                answer: object = attack.victim() if attack.victim else None
            except httpx.HTTPError as exc:
                answer = type(exc).__name__
            victim.append(((time.perf_counter() - started) * 1000, answer))

    prober = threading.Thread(target=probe, daemon=True) if attack.victim else None
    if prober:
        prober.start()
    p50, p99, n = wrk_healthz(url, seconds)
    if prober:
        prober.join(120)
    rss = _rss_mib(pid)
    stop.set()
    for thread in threads:
        thread.join(120)
    if attack.cleanup:
        attack.cleanup()
    answers = ", ".join(f"{count}x {status}" for status, count in sorted(statuses.items(), key=str))
    slowest = max(victim, default=None, key=lambda v: v[0])
    shown = "-" if slowest is None else f"{slowest[0]:.0f}ms {slowest[1]}"
    return {"attack": name, "p50_ms": p50, "p99_ms": p99, "healthz": n, "answers": answers, "victim": shown,
            "rss_mib": rss}


def _rss_mib(pid: int) -> float:
    """Resident memory of the server and its children (the sandbox workers), MiB."""
    total = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if fields.get("Pid", "").strip() == str(pid) or fields.get("PPid", "").strip() == str(pid):
            total += int(fields.get("VmRSS", "0 kB").split()[0])
    return total / 1024


def _drop_prefix(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


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
