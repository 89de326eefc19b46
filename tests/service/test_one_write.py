"""A response goes out in as few writes as it can, and still as HTTP says: the served protocol
(``service/server/connections.py``) over a real socket, with every write it makes recorded."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from service.server.connections import ConnectionBounds, bounded_protocol, bounded_websockets

BOUNDS = ConnectionBounds(max_header_bytes=8192, header_timeout=5, body_timeout=5, max_connections=100)


class _Recorded:
    """A transport that records what is written to it, and writes it."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self.transport = transport
        self.writes = writes

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.close"})
        return
    if scope["path"] == "/slow":  # a head, then the body only once released
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await scope["state"]["release"].wait()
        await send({"type": "http.response.body", "body": b"slow", "more_body": False})
        return
    if scope["path"] == "/raw":  # a body in two parts, the second looking like a response's head
        parts = [b"first:", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
        length = str(sum(map(len, parts))).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", length)]})
        await send({"type": "http.response.body", "body": parts[0], "more_body": True})
        await send({"type": "http.response.body", "body": parts[1], "more_body": False})
        return
    if scope["path"] == "/stream":  # a streamed response: its head must not wait for the body
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await scope["state"]["release"].wait()
        await send({"type": "http.response.body", "body": b"late", "more_body": False})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = b"echo:" + body
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer, "more_body": False})


async def _serve(writes: list[bytes], release: asyncio.Event) -> tuple[asyncio.Server, int]:
    base = bounded_protocol(BOUNDS)

    class Recording(base):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(_Recorded(transport, writes))  # type: ignore[arg-type]

    config = uvicorn.Config(_app, http=Recording, ws=bounded_websockets(1), lifespan="off", log_level="critical")
    config.load()
    state = ServerState()
    server = await asyncio.get_running_loop().create_server(
        lambda: Recording(config=config, server_state=state, app_state={"release": release}), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _read_until(reader: asyncio.StreamReader, marker: bytes) -> bytes:
    return await asyncio.wait_for(reader.readuntil(marker), 5)


def _run(scenario: Any) -> Any:
    async def main() -> Any:
        writes: list[bytes] = []
        release = asyncio.Event()
        server, port = await _serve(writes, release)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                return await scenario(reader, writer, writes, release)
            finally:
                writer.close()
        finally:
            server.close()
    return asyncio.run(main())


def test_a_response_of_known_length_goes_out_in_one_write() -> None:
    async def scenario(reader: Any, writer: Any, writes: list[bytes], _: Any) -> None:
        for body in (b"hi", b""):
            writes.clear()
            writer.write(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            head = await _read_until(reader, b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: %d\r\n" % (5 + len(body)) in head
            assert await asyncio.wait_for(reader.readexactly(5 + len(body)), 5) == b"echo:" + body
            assert len(writes) == 1 and writes[0].endswith(b"\r\n\r\necho:" + body)
    _run(scenario)


def test_a_head_request_is_answered_with_its_head_alone() -> None:
    async def scenario(reader: Any, writer: Any, writes: list[bytes], _: Any) -> None:
        writer.write(b"HEAD /x HTTP/1.1\r\nhost: t\r\n\r\n")
        head = await _read_until(reader, b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 5\r\n" in head
        writer.write(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 1\r\n\r\nz")  # the connection goes on
        assert (await _read_until(reader, b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
        assert await asyncio.wait_for(reader.readexactly(6), 5) == b"echo:z"
    _run(scenario)


def test_pipelined_requests_each_get_their_whole_response_head_requests_among_them() -> None:
    async def scenario(reader: Any, writer: Any, writes: list[bytes], _: Any) -> None:
        writer.write(b"HEAD /x HTTP/1.1\r\nhost: t\r\n\r\n"
                     b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 1\r\n\r\na"
                     b"HEAD /x HTTP/1.1\r\nhost: t\r\n\r\n"
                     b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\nbc")
        for body in (None, b"echo:a", None, b"echo:bc"):
            head = await _read_until(reader, b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            if body is not None:
                assert await asyncio.wait_for(reader.readexactly(len(body)), 5) == body
    _run(scenario)


def test_a_body_that_looks_like_a_response_head_is_written_as_it_comes() -> None:
    async def scenario(reader: Any, writer: Any, writes: list[bytes], _: Any) -> None:
        for _ in range(2):  # (and the connection goes on)
            writer.write(b"GET /raw HTTP/1.1\r\nhost: t\r\n\r\n")
            head = await _read_until(reader, b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 46\r\n" in head
            body = await asyncio.wait_for(reader.readexactly(46), 5)
            assert body == b"first:HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    _run(scenario)


def test_an_upgrade_sent_while_a_response_is_under_way_gets_that_response_s_head_out_first() -> None:
    """uvicorn hands the connection to the WebSocket protocol at once: what the response under way
    wrote so far (its head) must be on the wire before what that protocol answers."""
    async def scenario(reader: Any, writer: Any, writes: list[bytes], release: asyncio.Event) -> None:
        writer.write(b"GET /slow HTTP/1.1\r\nhost: t\r\n\r\n")
        await asyncio.sleep(0.1)  # (the head is held while the body waits)
        writer.write(b"GET /ws HTTP/1.1\r\nhost: t\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
                     b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n")
        head = await _read_until(reader, b"\r\n\r\n")
        release.set()
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 4\r\n" in head
    _run(scenario)


def test_a_streamed_response_sends_its_head_before_its_body_exists() -> None:
    async def scenario(reader: Any, writer: Any, writes: list[bytes], release: asyncio.Event) -> None:
        writer.write(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
        head = await _read_until(reader, b"\r\n\r\n")  # (the body is not made until ``release``)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head
        release.set()
        assert await _read_until(reader, b"0\r\n\r\n") == b"4\r\nlate\r\n0\r\n\r\n"
    _run(scenario)


def test_a_client_expecting_100_continue_is_told_to_go_on_before_it_sends_the_body() -> None:
    async def scenario(reader: Any, writer: Any, writes: list[bytes], _: Any) -> None:
        writer.write(b"POST /x HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\n")
        assert await _read_until(reader, b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"abc")
        assert (await _read_until(reader, b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
        assert await asyncio.wait_for(reader.readexactly(8), 5) == b"echo:abc"
    _run(scenario)


def test_an_app_that_fails_after_its_head_still_gets_its_head_out_before_the_close() -> None:
    async def failing(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        raise RuntimeError("broken after the head")

    async def main() -> bytes:
        base = bounded_protocol(BOUNDS)
        config = uvicorn.Config(failing, http=base, lifespan="off", log_level="critical")
        config.load()
        state = ServerState()
        server = await asyncio.get_running_loop().create_server(
            lambda: base(config=config, server_state=state, app_state={}), "127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
            writer.write(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
            received = await asyncio.wait_for(reader.read(), 5)  # until the server closes
            writer.close()
            return received
        finally:
            server.close()

    # The head was sent by the app, so it reaches the client (as uvicorn alone would send it) before the close.
    assert asyncio.run(main()).startswith(b"HTTP/1.1 200 OK\r\n")
