"""The committed OpenAPI contract, fuzzed against a live server: no 5xx, every response conforms.

schemathesis generates requests for every operation in ``openapi/openapi.json``, ones that fit the
schema and ones that break it, and sends them to a real uvicorn server on Redis; its checks judge
each answer. Hypothesis runs derandomized with no example database, so a run is the same on every
machine and a failure replays as it is. Half the generated path ids (chosen by a stable hash) are
swapped for live ones, so the fuzzed bodies reach the handlers behind the 404s too.

The tests are driven through schemathesis's Python API with Hypothesis's ``given``; its pytest
plugin's lazy schema loading does not run under pytest 9. ``FUZZ_EXAMPLES`` per operation and mode
keeps the module near a minute.
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import schemathesis
from hypothesis import given
from schemathesis import GenerationMode, checks

from tests.conftest import ROOT, Server, start_server

OPENAPI = ROOT / "openapi" / "openapi.json"
FUZZ_EXAMPLES = 150
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]
# Live ids substituted into some generated paths, so the fuzzed bodies reach real objects.
LIVE = {"env_id": "probe", "scenario_id": "probe-001"}

CONTRACT = schemathesis.openapi.from_path(OPENAPI)
CONTRACT.config.generation.update(max_examples=FUZZ_EXAMPLES, deterministic=True, database="none")
OPERATIONS = [result.ok() for result in CONTRACT.get_all_operations()]
# Every operation with input that fits the schema, and with bodies that break it (any string is a valid
# path id, so only bodies can be generated wrong).
CASES = [(op, mode) for op in OPERATIONS for mode in GenerationMode
         if mode is GenerationMode.POSITIVE or len(op.body)]


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Server]:
    prefix = f"eftest-fuzz-{secrets.token_hex(4)}"
    # Short sandbox limits: a fuzzed call that happens to name a slow probe tool ends quickly.
    server = start_server(tmp_path_factory.mktemp("fuzz"), redis_url=redis_url,
                          extra_env={"ENVFOUNDRY_KEY_PREFIX": prefix, "ENVFOUNDRY_CALL_TIMEOUT": "2",
                                     "ENVFOUNDRY_CHECK_TIMEOUT": "1"})
    yield server
    server.stop()
    store = redis.Redis.from_url(redis_url)
    keys = list(store.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        store.delete(*keys)
    store.close()


def _live_session(server: Server) -> str:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        created = http.post("/v1/sessions", json={"scenario_id": "probe-001"})
        assert created.status_code == 201, created.text
        return str(created.json()["session_id"])


def _substitute_live_ids(case: Any, server: Server) -> None:
    """Every other generated id (by a stable hash, so runs repeat) becomes one that exists."""
    params = case.path_parameters or {}
    for name, value in list(params.items()):
        if zlib.crc32(repr(value).encode()) % 2:
            continue
        if name == "session_id":
            params[name] = _live_session(server)
        elif name in LIVE:
            params[name] = LIVE[name]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("operation", "mode"), CASES, ids=[f"{op.label} {mode}" for op, mode in CASES])
def test_every_operation_answers_without_5xx_and_as_the_contract_says(
        operation: Any, mode: GenerationMode, fuzzed_server: Server) -> None:
    settings = CONTRACT.config.get_hypothesis_settings(operation=operation)

    @settings
    @given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case: Any) -> None:
        _substitute_live_ids(case, fuzzed_server)
        case.call_and_validate(base_url=fuzzed_server.url, checks=CHECKS, timeout=30)

    fuzz()
