"""The real app in the test process: ``create_app`` with its lifespan run, real sandbox workers, a
real Redis for the redis store, driven by httpx over ASGI. Only the uvicorn subprocess and the
socket between them are gone: in one pytest run a module's server is ready in 0.7-1.4 s this way
against 3.2-4.3 s as a subprocess (which imports the whole stack and parses the catalog first), and
each request skips the HTTP hop.

Use it for the contract of a request and its answer (REST, MCP over plain HTTP, OpenEnv's HTTP
routes). Where the process boundary is the point (several replicas, kill -9, connection bounds,
WebSockets, uvicorn and CLI flags, signals, the API process's resources, the access log, clients
in other venvs or languages that need a real port) use ``tests.conftest.start_server``.

In a module marked ``pytestmark = pytest.mark.in_process`` the ``server`` fixture (and so ``client``)
is the app in this process, once per store.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib.util
import os
from pathlib import Path
from typing import Any
from unittest import mock

import anyio.from_thread
import httpx
from anyio.from_thread import BlockingPortal
from fastapi import FastAPI

from service.catalog.collection import Catalog
from service.server.app import create_app, load_catalog
from service.server.settings import Settings
from tests.conftest import BUNDLED, FIXTURES, SANDBOX_IMAGE, free_port


def settings_for(*, redis_url: str | None = None, extra_env: dict[str, str] | None = None,
                 catalogs: tuple[Path, ...] = (BUNDLED, FIXTURES), workers: int = 2) -> Settings:
    """The settings ``envfoundry serve`` builds from these flags and ``extra_env``, as ``server_command``
    runs it: the test process's own ENVFOUNDRY_* and REDIS_URL are not read. The port is a free one,
    as a server's: nothing listens there, but docker sandboxes are named after it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVFOUNDRY_") and k != "REDIS_URL"}
    env["ENVFOUNDRY_SANDBOX_IMAGE"] = SANDBOX_IMAGE
    env.update(extra_env or {})
    flags: dict[str, Any] = {"catalogs": list(catalogs), "workers": workers, "port": free_port()}
    if redis_url:
        flags["redis_url"] = redis_url
    with mock.patch.dict(os.environ, env, clear=True):  # (Settings reads the environment once, here)
        return Settings(**flags)


_loaded: dict[tuple[tuple[Path, int], ...], Catalog] = {}


def catalog_for(settings: Settings) -> Catalog:
    """What ``load_catalog(settings)`` gives (``envfoundry serve`` loads it so too, before the app), parsed
    once per content of the folders: checking the bundled and fixture catalogs' code is half of an
    app's start, ~1 s, and most test modules' apps serve them."""
    key = tuple((folder, max(p.stat().st_mtime_ns for p in (folder, *folder.rglob("*"))))
                for folder in map(Path, settings.catalogs))
    if key not in _loaded:
        _loaded[key] = load_catalog(settings)
    return copy.deepcopy(_loaded[key])  # (the registry adds what tenants register to the catalog it serves)


class _Transport(httpx.BaseTransport):
    """Hands each request to the app on the portal's event loop, where its lifespan's resources live.
    Requests from several threads run there at once, as on a server; each answer comes back whole."""

    def __init__(self, app: FastAPI, portal: BlockingPortal) -> None:
        # An exception the app's handlers turned into a 500 is re-raised by Starlette after the
        # answer, for the server to log; uvicorn logs it and the client gets the 500: so here.
        self._asgi = httpx.ASGITransport(app, raise_app_exceptions=False)
        self._portal = portal

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # (a generator body is read here, in the caller's thread)
        return self._portal.call(self._send, request)

    async def _send(self, request: httpx.Request) -> httpx.Response:
        response = await self._asgi.handle_async_request(request)
        return httpx.Response(response.status_code, headers=response.headers, content=await response.aread())


class AppServer:
    """An app started in this process, with the interface of ``tests.conftest.Server`` that tests
    use: ``url`` (a name only: nothing listens there), ``client()``, ``stop()``."""

    def __init__(self, settings: Settings) -> None:
        self.app = create_app(settings, catalog_for(settings))
        self.url = f"http://in-process:{settings.port}"
        self._running = contextlib.ExitStack()
        self._portal: BlockingPortal | None = None

    def start(self) -> AppServer:
        try:
            # an event loop of its own thread, as uvicorn's (uvloop where installed, as uvicorn picks)
            portal = self._running.enter_context(anyio.from_thread.start_blocking_portal(
                backend_options={"use_uvloop": importlib.util.find_spec("uvloop") is not None}, name=self.url))
            self._running.enter_context(portal.wrap_async_context_manager(self.app.router.lifespan_context(self.app)))
        except BaseException:
            self._running.close()
            raise
        self._portal = portal
        return self

    def client(self, timeout: float = 60.0, **options: Any) -> httpx.Client:
        assert self._portal is not None, "start() the app first"
        return httpx.Client(base_url=self.url, transport=_Transport(self.app, self._portal), timeout=timeout,
                            **options)

    def stop(self) -> None:
        self._running.close()
        self._portal = None
        # The lifespan froze what existed at start-up out of the collector (service.server.heap): in a
        # server that is start-up's objects, here it is every earlier test's too.
        gc.unfreeze()


def start_app(*, redis_url: str | None = None, extra_env: dict[str, str] | None = None,
              catalogs: tuple[Path, ...] = (BUNDLED, FIXTURES), workers: int = 2) -> AppServer:
    """``tests.conftest.start_server``'s twin: the app these flags and environment make, started."""
    return AppServer(settings_for(redis_url=redis_url, extra_env=extra_env, catalogs=catalogs,
                                  workers=workers)).start()

