"""Package layers: each allowed set of requirements installed once, read-only, named by content.

A layer is a folder ``<root>/<key>/`` holding ``site/`` (what ``pip install --target`` wrote,
byte-compiled) and ``layer.json`` (the pins asked for, the distributions installed, the
top-level modules they provide, the interpreter). ``key`` is the SHA-256 of the installed set
(``name==version``, sorted) and the interpreter tag, so environments whose requirements resolve
to the same set share one layer, on every restart.

A build installs wheels only (``--only-binary :all:``: no package code runs at install time), from
the operator's wheelhouse with ``--no-index`` when one is set, else from pip's configured index.
It runs in a child process, never on the event loop; concurrent requests for the same pins wait
for one build (in this process by a shared task, across processes on one machine by a file
lock); it writes into a temporary folder under the root and renames it into place, so a failed or
killed build leaves no layer behind. ``requests/`` remembers which layer each set of pins
resolved to, so a restart serves without running pip.

The sandbox mounts the root read-only and each environment's host puts only its own layer on
``sys.path`` (see ``sandbox.envhost.use_layers``).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import canonicalize_name

from service.catalog import CatalogError
from service.requirements import Pin

BUILD_TIMEOUT = 900.0
FORMAT = 1  # of layer.json and the request index; part of every key


@dataclass(frozen=True)
class Layer:
    key: str
    site: str  # the folder to put on sys.path
    installed: tuple[str, ...]  # "name==version", sorted
    modules: frozenset[str]  # top-level modules it provides


def interpreter_tag(python: str = sys.executable) -> str:
    """What a layer's compiled files and wheels were chosen for: the sandbox must run the same."""
    if python == sys.executable:
        return f"{sys.implementation.cache_tag}-{platform.machine()}"
    out = subprocess.run([python, "-c", "import sys, platform; print(f'{sys.implementation.cache_tag}-"
                          "{platform.machine()}')"], capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


class Layers:
    """Builds and finds layers under ``root``.

    Raises (from ``ensure``):
        CatalogError: ``requirements_not_installable``, pip could not install the pins (its
        message says why).
    """

    def __init__(self, root: Path, *, wheelhouse: Path | None = None, python: str = sys.executable,
                 timeout: float = BUILD_TIMEOUT) -> None:
        self.root = Path(os.path.realpath(root))
        self.wheelhouse = wheelhouse
        self.python = python
        self.timeout = timeout
        self.tag = interpreter_tag(python)
        self.builds = 0  # layers this instance built (not found made already)
        self._known: dict[str, Layer] = {}
        self._pending: dict[str, asyncio.Task[Layer]] = {}

    def prepare(self) -> None:
        """Create the root (readable by the sandbox's users, writable by the service only)."""
        for folder in (self.root, self.root / "requests", self.root / "locks"):
            folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)

    def _request_key(self, pins: list[Pin]) -> str:
        source = f"wheelhouse:{os.path.realpath(self.wheelhouse)}" if self.wheelhouse else "index"
        text = json.dumps([FORMAT, [str(p) for p in pins], self.tag, source])
        return hashlib.sha256(text.encode()).hexdigest()

    async def ensure(self, pins: list[Pin]) -> Layer:
        """The layer for ``pins``, built first if no earlier request made it."""
        request = self._request_key(pins)
        known = self._known.get(request)
        if known is not None:
            return known
        task = self._pending.get(request)
        if task is None:
            task = asyncio.ensure_future(asyncio.to_thread(self._find_or_build, request, pins))
            self._pending[request] = task
            task.add_done_callback(lambda done: self._settled(request, done))
        layer = await asyncio.shield(task)  # a cancelled registration leaves the build to finish
        self._known[request] = layer
        return layer

    def _settled(self, request: str, task: asyncio.Task[Layer]) -> None:
        self._pending.pop(request, None)
        if not task.cancelled():
            task.exception()  # seen here: a build whose every waiter was cancelled fails quietly

    # -- in a thread: files and pip ---------------------------------------------------------
    def _find_or_build(self, request: str, pins: list[Pin]) -> Layer:
        self.prepare()
        with open(self.root / "locks" / request, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another service on this machine may be building it
            layer = self._recorded(request)
            if layer is not None:
                return layer
            layer = self._build(pins)
            _write_atomically(self.root / "requests" / f"{request}.json", json.dumps({"layer": layer.key}))
            return layer

    def _recorded(self, request: str) -> Layer | None:
        try:
            key = json.loads((self.root / "requests" / f"{request}.json").read_text())["layer"]
            return self._read(key)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _read(self, key: str) -> Layer:
        meta = json.loads((self.root / key / "layer.json").read_text())
        return Layer(key=key, site=str(self.root / key / "site"), installed=tuple(meta["installed"]),
                     modules=frozenset(meta["modules"]))

    def _build(self, pins: list[Pin]) -> Layer:
        scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=self.root))
        try:
            site = scratch / "site"
            self._pip(pins, site)
            installed, modules = _contents(site)
            key = hashlib.sha256(json.dumps([FORMAT, installed, self.tag]).encode()).hexdigest()
            final = self.root / key
            if (final / "layer.json").is_file():  # other pins resolved to the same set before
                return self._read(key)
            meta = {"format": FORMAT, "pins": [str(p) for p in pins], "installed": installed,
                    "modules": sorted(modules), "python": self.tag}
            (scratch / "layer.json").write_text(json.dumps(meta, indent=2) + "\n")
            _make_read_only(scratch)
            os.rename(scratch, final)
            self.builds += 1
            return Layer(key=key, site=str(final / "site"), installed=tuple(installed), modules=frozenset(modules))
        finally:
            if scratch.exists():
                _make_writable(scratch)
                shutil.rmtree(scratch, ignore_errors=True)

    def _pip(self, pins: list[Pin], target: Path) -> None:
        source = ["--no-index", "--find-links", str(self.wheelhouse)] if self.wheelhouse else []
        command = [self.python, "-m", "pip", "install", "--quiet", "--no-input", "--disable-pip-version-check",
                   "--only-binary", ":all:", "--target", str(target), *source, "--", *(str(p) for p in pins)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=self.timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise CatalogError(f"installing {', '.join(map(str, pins))} took longer than {self.timeout:g} s",
                               field="requirements", reason="requirements_not_installable") from None
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or \
                done.stderr.strip().splitlines()[-3:]
            where = f"the wheelhouse {self.wheelhouse}" if self.wheelhouse else "the package index"
            raise CatalogError(f"cannot install {', '.join(map(str, pins))} from {where}: "
                               + " ".join(lines)[:2000], field="requirements", reason="requirements_not_installable")


def _contents(site: Path) -> tuple[list[str], set[str]]:
    """The distributions installed in ``site`` and the top-level modules found there."""
    installed = []
    for info in site.glob("*.dist-info"):
        headers = HeaderParser().parsestr((info / "METADATA").read_text(encoding="utf-8", errors="replace"))
        installed.append(f"{canonicalize_name(headers['Name'])}=={headers['Version']}")
    modules = set()
    for entry in site.iterdir():
        name = entry.name
        if name.endswith((".dist-info", ".data")) or name in ("bin", "__pycache__") or name.startswith("."):
            continue
        if entry.is_dir():
            modules.add(name)
        elif name.endswith((".py", ".so", ".pyd")):
            modules.add(name.partition(".")[0])
    return sorted(installed), modules


def _make_read_only(folder: Path) -> None:
    for path, _, files in os.walk(folder):
        for name in files:
            os.chmod(os.path.join(path, name), 0o444)
        os.chmod(path, 0o555)


def _make_writable(folder: Path) -> None:
    for path, _, _ in os.walk(folder):
        os.chmod(path, 0o755)


def _write_atomically(path: Path, text: str) -> None:
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(text)
    os.replace(scratch, path)
