"""The code's own checks: ruff's lint rules, mypy in strict mode and the import layers, as pyproject.toml configures them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", ".")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


def test_mypy_strict_finds_nothing() -> None:
    done = _run("mypy")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


def test_imports_keep_the_layers() -> None:
    # A module imports only from layers below its own; the sandbox image's runtime only the standard library.
    done = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


def test_no_module_is_over_600_lines() -> None:
    # A module past this is several things: split it along its seams (the README's "Where things are").
    long = {str(path.relative_to(ROOT)): n for package in ("service", "sandbox", "synthesis")
            for path in (ROOT / package).rglob("*.py") if (n := len(path.read_text().splitlines())) > 600}
    assert not long, long
