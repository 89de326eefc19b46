"""Load from ``wrk``, pinned to its own CPU, with one session per connection.

wrk gives its Lua ``request()`` no connection id, so the only way to keep a connection on one
session is one connection per thread: ``setup(thread)`` hands each thread its own path, and ``-t``
equals ``-c``. Calls on one session therefore never queue behind that session's lock.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

MARK = "WRKJSON "
SCRIPT = """
local paths = {%(paths)s}
local bodies = {%(bodies)s}
local assigned = 0

function setup(thread)
  assigned = assigned + 1
  thread:set("path", paths[(assigned - 1) %% #paths + 1])
end

function init(args)
  requests = {}
  for i, body in ipairs(bodies) do
    requests[i] = wrk.format("POST", path, {["Content-Type"] = "application/json"}, body)
  end
  sent = 0
end

function request()
  sent = sent + 1
  return requests[(sent - 1) %% #requests + 1]
end

%(done)s"""
# wrk's summary as one JSON line: every script that drives wrk ends with it (see ``sample``).
DONE = """
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('""" + MARK + """{"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"errors": %d, "non_2xx": %d}\\n', summary.requests, summary.duration, latency:percentile(50),
    latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
"""


class ToolMissing(SystemExit):
    pass


def require_tools() -> None:
    """Fail with a plain message when a program the bench cannot do without is absent."""
    for tool, package in (("wrk", "wrk"), ("taskset", "util-linux")):
        if shutil.which(tool) is None:
            raise ToolMissing(f"bench: '{tool}' is not installed; install it with: apt-get install -y {package}")


@dataclass
class Sample:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    non_2xx: int

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "per_second": self.per_second}


def _lua_string(text: str) -> str:
    if "]==]" in text:  # embedded as a Lua long string; this would close it early
        raise ValueError(f"cannot embed {text[:40]!r}... in the wrk script")
    return "[==[" + text + "]==]"


def run(url: str, paths: list[str], bodies: list[str], connections: int, seconds: int, cpu: int) -> Sample:
    """POST ``bodies`` in turn on ``connections`` connections, connection i on ``paths[i]``, for ``seconds``."""
    if len(paths) < connections:
        raise ValueError(f"{connections} connections need {connections} paths (one session each), got {len(paths)}")
    script = SCRIPT % {"paths": ", ".join(_lua_string(p) for p in paths[:connections]),
                       "bodies": ", ".join(_lua_string(b) for b in bodies), "done": DONE}
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(script)
        lua.flush()
        out = subprocess.run(
            ["taskset", "-c", str(cpu), "wrk", "-t", str(connections), "-c", str(connections),
             "-d", f"{seconds}s",
             "--timeout", "30s", "-s", lua.name, url],
            capture_output=True, text=True, timeout=seconds + 60, check=False)
    return sample(out)


def sample(out: subprocess.CompletedProcess[str]) -> Sample:
    """The figures a wrk run printed with ``DONE``. Raises RuntimeError if it failed."""
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith(MARK)), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    raw = json.loads(line[len(MARK):])
    return Sample(requests=raw["requests"], seconds=raw["duration_us"] / 1e6, p50_ms=raw["p50_us"] / 1000,
                  p99_ms=raw["p99_us"] / 1000, errors=raw["errors"], non_2xx=raw["non_2xx"])


def shuffled(order: int) -> str:
    """Lua for a wrk thread's ``init``: shuffle its list ``mine`` of sessions (its ``share``-th), a
    shuffle of its own for each ``order``. Each run then walks its sessions in an order of its own:
    a measured run does not start with the sessions a warm-up called last (those an LRU of live
    sessions keeps when not all fit)."""
    return f"""  math.randomseed(share * 7919 + {order})
  for i = #mine, 2, -1 do
    local j = math.random(i)
    mine[i], mine[j] = mine[j], mine[i]
  end"""
