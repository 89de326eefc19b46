"""The application factory: builds the app and, in its lifespan, every resource it owns."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from sandbox.pool.requests import WorkerPool
from sandbox.pool.worker import Backend
from service.api import mcp, openenv_routes, problems, ui
from service.api.auth import KeyRing
from service.api.fastpath import FastCalls
from service.api.limits import BodyLimit
from service.api.openenv_orphans import Orphans
from service.api.rest import router
from service.api.sockets import Sockets
from service.catalog.analysis import Analysis
from service.catalog.collection import Catalog
from service.catalog.folders import bundled_catalog_dir
from service.catalog.manifest import drift, manifest
from service.catalog.registry import Registry
from service.engine.sessions import SessionLimits, Sessions
from service.engine.user_llm import UserSimulator
from service.observability import Metrics, flush_logs
from service.server import heap
from service.server.requestlog import RequestLog
from service.server.settings import Settings
from service.stores.store import SessionStore

log = logging.getLogger("envfoundry")

DESCRIPTION = """Stateful tool environments for LLM agents. Create a session from a scenario,
list its tools, call them, read the state and trajectory, fork, and score. Tool failures are
observations (HTTP 200, `ok: false`); service errors are RFC 9457 problem+json."""


class Service(FastAPI):
    """The app, with layers of its own in front of the framework's: every request passes the access
    log and the body limit first, and a tool call is answered there (``service.api.fastpath``)."""

    front: ASGIApp | None = None

    def put_in_front(self, layers: Callable[[ASGIApp], ASGIApp]) -> None:
        """``layers`` around the framework's own handling of a request."""
        self.front = layers(super().__call__)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is None:
            await super().__call__(scope, receive, send)
        else:
            await self.front(scope, receive, send)


def load_catalog(settings: Settings) -> Catalog:
    """Load the configured catalogs; broken packages or scenarios are skipped and logged.

    Raises:
        CatalogError: a catalog folder does not exist.
    """
    catalog = Catalog()
    for folder in settings.catalogs or [bundled_catalog_dir()]:
        catalog.load_dir(folder)
    for problem in catalog.problems:
        log.warning("catalog: %s", problem)
    return catalog


def catalog_manifest(settings: Settings, catalog: Catalog) -> dict[str, Any]:
    """What the service serves from its folders, and how it differs from their lock files (logged)."""
    drifted = [f"{folder}: {line}" for folder in settings.catalogs or [bundled_catalog_dir()]
               for line in drift(Path(folder), catalog)]
    for line in drifted:
        log.warning("catalog drift: %s", line)
    return {**manifest(catalog), "drift": drifted}


def make_store(settings: Settings) -> SessionStore:
    if settings.redis_url or settings.redis_cluster_nodes:
        from service.stores.redis import RedisStore

        return RedisStore(settings.redis_url, ttl=settings.session_ttl, prefix=settings.key_prefix,
                          cluster_nodes=settings.redis_cluster_nodes)
    from service.stores.memory_store import MemoryStore

    return MemoryStore(ttl=settings.session_ttl)


def make_pool(settings: Settings) -> WorkerPool:
    backend: Backend
    if settings.sandbox == "docker":
        from sandbox.backends.container import DockerBackend

        backend = DockerBackend(settings.sandbox_image, settings.instance_name(), cpus=settings.worker_cpus)
    else:
        from sandbox.backends.process import ProcessBackend

        backend = ProcessBackend(uid_base=settings.worker_uid_base)
    return WorkerPool(backend, settings.workers, settings.limits(), max_requests=settings.worker_max_requests,
                      acquire_timeout=settings.sandbox_wait)


def make_user(settings: Settings) -> UserSimulator | None:
    """The simulated user of conversation mode, when an endpoint is configured."""
    if not settings.user_llm_base_url:
        return None
    return UserSimulator(settings.user_llm_base_url, settings.user_llm_model, settings.user_llm_api_key,
                         timeout=settings.user_llm_timeout, temperature=settings.user_llm_temperature)


def make_analysis(settings: Settings, metrics: Metrics | None = None) -> Analysis:
    return Analysis(settings.analysis_timeout, settings.analysis_concurrent, settings.analysis_wait, metrics,
                    memory_mb=settings.analysis_memory_mb, max_tools=settings.analysis_max_tools,
                    max_tools_bytes=settings.analysis_max_tools_bytes)


def _session_limits(settings: Settings, keys: KeyRing) -> SessionLimits:
    """Without API keys every request is one tenant's: a reserve for others would only idle."""
    limits = settings.session_limits()
    return limits if keys.enabled else replace(limits, sandbox_reserve=0)


def create_app(settings: Settings | None = None, catalog: Catalog | None = None) -> FastAPI:
    """The app; ``catalog`` is loaded from ``settings`` at start-up unless given."""
    settings = settings or Settings()
    keys = KeyRing.load(settings.api_keys, settings.api_keys_file)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        heap.release_large_blocks()
        loaded = catalog if catalog is not None else load_catalog(settings)
        packages = settings.packages()
        if packages.layers is not None:
            packages.layers.prepare()
        for problem in await packages.attach_catalog(loaded):  # (builds each missing layer once)
            log.warning("catalog: %s", problem)
        store = make_store(settings)
        await store.ping()
        pool = make_pool(settings)
        await pool.start()
        registry = Registry(loaded, store, pool, max_environments=settings.max_environments,
                            max_scenarios=settings.max_scenarios, max_tenant_bytes=settings.max_tenant_bytes,
                            packages=packages)
        user = make_user(settings)
        app.state.settings = settings
        app.state.manifest = catalog_manifest(settings, loaded)
        app.state.keys = keys
        app.state.analysis = make_analysis(settings, metrics)
        app.state.store = store
        app.state.pool = pool
        app.state.registry = registry
        app.state.sessions = Sessions(registry, store, pool, settings.lock_wait, user,
                                      limits=_session_limits(settings, keys), metrics=metrics)
        log.info("serving %d environments, %d scenarios; store=%s; sandbox=%s x%d",
                 len(loaded.environments), len(loaded.scenarios), "redis" if settings.redis_url else "memory",
                 settings.sandbox, settings.workers)
        try:
            async with mcp.serving(app, settings.max_body_bytes):
                heap.freeze_what_startup_made()
                yield
        finally:
            await app.state.orphans.close()
            app.state.sessions.offload.close()
            await pool.close()
            await store.close()
            if user is not None:
                await user.close()
            flush_logs()  # the access lines waiting (uvicorn may end the process by a signal, skipping exit hooks)

    app = Service(title="envfoundry", version="1.0.0", description=DESCRIPTION, lifespan=lifespan)
    metrics = Metrics()
    app.state.metrics = metrics
    # (made here, not in the lifespan: ``envfoundry serve`` hands it to its connection protocol)
    app.state.sockets = Sockets(settings.socket_limits())
    app.state.orphans = Orphans(settings.openenv_grace)
    problems.install(app)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problems.problem_response(500, "internal", "Internal error", "an unexpected error occurred; "
                                         "it has been logged", request.url.path)

    app.include_router(router)
    mcp.mount(app)
    openenv_routes.mount(app)
    ui.mount(app)
    app.put_in_front(lambda framework: RequestLog(  # outermost: refused bodies are counted and logged too
        BodyLimit(FastCalls(framework, app), max_bytes=settings.max_body_bytes, max_values=settings.max_body_values),
        metrics=metrics))
    return app
