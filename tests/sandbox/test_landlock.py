"""The Landlock ruleset of environment hosts: what it leaves open and what it hides, applied for
real in a child process (the backends' contract tests cover it in workers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.worker.confine import landlock

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(landlock.abi() < 1, reason="this kernel has no Landlock")


def _covered(path: str, allowed: list[tuple[str, bool]]) -> bool:
    return any(path == p or path.startswith(p + "/") for p, _ in allowed)


def test_the_plan_opens_all_but_hidden_folders_and_gives_back_readable_ones(tmp_path: Path) -> None:
    layers = tmp_path / "layers"
    (layers / "mine").mkdir(parents=True)
    (layers / "theirs").mkdir()
    (tmp_path / "beside").mkdir()
    (tmp_path / "link").symlink_to(layers / "theirs")
    allowed = landlock.plan(hidden=(str(layers),), readable=(str(layers / "mine"),))
    assert _covered(str(layers / "mine" / "x.py"), allowed)
    assert not _covered(str(layers / "theirs" / "x.py"), allowed)
    assert _covered(str(tmp_path / "beside"), allowed)
    assert not _covered(str(tmp_path / "link"), allowed)  # a link is checked where it leads
    assert not any(_covered(p, allowed) for p in ("/proc/1/status", "/sys/fs/cgroup", "/dev/ptmx", "/dev/pts/0"))
    assert all(_covered(p, allowed) for p in landlock.DEVICES)
    assert _covered(os.__file__, allowed)


PROBE = """
import ctypes, json, os, sys
from sandbox.worker.confine import landlock
ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # no_new_privs, as every worker sets
layers, mine = sys.argv[1], sys.argv[2]
landlock.restrict(hidden=(layers,), readable=(mine,))

def opened(path):
    try:
        with open(path) as source:
            return source.read()
    except OSError as exc:
        return exc.errno

print(json.dumps({
    "mine": opened(os.path.join(mine, "module.py")),
    "theirs": opened(os.path.join(layers, "theirs", "module.py")),
    "proc": opened("/proc/self/status"),
    "null": opened("/dev/null"),
    "worker": opened("/proc/1/status"),
}))
"""


def test_a_restricted_process_reads_its_own_layer_and_nothing_hidden(tmp_path: Path) -> None:
    layers = tmp_path / "layers"
    for name in ("mine", "theirs"):
        (layers / name).mkdir(parents=True)
        (layers / name / "module.py").write_text(f"# {name}\n")
    out = subprocess.run([sys.executable, "-c", PROBE, str(layers), str(layers / "mine")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(out.stdout)
    assert seen == {"mine": "# mine\n", "theirs": 13, "proc": 13, "null": "", "worker": 13}, seen
