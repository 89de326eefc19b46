"""Bounds on OpenEnv WebSockets over real sockets (``service/api/sockets.py``): a refused upgrade is
answered before it is accepted and let go at once, one tenant cannot hold more than its share of
sockets, idle ones are closed, and other tenants are still answered."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from service.api.auth import new_key
from tests.conftest import Server, start_server
from tests.service.test_observability import sample

ENV = "library_circulation"
PATH = f"/openenv/{ENV}/ws"


class Keyed:
    def __init__(self, server: Server, keys: dict[str, str]) -> None:
        self.server = server
        self.keys = keys  # tenant -> key ("admin-only": a key without the run scope; "forged": no key at all)

    def url(self) -> str:
        return self.server.url.replace("http://", "ws://") + PATH

    def connect(self, tenant: str | None) -> ClientConnection:
        headers = {"Authorization": f"Bearer {self.keys[tenant]}"} if tenant else {}
        return connect(self.url(), additional_headers=headers, open_timeout=15, close_timeout=2)

    def refusal(self, tenant: str | None) -> Any:
        """The problem an upgrade was refused with."""
        with pytest.raises(InvalidStatus) as refused, self.connect(tenant):
            pass
        response = refused.value.response
        assert response.headers["content-type"] == "application/problem+json"
        return response.status_code, json.loads(response.body or b"{}")


def keyed_server(tmp: Any, env: dict[str, str]) -> Keyed:
    keys, lines = {}, []
    for tenant, scopes in (("tenant-a", ["run"]), ("tenant-b", ["run"]), ("admin-only", ["admin"])):
        keys[tenant], line = new_key(tenant, scopes)
        lines.append(line)
    keys["forged"] = new_key("tenant-a", ["run"])[0]  # (its line is in no key file)
    (tmp / "keys").write_text("\n".join(lines) + "\n")
    server = start_server(tmp, extra_env={**env, "ENVFOUNDRY_API_KEYS_FILE": str(tmp / "keys")}, workers=1)
    return Keyed(server, keys)


def open_sockets(server: Server) -> float:
    return sample(httpx.get(f"{server.url}/metrics").text, "envfoundry_websockets_open")


def until_released(server: Server) -> None:
    """Wait (within a generous deadline) until the server holds no WebSocket."""
    deadline = time.monotonic() + 15
    while open_sockets(server) != 0:
        assert time.monotonic() < deadline, "the server still holds WebSockets"
        time.sleep(0.05)


def idle(held: ExitStack, keyed: Keyed, tenant: str) -> ClientConnection:
    """A WebSocket, held open by ``held``, that has been answered once and now waits (so idle ones
    wait in the order made)."""
    ws = held.enter_context(keyed.connect(tenant))
    assert exchange(ws, {"type": "state"})["data"]["code"] == "VALIDATION_ERROR"  # (no episode yet)
    return ws


def exchange(ws: ClientConnection, message: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps(message))
    answer: dict[str, Any] = json.loads(ws.recv(timeout=60))
    return answer


def closed_by_server(ws: ClientConnection) -> Any:
    """The close frame the server sent (the receive's timeout bounds the wait)."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=15)
    return closed.value.rcvd


def plays(keyed: Keyed, tenant: str) -> None:
    """The tenant's REST request and its own WebSocket episode are answered."""
    headers = {"Authorization": f"Bearer {keyed.keys[tenant]}"}
    assert httpx.get(f"{keyed.server.url}/openenv/{ENV}/health", headers=headers, timeout=15).json() == \
        {"status": "healthy"}
    with keyed.connect(tenant) as ws:
        opened = exchange(ws, {"type": "reset", "data": {"scenario_id": "lib-001"}})
        assert opened["type"] == "observation"
        ws.send(json.dumps({"type": "close"}))
        assert closed_by_server(ws).code == 1000


# 64 connections, of which 12 WebSockets, 8 of one tenant
CAPS = {"ENVFOUNDRY_MAX_CONNECTIONS": "64", "ENVFOUNDRY_MAX_WEBSOCKETS": "12",
        "ENVFOUNDRY_MAX_WEBSOCKETS_PER_TENANT": "8"}


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    keyed = keyed_server(tmp_path_factory.mktemp("capped"), CAPS)
    yield keyed
    keyed.server.stop()


def _refused_upgrade(server: Server) -> bytes:
    """A keyless upgrade over a raw socket: everything the server sends until it closes the connection."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(f"GET {PATH} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        received = b""
        while chunk := sock.recv(65536):  # (a server that kept the socket would time this out)
            received += chunk
    return received


def test_an_upgrade_without_a_fitting_key_is_refused_before_it_is_accepted(capped: Keyed) -> None:
    status, problem = capped.refusal(None)
    assert status == 401 and problem["type"] == "urn:envfoundry:problem:unauthorized"
    assert capped.refusal("forged")[0] == 401
    status, problem = capped.refusal("admin-only")  # a key without the run scope
    assert status == 403 and problem["scope"] == "run"
    # More refused upgrades than the server has connections: each is answered and closed at once,
    # so none holds a connection and another tenant is still answered.
    for _ in range(100):
        answer = _refused_upgrade(capped.server)
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    assert open_sockets(capped.server) == 0
    plays(capped, "tenant-b")
    assert 'route="/openenv/{env_id}/ws connect",status="401"' in httpx.get(f"{capped.server.url}/metrics").text


def test_one_tenant_past_its_websocket_cap_is_refused_while_another_is_answered(capped: Keyed) -> None:
    until_released(capped.server)
    with ExitStack() as held:
        for _ in range(8):
            held.enter_context(capped.connect("tenant-a"))
        for _ in range(100):  # more than the server's connections, as fast as refusals come
            status, problem = capped.refusal("tenant-a")
            assert status == 429, problem
        assert problem["quota"] == "max_websockets_per_tenant" and problem["value"] == 8
        plays(capped, "tenant-b")
        assert open_sockets(capped.server) == 8


def test_at_the_server_cap_a_tenant_holding_fewer_takes_an_idle_socket_of_the_one_holding_most(
        capped: Keyed) -> None:
    until_released(capped.server)
    with ExitStack() as held:
        a = [idle(held, capped, "tenant-a") for _ in range(8)]
        b = [idle(held, capped, "tenant-b") for _ in range(4)]  # the server's 12
        # b's 5th and 6th take a's longest-idle sockets (8 to 6, 4 to 6); then they hold as many
        b += [idle(held, capped, "tenant-b") for _ in range(2)]
        assert [closed_by_server(ws).code for ws in a[:2]] == [1013, 1013]
        status, problem = capped.refusal("tenant-b")
        assert status == 503 and problem["limit"] == "max_websockets" and problem["value"] == 12
        for ws in a[2:] + b:  # the others are still open and answer
            assert exchange(ws, {"type": "state"})["data"]["code"] == "VALIDATION_ERROR"  # (no episode yet)


@pytest.fixture(scope="module")
def idling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    keyed = keyed_server(tmp_path_factory.mktemp("idle"), {"ENVFOUNDRY_WEBSOCKET_IDLE": "1",
                                                           "ENVFOUNDRY_WEBSOCKET_CLOSE_TIMEOUT": "1"})
    yield keyed
    keyed.server.stop()


def test_an_idle_websocket_is_closed_and_its_episode_stays(idling: Keyed) -> None:
    with idling.connect("tenant-a") as ws:
        episode = exchange(ws, {"type": "reset", "data": {}})["data"]["observation"]["episode_id"]
        close = closed_by_server(ws)
    assert close.code == 1001 and "no message for 1 s" in close.reason
    until_released(idling.server)
    headers = {"Authorization": f"Bearer {idling.keys['tenant-a']}"}
    assert httpx.get(f"{idling.server.url}/v1/sessions/{episode}", headers=headers).status_code == 200


def test_a_peer_that_never_answers_the_close_frame_is_dropped(idling: Keyed) -> None:
    """uvicorn waits 10 s for the answer by itself; here the close timeout is 1 s."""
    host, port = idling.server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=8) as sock:
        sock.sendall(f"GET {PATH} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                     f"Authorization: Bearer {idling.keys['tenant-a']}\r\n\r\n".encode())
        received = b""
        while chunk := sock.recv(65536):  # never answering: the server must end the connection itself
            received += chunk
    assert received.startswith(b"HTTP/1.1 101 ")
    assert b"\x88" in received and (1001).to_bytes(2, "big") + b"no message" in received  # the close frame


def test_without_keys_the_websocket_cap_is_per_client_address(tmp_path: Path) -> None:
    server = start_server(tmp_path, extra_env={"ENVFOUNDRY_MAX_WEBSOCKETS_PER_TENANT": "2"}, workers=1)
    anonymous = Keyed(server, {})
    try:
        with anonymous.connect(None), anonymous.connect(None):
            status, problem = anonymous.refusal(None)
            assert status == 429 and problem["quota"] == "max_websockets_per_tenant" and problem["value"] == 2
            # another client address (loopback has them all) still gets its own
            host, port = server.url.removeprefix("http://").split(":")
            other = socket.socket()
            other.bind(("127.0.0.2", 0))
            other.connect((host, int(port)))
            with connect(anonymous.url(), sock=other, open_timeout=15) as ws:
                assert exchange(ws, {"type": "state"})["type"] == "error"  # (no episode yet)
    finally:
        server.stop()


def test_out_of_connections_the_server_closes_an_idle_websocket_of_the_tenant_holding_most(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """WebSockets may take every connection here (their cap is the connection cap), so only closing
    one of them can answer another client."""
    env = {"ENVFOUNDRY_MAX_CONNECTIONS": "16", "ENVFOUNDRY_MAX_WEBSOCKETS": "16",
           "ENVFOUNDRY_MAX_WEBSOCKETS_PER_TENANT": "16"}
    keyed = keyed_server(tmp_path_factory.mktemp("room"), env)
    try:
        with ExitStack() as held:
            a = [idle(held, keyed, "tenant-a") for _ in range(15)]
            b = idle(held, keyed, "tenant-b")
            assert httpx.get(f"{keyed.server.url}/healthz", timeout=15).status_code == 200
            assert closed_by_server(a[0]).code == 1013  # a's longest idle
            assert exchange(b, {"type": "state"})["type"] == "error"  # b's one socket stays
    finally:
        keyed.server.stop()
