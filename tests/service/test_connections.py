"""Connection bounds of ``envfoundry serve`` over real sockets: what a client that never finishes
a request can hold, and that everyone else is still answered (``service/server/connections.py``)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Server, start_server

BOUNDS = {"ENVFOUNDRY_MAX_CONNECTIONS": "40", "ENVFOUNDRY_HEADER_TIMEOUT": "1", "ENVFOUNDRY_BODY_TIMEOUT": "1",
          "ENVFOUNDRY_MAX_HEADER_BYTES": "8192", "ENVFOUNDRY_KEEP_ALIVE_TIMEOUT": "1"}


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("bounded"), extra_env=BOUNDS, workers=1)
    yield server
    server.stop()


def _open(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=15)
    return sock


def _closed_by_server(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket's timeout bounds the wait)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_idle_connections_past_the_cap_make_room_and_others_are_answered(bounded: Server) -> None:
    idle = [_open(bounded) for _ in range(100)]
    try:
        with httpx.Client(base_url=bounded.url, timeout=15) as http:
            assert http.get("/healthz").status_code == 200
        # the longest waiting went first: the earliest idle sockets are closed, with nothing sent
        assert _closed_by_server(idle[0]) == b""
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(bounded: Server) -> None:
    with _open(bounded) as sock:
        assert _closed_by_server(sock) == b""


def test_an_unfinished_head_is_closed_after_the_header_timeout(bounded: Server) -> None:
    with _open(bounded) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ")
        assert _closed_by_server(sock) == b""


def test_a_head_over_the_size_limit_is_answered_431_and_closed(bounded: Server) -> None:
    with _open(bounded) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 20_000)
        answer = _closed_by_server(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ")
    problem = json.loads(body)
    assert problem["type"] == "urn:envfoundry:problem:header-too-large"
    assert problem["limit"] == "max_header_bytes" and problem["value"] == 8192


def test_a_body_that_stops_arriving_is_closed_after_the_body_timeout(bounded: Server) -> None:
    with _open(bounded) as sock:
        sock.sendall(b"POST /v1/sessions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 1000\r\n\r\n{\"env_id\":")
        assert _closed_by_server(sock) == b""
    with httpx.Client(base_url=bounded.url, timeout=15) as http:
        assert http.get("/healthz").status_code == 200


def test_a_kept_alive_connection_serves_several_requests(bounded: Server) -> None:
    with httpx.Client(base_url=bounded.url, timeout=15) as http:
        for _ in range(5):
            assert http.get("/healthz").status_code == 200


def test_documented_defaults_hold_on_a_bare_serve(tmp_path: Path) -> None:
    """The defaults (no settings): a head past 64 KiB is refused."""
    server = start_server(tmp_path, workers=1)
    try:
        with _open(server) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (70 * 1024))
            assert _closed_by_server(sock).startswith(b"HTTP/1.1 431 ")
    finally:
        server.stop()


def test_pipelined_requests_are_all_answered(bounded: Server) -> None:
    with _open(bounded) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" * 3)
        received = b""
        while received.count(b'{"status":"ok"}') < 3:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    assert received.count(b"HTTP/1.1 200 ") == 3
