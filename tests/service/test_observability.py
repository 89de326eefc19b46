"""/metrics, /readyz and request ids from the real app (in this process); structured logs from a real server."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, start_server
from tests.in_process import start_app


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text, 0 when absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(rf"^{name}(?:\{{(.*)\}})? (\S+)$", line)
        if match and ",".join(sorted((match.group(1) or "").split(","))) == wanted:
            return float(match.group(2))
    return 0.0


def test_metrics_move_by_what_an_episode_did() -> None:
    server = start_app()
    try:
        with server.client() as client:
            before = client.get("/metrics").text
            sid = client.post("/v1/sessions", json={"scenario_id": "probe-001"}).json()["session_id"]
            for by in (1, 2, 3):
                assert client.post(f"/v1/sessions/{sid}/calls", json={"name": "increment",
                                                                      "arguments": {"by": by}}).json()["ok"]
            assert client.post(f"/v1/sessions/{sid}/calls", json={"name": "nope"}).json()["ok"] is False
            client.post(f"/v1/sessions/{sid}/fork", json={"n": 2})
            client.post(f"/v1/sessions/{sid}/score")
            client.get("/v1/sessions/ses_missing")
            after = client.get("/metrics")
        assert after.headers["content-type"].startswith("text/plain")
        text = after.text
        calls = {"method": "POST", "route": "/v1/sessions/{session_id}/calls", "status": "200"}
        assert sample(text, "envfoundry_http_requests_total", **calls) - \
            sample(before, "envfoundry_http_requests_total", **calls) == 4
        missing = {"method": "GET", "route": "/v1/sessions/{session_id}", "status": "404"}
        assert sample(text, "envfoundry_http_requests_total", **missing) == 1
        assert sample(text, "envfoundry_tool_calls_total", outcome="ok") == 3
        assert sample(text, "envfoundry_tool_calls_total", outcome="unknown_tool") == 1
        assert sample(text, "envfoundry_sessions_created_total", kind="create") == 1
        assert sample(text, "envfoundry_sessions_created_total", kind="fork") == 2
        assert sample(text, "envfoundry_http_request_duration_seconds_count", method="POST",
                      route="/v1/sessions/{session_id}/calls") == 4
        assert sample(text, "envfoundry_sandbox_workers", state="idle") + \
            sample(text, "envfoundry_sandbox_workers", state="busy") == 2
        assert sample(text, "envfoundry_store_duration_seconds_count") > 0
    finally:
        server.stop()


def test_request_ids_and_json_logs_without_secrets(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    secret = "s3cret-" + secrets.token_hex(6)
    try:
        with server.client() as client:
            echoed = client.get("/healthz", headers={"X-Request-ID": "trace-abc.123"})
            assert echoed.headers["X-Request-ID"] == "trace-abc.123"
            made = client.get("/healthz", headers={"X-Request-ID": "bad id with spaces"}).headers["X-Request-ID"]
            assert re.fullmatch(r"[0-9a-f]{16}", made)
            sid = client.post("/v1/sessions", json={"scenario_id": "probe-001"}).json()["session_id"]
            client.post(f"/v1/sessions/{sid}/calls", json={"name": "add_item",
                                                           "arguments": {"item_id": "A1", "name": secret}},
                        headers={"X-Request-ID": "call-1"})
    finally:
        server.stop()
    text = server.log.read_text()
    assert secret not in text
    entries = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    call = next(e for e in entries if e.get("request_id") == "call-1")
    assert call["route"] == "/v1/sessions/{session_id}/calls" and call["status"] == 200
    assert call["session"] == sid and call["method"] == "POST" and call["duration_ms"] > 0
    assert call["level"] == "info" and call["time"].endswith("+00:00")
    assert {"time", "level", "logger", "message"} <= set(entries[0])


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server to start a Redis of its own")
def test_readiness_follows_redis_and_liveness_does_not(tmp_path: Path) -> None:
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    time.sleep(0.3)
    server = start_app(redis_url=f"redis://127.0.0.1:{port}/0")
    try:
        with server.client(timeout=10) as client:
            assert client.get("/readyz").json() == {"status": "ready"}
            redis.kill()
            redis.wait()
            not_ready = client.get("/readyz")
            assert not_ready.status_code == 503 and not_ready.json()["type"].endswith(":unavailable")
            assert client.get("/healthz").status_code == 200
    finally:
        server.stop()
        if redis.poll() is None:
            redis.kill()


def test_access_lines_are_written_together_soon_and_warnings_at_once() -> None:
    import asyncio
    import io
    import logging
    from datetime import UTC, datetime

    from service.observability import ACCESS, JsonFormatter, LineBatches

    stream = io.StringIO()
    handler = LineBatches()
    handler.setStream(stream)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger(ACCESS)
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler)

    def written() -> list[str]:
        return [json.loads(line)["message"] for line in stream.getvalue().splitlines()]

    async def on_a_loop() -> list[list[str]]:
        seen = []
        log.info("one")
        log.info("two")
        seen.append(written())  # still waiting: written together, a moment later
        await asyncio.sleep(LineBatches.DELAY * 4)
        seen.append(written())
        log.info("three")
        log.warning("four")  # at once, after the line waiting before it
        seen.append(written())
        for n in range(LineBatches.BATCH):
            log.info(f"many-{n}")
        seen.append(written())  # a full batch is written without waiting
        log.info("last")
        return seen

    try:
        seen = asyncio.run(on_a_loop())
        assert seen[0] == [] and seen[1] == ["one", "two"]
        assert seen[2] == ["one", "two", "three", "four"]
        assert seen[3][-1] == f"many-{LineBatches.BATCH - 1}"
        log.info("off a loop")  # at once
        assert written()[-2:] == ["last", "off a loop"]
        other = logging.getLogger("envfoundry.test-batches")
        other.propagate = False
        other.setLevel(logging.INFO)
        other.addHandler(handler)

        async def elsewhere() -> list[str]:
            log.info("access")
            other.info("not the access log")  # at once, after the access line waiting
            return written()

        assert asyncio.run(elsewhere())[-2:] == ["access", "not the access log"]
        other.removeHandler(handler)
    finally:
        log.removeHandler(handler)
        log.propagate = True
        log.setLevel(logging.NOTSET)
    stamp = json.loads(stream.getvalue().splitlines()[0])["time"]
    parsed = datetime.fromisoformat(stamp)
    assert parsed.tzinfo == UTC and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", stamp)
    assert abs(parsed.timestamp() - time.time()) < 60


def test_access_lines_are_the_same_written_directly_or_through_a_record() -> None:
    """The access log skips making a log record only while the service's own handler is the one
    listener; the line is the same either way, and any other listener still gets records."""
    import asyncio
    import io
    import logging

    from service.observability import ACCESS, Metrics, access_handler, configure_logging, request_id
    from service.server.requestlog import RequestLog

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        scope["path_params"] = {"session_id": "ses_1"}
        scope.setdefault("state", {})["tenant"] = "team-a"
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def request() -> None:
        async def receive() -> MutableMapping[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            return None

        scope = {"type": "http", "method": "POST", "path": "/x", "headers": [(b"x-request-id", b"rid-7")]}
        await RequestLog(app, Metrics())(scope, receive, send)

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    access = logging.getLogger(ACCESS)
    try:
        configure_logging("json")
        handler = root.handlers[0]
        stream = io.StringIO()
        handler.setStream(stream)  # type: ignore[attr-defined]
        assert access_handler(access) is handler
        asyncio.run(request())
        seen: list[logging.LogRecord] = []

        class Listener(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                seen.append(record)

        listener = Listener()
        access.addHandler(listener)
        assert access_handler(access) is None
        asyncio.run(request())
        handler.flush()
        direct, recorded = (json.loads(line) for line in stream.getvalue().splitlines())
        for line in (direct, recorded):
            assert line.pop("time") and line.pop("duration_ms") >= 0
        assert direct == recorded == {"level": "info", "logger": ACCESS, "message": "POST unmatched 201",
                                      "request_id": "rid-7", "route": "unmatched", "method": "POST", "status": 201,
                                      "tenant": "team-a", "session": "ses_1"}
        assert [r.getMessage() for r in seen] == ["POST unmatched 201"]
        assert request_id.get() == ""
    finally:
        access.handlers.clear()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
