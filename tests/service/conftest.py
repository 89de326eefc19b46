from __future__ import annotations

from collections.abc import Iterator

import pytest

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
