"""The docker backend: each worker is a long-lived, hardened container of the sandbox image.

The worker inside is the same stdlib-only runtime as in the process backend
(``worker.py --container``): it only verifies what the engine enforces. The
service talks to it over the container's attached stdin/stdout, so workers
need no network at all.

Hardening is the default, not an option: no network, read-only root with a
small tmpfs, every capability dropped, no-new-privileges, a non-root user,
memory/CPU/pids limits, an init process, and nothing of the host mounted.

Containers carry two labels: ``envfoundry.service`` (stable across restarts of
one service) and ``envfoundry.instance`` (this process). At start the backend
removes containers of its service left by an earlier instance that crashed;
at close it removes its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import secrets
import socket
import struct
import tempfile
from pathlib import Path
from typing import Any

from sandbox.errors import SandboxError, WorkerLost
from sandbox.pool.worker import Channel, worker_memory_mb
from sandbox.wire.limits import Limits
from sandbox.wire.protocol import HEADER, frame_length
from sandbox.worker.budget import WORKER_FILES, process_budget
from sandbox.worker.confine.contain import tmp_options

log = logging.getLogger("envfoundry.sandbox")

SERVICE_LABEL = "envfoundry.service"
INSTANCE_LABEL = "envfoundry.instance"
ROLE_LABEL = "envfoundry.role"
# The engine multiplexes a non-tty container's output: 1 byte stream, 3 padding, 4 length.
MUX_HEADER = struct.Struct(">BxxxI")
STDOUT = 1
# What the sandbox image holds; its digest is baked into the image as a label.
# The worker side, its wire and the state codec: folders, so a module added to one is in the image.
RUNTIME_FOLDERS = ("worker", "wire", "state")
RUNTIME_LABEL = "envfoundry.runtime"
SANDBOX = Path(__file__).resolve().parents[1]


def runtime_digest() -> str:
    """Digest of the worker runtime here, to tell whether a sandbox image runs the same code."""
    digest = hashlib.sha256()
    for path in runtime_files():
        digest.update(path.encode() + b"\0" + (SANDBOX / path).read_bytes() + b"\0")
    return digest.hexdigest()


def runtime_files() -> list[str]:
    """The sandbox image's files, relative to ``sandbox/``: its ``__init__`` and the runtime folders' modules."""
    files = ["__init__.py"]
    for folder in RUNTIME_FOLDERS:
        files += sorted(str(p.relative_to(SANDBOX)) for p in (SANDBOX / folder).rglob("*.py"))
    return files


class DockerChannel:
    def __init__(self, backend: DockerBackend, container: Any, attached: Any, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, listener: Lender | None = None) -> None:
        self.backend = backend
        self.container = container
        self._attached = attached
        self._reader = reader
        self._writer = writer
        self._buffer = bytearray()
        self._listener = listener

    @property
    def lend(self) -> socket.socket | None:
        """The worker's connection for lending its sessions' processes (see ``sandbox.lane``): it
        connects before it says hello, so once the hello is read it is there to take, or never."""
        return None if self._listener is None else self._listener.take()

    @property
    def name(self) -> str:
        return str(self.container.name)

    async def send(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def _read(self, size: int) -> bytes:
        while len(self._buffer) < size:
            stream, length = MUX_HEADER.unpack(await self._reader.readexactly(MUX_HEADER.size))
            chunk = await self._reader.readexactly(length)
            if stream == STDOUT:
                self._buffer += chunk
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def receive(self) -> bytes:
        return await self._read(frame_length(await self._read(HEADER.size)))

    async def kill(self) -> None:
        self._writer.close()
        _close_attached(self._attached)
        if self._listener is not None:
            self._listener.close()
        await self.backend.remove(self.container)


class Lender:
    """A Unix socket in a folder of its own, mounted read-only into one worker's container, for the
    worker to connect to once: over that connection it lends its sessions' processes. The socket is
    removed as soon as the connection is taken, so nothing else can connect to it after."""

    MOUNT = "/run/envfoundry-lend"

    def __init__(self, root: str) -> None:
        os.makedirs(root, mode=0o711, exist_ok=True)
        self.folder = tempfile.mkdtemp(prefix="worker-", dir=root)
        os.chmod(self.folder, 0o755)  # (the worker's uid must reach the socket)
        self.path = os.path.join(self.folder, "lend.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o666)
        self.listener.listen(1)
        self.listener.setblocking(False)
        self.taken: socket.socket | None = None

    def take(self) -> socket.socket | None:
        if self.taken is None and self.listener.fileno() >= 0:
            try:
                self.taken, _ = self.listener.accept()
            except (BlockingIOError, OSError):
                return None
            self.taken.setblocking(False)
            self._remove()
        return self.taken

    def _remove(self) -> None:
        self.listener.close()
        for remove, path in ((os.unlink, self.path), (os.rmdir, self.folder)):
            try:
                remove(path)
            except OSError:
                pass

    def close(self) -> None:
        self._remove()
        if self.taken is not None:
            self.taken.close()


def _close_attached(attached: Any) -> None:
    """Close every layer docker-py keeps around the hijacked connection."""
    for part in (getattr(attached, "_sock", None), attached, getattr(attached, "_response", None)):
        try:
            if part is not None:
                part.close()
        except Exception:  # already closed by the transport
            pass


class DockerBackend:
    name = "docker"

    def __init__(self, image: str, service: str, *, cpus: float = 1.0, base_url: str | None = None,
                 lend_root: str | None = None) -> None:
        try:
            import docker
        except ImportError as exc:  # pragma: no cover - docker is a declared dependency
            raise SandboxError("the docker backend needs the 'docker' package") from exc
        try:
            self.client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
            self.client.ping()
        except docker.errors.DockerException as exc:
            raise SandboxError(f"no Docker engine reachable: {exc}") from exc
        self._errors = docker.errors
        self._ulimit = docker.types.Ulimit
        self.image = image
        self.service = service
        self.instance = secrets.token_hex(8)
        self.cpus = cpus
        self._names = itertools.count()
        self.removed_orphans = 0
        # Where each worker's lending socket is made (on this host: the engine mounts it from here).
        self.lend_root = lend_root or os.path.join(tempfile.gettempdir(), f"envfoundry-lend-{os.getuid()}")

    def _labels(self) -> dict[str, str]:
        return {SERVICE_LABEL: self.service, INSTANCE_LABEL: self.instance, ROLE_LABEL: "sandbox-worker"}

    async def start(self) -> None:
        """Remove workers an earlier instance of this service left behind when it died."""
        def run() -> int:
            try:
                image = self.client.images.get(self.image)
            except self._errors.ImageNotFound:
                raise SandboxError(f"sandbox image '{self.image}' not found (build it: scripts/docker-images)") from None
            if image.labels.get(RUNTIME_LABEL) != runtime_digest():
                log.warning("sandbox image %s was built from other worker code than this service's; "
                            "rebuild it (scripts/docker-images)", self.image)
            stale = [c for c in self.client.containers.list(all=True, filters={"label": f"{SERVICE_LABEL}={self.service}"})
                     if c.labels.get(INSTANCE_LABEL) != self.instance]
            for container in stale:
                container.remove(force=True)
            return len(stale)

        self.removed_orphans = await asyncio.to_thread(run)
        if self.removed_orphans:
            log.warning("removed %d sandbox containers left by an earlier run of %s", self.removed_orphans, self.service)

    async def spawn(self, slot: int, limits: Limits) -> Channel:
        lender = Lender(self.lend_root)

        def create() -> tuple[Any, Any]:
            memory = f"{worker_memory_mb(limits)}m"
            # Package layers, read-only at the path the service built them at (the layer paths a host
            # is sent are the service's); the lending socket's folder, read-only too.
            volumes = {lender.folder: {"bind": Lender.MOUNT, "mode": "ro"}}
            if limits.layers_root:
                volumes[limits.layers_root] = {"bind": limits.layers_root, "mode": "ro"}
            container = self.client.containers.create(
                self.image,
                command=[*limits.worker_flags(), "--lend-path", f"{Lender.MOUNT}/lend.sock"],
                volumes=volumes,
                name=f"envfoundry-{self.instance}-{slot}-{next(self._names)}",
                labels=self._labels(),
                stdin_open=True,
                # detach=False makes docker-py set StdinOnce: when the service goes away (even by
                # kill -9) its attach closes, the worker reads end-of-file and exits, and the
                # engine removes the container.
                detach=False,
                auto_remove=True,
                tty=False,
                environment={"PYTHONHASHSEED": str(limits.hash_seed)},
                network_mode="none",
                read_only=True,
                tmpfs={"/tmp": f"{tmp_options(limits.tmp_mb, limits.tmp_inodes)},noexec,nosuid,nodev"},
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                user="65534:65534",
                mem_limit=memory,
                memswap_limit=memory,
                pids_limit=1 + process_budget(limits.residents, limits.processes),  # (and init)
                nano_cpus=int(self.cpus * 1e9),
                # the worker's own budget; each call lowers it to ``open_files`` for itself
                ulimits=[self._ulimit(name="nofile", soft=WORKER_FILES, hard=WORKER_FILES)],
                init=True,
                ipc_mode="none",
            )
            try:
                attached = container.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1})
                container.start()
            except Exception:
                container.remove(force=True)
                raise
            return container, attached

        try:
            container, attached = await asyncio.to_thread(create)
        except Exception as exc:  # docker-py also raises requests' errors when the engine is down
            lender.close()
            raise WorkerLost(f"cannot start a sandbox container: {exc}") from exc
        raw = attached._sock  # the hijacked engine connection: raw stdin in, multiplexed stdout out
        reader, writer = await asyncio.open_connection(sock=raw, limit=1 << 20)
        return DockerChannel(self, container, attached, reader, writer, lender)

    async def remove(self, container: Any) -> None:
        def run() -> None:
            try:
                container.remove(force=True)
            except self._errors.NotFound:
                pass
            except self._errors.APIError as exc:
                if exc.status_code != 409:  # 409: removal already in progress
                    raise

        try:
            await asyncio.to_thread(run)
        except Exception as exc:  # engine down: auto_remove takes it once its attach is gone
            log.error("cannot remove sandbox container %s: %s", container.name, exc)

    def own_containers(self) -> list[Any]:
        return list(self.client.containers.list(all=True, filters={"label": f"{INSTANCE_LABEL}={self.instance}"}))

    async def close(self) -> None:
        try:
            containers = await asyncio.to_thread(self.own_containers)
        except Exception as exc:
            log.error("cannot list sandbox containers at shutdown: %s", exc)
            containers = []
        for container in containers:
            await self.remove(container)
        self.client.close()
