"""Package layers: each allowed set of requirements installed once, read-only, named by content.

A layer is a folder ``<root>/<key>/`` holding ``site/`` (what ``pip install --target`` wrote,
byte-compiled) and ``layer.json`` (the pins asked for, the distributions installed with the SHA-256
of each one's wheel, the top-level modules they provide, the interpreter). ``key`` is the SHA-256
of the installed wheels (``name==version`` and the wheel file's SHA-256, sorted) and the
interpreter tag: environments whose requirements resolve to the same wheels share one layer, on
every restart, and two different wheels that claim the same ``name==version`` make two layers.

A build installs wheels only (``--only-binary :all:``: no package code runs at install time), from
the operator's wheelhouse with ``--no-index`` when one is set, else from pip's configured index.
pip is given the pins rendered from parsed data (``service.catalog.requirements``) after ``--``, and runs
in ``service.catalog.packages.pipbox``: as BUILD_UID when the service is root (no worker's uid, so the kernel denies
it every worker's ``/proc/<pid>/root``; in a mount and PID namespace of its own where the kernel
allows), with an environment of its own (none of the service's variables) and an empty folder as
its home and working folder. What it installed comes back as a tar stream the service unpacks into
files of its own. pip's error lines are passed on with host paths but the wheelhouse's redacted.
It runs in a child process, never on the event loop; concurrent requests for the same pins wait
for one build (in this process by a shared task, across processes on one machine by a file
lock); it writes into a temporary folder under the root and renames it into place, so a failed or
killed build leaves no layer behind. ``requests/`` remembers which layer each set of pins
resolved to, so a restart serves without running pip.

The sandbox mounts the root read-only and each environment's host puts only its own layer on
``sys.path`` (see ``sandbox.worker.envhost.use_layers``).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from ast import literal_eval
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from packaging.utils import canonicalize_name

from service.catalog.model import CatalogError
from service.catalog.requirements import Pin

BUILD_TIMEOUT = 900.0
FORMAT = 2  # of layer.json and the request index; part of every key (2: keyed by the wheels' SHA-256)
# pip's uid and gid when the service runs as root (ENVFOUNDRY_BUILD_UID): none a sandbox worker
# runs as (process workers take worker_uid_base and up, see sandbox.backends.process.UID_SPAN; docker
# workers run as 65534), and never root.
BUILD_UID = 60999
PIPBOX = Path(__file__).with_name("pipbox.py")
BUILD_PATH = "/usr/local/bin:/usr/bin:/bin"
# What of pip's configuration reaches the build, as PIP_* variables: where packages come from. The
# service resolves it with its own environment and config files (``pip config list``); pip then
# still reads the machine's global config files, but neither the service's environment nor the
# user config of the service's home.
INDEX_OPTIONS = ("index-url", "extra-index-url", "find-links", "trusted-host")
_PATH = re.compile(r"(?:file://|(?<![\w:/.~-]))/[^\s'\"(),;]*")


@dataclass(frozen=True)
class Layer:
    key: str
    site: str  # the folder to put on sys.path
    installed: tuple[str, ...]  # "name==version", sorted
    modules: frozenset[str]  # top-level modules it provides


_DESCRIBE = ("import json, os, platform, sys; print(json.dumps([f'{sys.implementation.cache_tag}-"
             "{platform.machine()}', [os.path.dirname(os.__file__), sys.prefix, sys.base_prefix, *sys.path]]))")


def interpreter_tag(python: str = sys.executable) -> str:
    """What a layer's compiled files and wheels were chosen for: the sandbox must run the same."""
    return _describe(python)[0]


def _describe(python: str) -> tuple[str, list[str]]:
    """``python``'s interpreter tag, and the folders it reads (itself, its prefixes, its sys.path)."""
    out = subprocess.run([python, "-c", _DESCRIBE], capture_output=True, text=True, check=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    tag, folders = json.loads(out.stdout)
    folders.append(os.path.dirname(os.path.realpath(python)))
    folders.append(os.path.dirname(os.path.abspath(python)))
    return tag, sorted({os.path.realpath(f) for f in folders if f and os.path.isdir(f)})


class Layers:
    """Builds and finds layers under ``root``.

    Raises (from ``ensure``):
        CatalogError: ``requirements_not_installable``, pip could not install the pins (its
        message says why).
    """

    def __init__(self, root: Path, *, wheelhouse: Path | None = None, python: str = sys.executable,
                 timeout: float = BUILD_TIMEOUT, build_uid: int = BUILD_UID) -> None:
        self.root = Path(os.path.realpath(root))
        self.wheelhouse = wheelhouse
        self.python = python  # the interpreter that runs pip (and whose tag the layer is for)
        self.timeout = timeout
        self.build_uid = build_uid
        self.tag, self.readable = _describe(python)
        if wheelhouse is not None:
            self.readable.append(os.path.realpath(wheelhouse))
        self._index: dict[str, str] | None = None  # resolved at the first build from an index
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
            report = self._pip(pins, scratch)
            site = scratch / "site"
            installed, modules = _contents(site)
            wheels = self._wheels(report, pins)
            if sorted(wheels) != installed:
                raise CatalogError(f"installing {', '.join(map(str, pins))}: pip reported {sorted(wheels)} but "
                                   f"installed {installed}", field="requirements",
                                   reason="requirements_not_installable")
            key = hashlib.sha256(json.dumps([FORMAT, sorted(wheels.items()), self.tag]).encode()).hexdigest()
            final = self.root / key
            if (final / "layer.json").is_file():  # other pins resolved to the same wheels before
                return self._read(key)
            (scratch / "report.json").unlink()
            meta = {"format": FORMAT, "pins": [str(p) for p in pins], "installed": installed,
                    "wheels": dict(sorted(wheels.items())), "modules": sorted(modules), "python": self.tag}
            (scratch / "layer.json").write_text(json.dumps(meta, indent=2) + "\n")
            _make_read_only(scratch)
            os.rename(scratch, final)
            self.builds += 1
            return Layer(key=key, site=str(final / "site"), installed=tuple(installed), modules=frozenset(modules))
        finally:
            if scratch.exists():
                _make_writable(scratch)
                shutil.rmtree(scratch, ignore_errors=True)

    def _pip(self, pins: list[Pin], scratch: Path) -> dict[str, Any]:
        """Run pip in ``service.catalog.packages.pipbox`` and unpack what it installed into ``scratch`` (``site/``,
        ``report.json``); returns pip's installation report.

        Raises:
            CatalogError: ``requirements_not_installable``.
        """
        root = os.geteuid() == 0
        if root and self.wheelhouse is not None and os.stat(self.wheelhouse).st_mode & 0o005 != 0o005:
            # (closed folders above it are passed through; the wheelhouse itself is read as is)
            raise CatalogError(f"cannot install {', '.join(map(str, pins))}: the wheelhouse {self.wheelhouse} is "
                               f"not readable by other users, pip's uid {self.build_uid} among them (chmod o+rx)",
                               field="requirements", reason="requirements_not_installable")
        work = scratch / "work"
        work.mkdir()
        if root:
            # pip's uid reaches only work/ (sticky and writable by all, as /tmp is) through the scratch
            # folder, which it may pass but not list. Nothing of a worker's can reach either: process
            # workers see the layers folder read-only, docker workers get it mounted read-only.
            os.chmod(scratch, 0o711)
            os.chmod(work, 0o1777)
        source = ["--no-index", "--find-links", str(self.wheelhouse)] if self.wheelhouse else []
        args = ["install", "--quiet", "--no-input", "--disable-pip-version-check", "--no-cache-dir",
                "--only-binary", ":all:", "--target", str(work / "site"), "--report", str(work / "report.json"),
                *source, "--", *(str(p) for p in pins)]  # (rendered from parsed names and versions)
        env = self._environment(work)
        links = [f for f in env.get("PIP_FIND_LINKS", "").split() if os.path.isdir(f)]  # (local folders)
        spec = {"uid": self.build_uid, "gid": self.build_uid, "work": str(work), "python": self.python,
                "readable": [*self.readable, *links], "args": args}
        stream = scratch / "installed.tar"
        try:
            with open(stream, "wb") as out:
                done = subprocess.run([sys.executable, "-I", str(PIPBOX), json.dumps(spec)], stdout=out,
                                      stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd="/",
                                      env=env, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise CatalogError(f"installing {', '.join(map(str, pins))} took longer than {self.timeout:g} s",
                               field="requirements", reason="requirements_not_installable") from None
        finally:
            shutil.rmtree(work, ignore_errors=True)  # (pipbox emptied it)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or \
                done.stderr.strip().splitlines()[-3:]
            where = f"the wheelhouse {self.wheelhouse}" if self.wheelhouse else "the package index"
            raise CatalogError(f"cannot install {', '.join(map(str, pins))} from {where}: "
                               + self._redact(" ".join(lines))[:2000], field="requirements",
                               reason="requirements_not_installable")
        try:
            _unpack(stream, scratch)
            report: dict[str, Any] = json.loads((scratch / "report.json").read_text())
        except (OSError, ValueError, tarfile.TarError) as exc:
            raise CatalogError(f"installing {', '.join(map(str, pins))}: pip's output is unreadable ({exc})",
                               field="requirements", reason="requirements_not_installable") from None
        finally:
            stream.unlink(missing_ok=True)
        return report

    def _environment(self, work: Path) -> dict[str, str]:
        """All the environment pip gets: nothing of the service's but where packages come from."""
        env = {"PATH": BUILD_PATH, "LANG": "C.UTF-8", "HOME": str(work / "home"), "TMPDIR": str(work / "tmp"),
               "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
        if self.wheelhouse is None:
            if self._index is None:
                self._index = _index_configuration(self.python)
            env.update(self._index)
        return env

    def _wheels(self, report: dict[str, Any], pins: list[Pin]) -> dict[str, str]:
        """``name==version`` -> the SHA-256 of the wheel pip installed it from. A wheel in the
        wheelhouse is hashed here; one from an index by pip (``--report``: pip 23 gives
        ``archive_info.hash``, later ones ``archive_info.hashes`` too).

        Raises:
            CatalogError: ``requirements_not_installable``, a wheel's SHA-256 is unknown.
        """
        wheels = {}
        for item in report.get("install") or []:
            meta = item.get("metadata") or {}
            pinned = f"{canonicalize_name(str(meta.get('name')))}=={meta.get('version')}"
            info = item.get("download_info") or {}
            archive = info.get("archive_info") or {}
            digest = self._local_digest(str(info.get("url", "")))
            if digest is None:
                digest = (archive.get("hashes") or {}).get("sha256")
            if digest is None and str(archive.get("hash", "")).startswith("sha256="):
                digest = str(archive["hash"]).partition("=")[2]
            if not isinstance(digest, str) or not re.fullmatch("[0-9a-f]{64}", digest):
                raise CatalogError(f"installing {', '.join(map(str, pins))}: pip did not say which wheel "
                                   f"{pinned} came from", field="requirements",
                                   reason="requirements_not_installable")
            wheels[pinned] = digest
        return wheels

    def _local_digest(self, url: str) -> str | None:
        """The SHA-256 of a wheel in the wheelhouse that ``url`` names, else None."""
        if self.wheelhouse is None or not url.startswith("file://"):
            return None
        path = os.path.realpath(unquote(urlparse(url).path))
        if os.path.dirname(path) != os.path.realpath(self.wheelhouse) or not os.path.isfile(path):
            return None
        digest = hashlib.sha256()
        with open(path, "rb") as wheel:
            for block in iter(lambda: wheel.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()

    def _redact(self, text: str) -> str:
        """``text`` with every absolute path or file URL but the wheelhouse's replaced."""
        keep = [str(self.wheelhouse), os.path.realpath(self.wheelhouse)] if self.wheelhouse else []

        def path(match: re.Match[str]) -> str:
            found = match.group(0).removeprefix("file://")
            return match.group(0) if any(found == k or found.startswith(k + "/") for k in keep) else "<path>"

        return _PATH.sub(path, text)


def _index_configuration(python: str) -> dict[str, str]:
    """Where pip takes packages from for the service (its environment and config files), as the
    PIP_* variables that say the same."""
    try:
        out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        section, _, option = key.rpartition(".")
        if option in INDEX_OPTIONS:
            try:
                found.setdefault(option, {})[section] = str(literal_eval(value))
            except (ValueError, SyntaxError):
                continue
    env = {}
    for option, sections in found.items():
        for section in (":env:", "install", "global"):  # pip's precedence
            if section in sections:
                env["PIP_" + option.upper().replace("-", "_")] = sections[section]
                break
    return env


def _unpack(stream: Path, folder: Path) -> None:
    """What pipbox streamed: ``report.json`` and ``site/``, folders and regular files only.

    Raises:
        tarfile.TarError: anything else in the stream.
    """
    with tarfile.open(stream, mode="r:") as archive:
        for member in archive:
            name = member.name
            if not (name == "report.json" and member.isreg() or (name == "site" or name.startswith("site/"))
                    and (member.isreg() or member.isdir())):
                raise tarfile.TarError(f"unexpected {name!r}")
            archive.extract(member, folder, filter="data")


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
