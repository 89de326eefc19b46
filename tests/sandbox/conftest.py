"""The sandbox contract's fixture: pools of every backend."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from sandbox.pool.requests import WorkerPool
from sandbox.wire.limits import Limits
from tests.conftest import SANDBOX_IMAGE, containers_of

BACKENDS = ["process", "docker"]


@pytest.fixture(params=BACKENDS)
def pool_factory(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Pools of the backend under test; for docker, also asserts no container outlives its pool."""
    docker = request.getfixturevalue("docker_client") if request.param == "docker" else None

    def backend() -> Any:
        if docker is not None:
            from sandbox.backends.container import DockerBackend

            return DockerBackend(SANDBOX_IMAGE, f"eftest-{secrets.token_hex(4)}")
        from sandbox.backends.process import ProcessBackend

        return ProcessBackend()

    @asynccontextmanager
    async def make(size: int = 2, **limits: Any) -> AsyncIterator[WorkerPool]:
        defaults = {"call_timeout": 3.0, "check_timeout": 2.0, "memory_mb": 256}
        chosen = backend()
        pool = WorkerPool(chosen, size, Limits(**{**defaults, **limits}))
        await pool.start()
        try:
            yield pool
        finally:
            await pool.close()
            if docker is not None:
                assert containers_of(docker, chosen.service) == [], "sandbox containers leaked"

    return make
