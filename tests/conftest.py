"""Shared fixtures: a real Redis, real sandbox workers, a real uvicorn server (or the real app in this process:
tests/in_process.py)."""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "catalog"
FIXTURES = ROOT / "tests" / "fixtures" / "catalog"


class Stoppable(Protocol):
    def stop(self) -> None: ...


S = TypeVar("S", bound=Stoppable)  # a server: a uvicorn subprocess or the app in this process (tests.in_process)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _reachable(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """REDIS_URL or the machine's Redis on 6379; failing both, a redis-server of our own."""
    for url in (os.environ.get("REDIS_URL"), "redis://127.0.0.1:6379/0"):
        if url and _reachable(url):
            yield url
            return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("no Redis reachable and no redis-server binary to start one (apt-get install redis-server)")
    port = free_port()
    folder = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while not _reachable(url):
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("redis-server did not start")
        time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(10)


def drop_keys(redis_url: str, prefix: str) -> None:
    """Remove every key of a test's namespace (never FLUSHDB: other tests share the Redis)."""
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A key namespace of the test's own; its keys are removed afterwards (never FLUSHDB)."""
    prefix = f"eftest-{secrets.token_hex(4)}"
    yield prefix
    drop_keys(redis_url, prefix)



def interruptible() -> None:
    """``preexec_fn`` for a child a test sends SIGINT: a suite started in the background (``cmd &``
    in a script) inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self, timeout: float = 60.0, **options: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, **options)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def server_command(port: int, *, redis_url: str | None = None, extra_env: dict[str, str] | None = None,
                   catalogs: tuple[Path, ...] = (BUNDLED, FIXTURES), workers: int = 2) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a server on ``port`` (run from ROOT), as ``start_server`` runs it."""
    args = [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", str(workers)]
    for folder in catalogs:
        args += ["--catalog", str(folder)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVFOUNDRY_") and k != "REDIS_URL"}
    # The image under test (a checkout may build its own tag so as not to replace another's).
    env["ENVFOUNDRY_SANDBOX_IMAGE"] = SANDBOX_IMAGE
    if redis_url:
        args += ["--redis", redis_url]
    env.update(extra_env or {})
    return args, env


def start_server(tmp: Path, *, redis_url: str | None = None, extra_env: dict[str, str] | None = None,
                 catalogs: tuple[Path, ...] = (BUNDLED, FIXTURES), workers: int = 2, port: int | None = None) -> Server:
    """A server on a free port (or on ``port``: a restart), once it answers /healthz."""
    port = port or free_port()
    log = tmp / f"server-{port}.log"
    args, env = server_command(port, redis_url=redis_url, extra_env=extra_env, catalogs=catalogs, workers=workers)
    with log.open("ab") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = Server(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited early:\n{log.read_text()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"server did not become ready:\n{log.read_text()}")
        time.sleep(0.1)


def per_store(request: pytest.FixtureRequest, start: Callable[..., S], extra_env: dict[str, str] | None = None,
              **options: Any) -> Iterator[S]:
    """What ``start(redis_url=, extra_env=, **options)`` serves on the store ``request.param`` names:
    "memory", or "redis" under a key prefix of its own (its keys dropped after)."""
    env = dict(extra_env or {})
    redis_url = None
    if request.param == "redis":
        redis_url = request.getfixturevalue("redis_url")
        env["ENVFOUNDRY_KEY_PREFIX"] = f"eftest-{secrets.token_hex(4)}"
    server = start(redis_url=redis_url, extra_env=env, **options)
    yield server
    server.stop()
    if redis_url:
        drop_keys(redis_url, env["ENVFOUNDRY_KEY_PREFIX"])


def keyed_server(request: pytest.FixtureRequest, tmp: Path, key_lines: str, env: dict[str, str],
                 catalogs: tuple[Path, ...] = (BUNDLED, FIXTURES), start: Callable[..., S] | None = None) -> Iterator[S]:
    """A server reading its API keys (one hashed line each) from a file, on the store
    ``request.param`` names (see ``per_store``); ``start`` is ``start_server`` in ``tmp`` unless given."""
    (tmp / "keys").write_text(key_lines)
    env = {**env, "ENVFOUNDRY_API_KEYS_FILE": str(tmp / "keys")}
    yield from per_store(request, start or functools.partial(start_server, tmp), env, catalogs=catalogs)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "in_process: the module's server fixture is the app in the test process "
                            "(tests/in_process.py), not a uvicorn subprocess")


@pytest.fixture(scope="module", params=["memory", "redis"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The service once per store: a real uvicorn server on a free port, or in a module marked
    ``in_process`` the real app in this process (a ``tests.in_process.AppServer``)."""
    if request.node.get_closest_marker("in_process"):
        from tests.in_process import start_app  # (it imports this module, and the whole app)

        yield from per_store(request, start_app)
    else:
        yield from per_store(request, functools.partial(start_server, tmp_path_factory.mktemp("server")))


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


SANDBOX_IMAGE = os.environ.get("ENVFOUNDRY_SANDBOX_IMAGE", "envfoundry/sandbox:dev")
SERVICE_IMAGE = os.environ.get("ENVFOUNDRY_SERVICE_IMAGE", "envfoundry/service:dev")
REDIS_IMAGE = os.environ.get("ENVFOUNDRY_REDIS_IMAGE", "envfoundry/redis:dev")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A Docker engine with the project's images, or a skip saying why (a failure under ENVFOUNDRY_REQUIRE_DOCKER=1)."""
    required = os.environ.get("ENVFOUNDRY_REQUIRE_DOCKER") == "1"

    def unavailable(reason: str) -> None:
        if required:
            pytest.fail(f"ENVFOUNDRY_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)

    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        unavailable(f"no Docker engine is reachable ({exc}); scripts/docker-setup starts one")
    from sandbox.backends.container import RUNTIME_LABEL, runtime_digest

    try:
        current = client.images.get(SANDBOX_IMAGE).labels.get(RUNTIME_LABEL) == runtime_digest()
    except docker.errors.ImageNotFound:
        current = False
    if not current:  # missing, or built from older worker code: tests must run this code
        failure = build_images()
        if failure:
            unavailable(failure)
    yield client
    client.close()


def build_images(timeout: float = 1500) -> str | None:
    """Run scripts/docker-images; on failure or timeout say why (and leave nothing running)."""
    process = subprocess.Popen([str(ROOT / "scripts" / "docker-images")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.communicate()
        return f"scripts/docker-images did not finish within {timeout:g} s"
    return None if process.returncode == 0 else f"scripts/docker-images failed: {stderr[-2000:]}"


def images_older_than_sources(client: Any, images: tuple[str, ...]) -> bool:
    """True when an image is missing or was built before the last change to what goes into it."""
    import datetime

    sources = [ROOT / "Dockerfile", ROOT / "pyproject.toml"]
    for folder in ("service", "sandbox", "synthesis", "catalog"):
        sources.extend(p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    newest = max(p.stat().st_mtime for p in sources)
    for name in images:
        try:
            created = client.images.get(name).attrs["Created"]
        except Exception:
            return True
        stamp = datetime.datetime.fromisoformat(created[:26].rstrip("Z") + "+00:00").timestamp()
        if stamp < newest:
            return True
    return False


def containers_of(client: Any, service: str) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": f"envfoundry.service={service}"}))
