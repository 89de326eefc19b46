from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import Server, start_server
from tests.redis_cluster import Cluster


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three masters with one replica each, started once for the test session and killed at its end."""
    cluster = Cluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def replicas(redis_url: str, tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    """Two API processes on one Redis under a key prefix of their own (removed afterwards)."""
    prefix = f"eftest-{secrets.token_hex(4)}"
    env = {"ENVFOUNDRY_KEY_PREFIX": prefix}
    first = start_server(tmp_path, redis_url=redis_url, extra_env=env)
    second = start_server(tmp_path, redis_url=redis_url, extra_env=env)
    yield first, second
    first.stop()
    second.stop()
    raw = redis.Redis.from_url(redis_url)
    keys = list(raw.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        raw.delete(*keys)
