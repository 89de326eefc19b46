"""Bytes Redis holds per idle session, against the size of its state.

Starts an API process on the given Redis (its own key prefix), makes one session per bundled scenario and
one per synthetic state size, prints ``MEMORY USAGE`` summed over each session's keys, and removes its keys.

    .venv/bin/python scripts/session_memory.py [--redis redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent

BLOB = '''
class Blob:
    def __init__(self):
        self.data = ""

    def touch(self) -> int:
        """Read the blob's size."""
        return len(self.data)
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def session_bytes(raw: redis.Redis, prefix: str, sid: str) -> tuple[int, int]:
    """(bytes of all the session's keys, length of its stored state)."""
    base = f"{prefix}:session:{{{sid}}}"
    total = 0
    for suffix in ("meta", "state", "initial", "trajectory", "idempotency"):
        total += int(raw.memory_usage(f"{base}:{suffix}", samples=0) or 0)
    return total, int(raw.strlen(f"{base}:state"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    prefix = f"efmem-{secrets.token_hex(4)}"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVFOUNDRY_")}
    env["ENVFOUNDRY_KEY_PREFIX"] = prefix
    server = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", "1",
                               "--redis", args.redis], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    raw = redis.Redis.from_url(args.redis, decode_responses=True)
    try:
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        deadline = time.monotonic() + 30
        while True:
            try:
                if http.get("/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the API process did not start")
            time.sleep(0.2)
        rows: list[tuple[str, int, int]] = []
        for env_summary in http.get("/v1/environments").json()["environments"]:
            scenarios = http.get(f"/v1/environments/{env_summary['env_id']}/scenarios").json()["scenarios"]
            if scenarios:
                sid = http.post("/v1/sessions", json={"scenario_id": scenarios[0]["scenario_id"]}).json()["session_id"]
                used, state = session_bytes(raw, prefix, sid)
                rows.append((scenarios[0]["scenario_id"], state, used))
        env_id = f"blob-{secrets.token_hex(3)}"
        http.post("/v1/environments", json={"env_id": env_id, "class_name": "Blob", "code": BLOB}).raise_for_status()
        for size in (0, 4 * 1024, 400 * 1024):
            created = http.post("/v1/sessions", json={"env_id": env_id, "init_config": {"data": "x" * size}})
            created.raise_for_status()
            used, state = session_bytes(raw, prefix, created.json()["session_id"])
            rows.append((f"synthetic {size // 1024} KB string", state, used))
        print(f"{'session':44} {'state bytes':>12} {'redis bytes':>12} {'overhead':>9}")
        for name, state, used in rows:
            print(f"{name:44} {state:12d} {used:12d} {used - 2 * state:9d}")
        print("overhead = redis bytes - 2 x state (a session keeps its state and its initial state)")
    finally:
        server.terminate()
        server.wait(15)
        keys = list(raw.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            raw.delete(*keys)


if __name__ == "__main__":
    main()
