"""Bounds on HTTP connections that uvicorn does not set itself, for ``envfoundry serve``.

uvicorn (with httptools) has no limit on a request head's size, no timeout on reading it or the
body, and keeps a connection that never sends a byte open forever; ``limit_concurrency``
answers 503 but still holds every socket. So a client can hold gigabytes in unfinished headers
or every file descriptor in idle sockets. ``bounded_protocol`` is uvicorn's own httptools
protocol with these added:

- a request head (request line and headers) over ``max_header_bytes`` is answered 431 and the
  connection closed;
- a head not complete ``header_timeout`` seconds after the connection opened (or after the
  previous response, for a kept-alive connection) closes the connection, as does a body not
  complete ``body_timeout`` seconds after its head;
- past ``max_connections`` open connections, a new one closes the connection that has waited
  longest for a request (idle, or still sending its head); failing that, the WebSocket that has
  waited longest for a message of the tenant holding the most (``service/api/sockets.py``); if every
  connection is busy with a request, the new one is closed. A request being answered is never cut.

A response whose head declares its length goes out in one write with the first part of its body
(uvicorn writes the head and the body apart: a syscall and a TCP segment more per call).

The idle keep-alive timeout is uvicorn's own ``timeout_keep_alive``. ``bounded_websockets`` is
uvicorn's WebSocket protocol with a close handshake the peer never completes cut after
``close_timeout`` seconds (uvicorn waits 10).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

from service.api.problems import problem_body
from service.errors import HeaderTooLarge

HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/problem+json\r\n"
                  b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


@dataclass(frozen=True)
class ConnectionBounds:
    """The bounds as configured (their defaults are ``Settings``'s)."""

    max_header_bytes: int
    header_timeout: float
    body_timeout: float
    max_connections: int


def _head_problem(limit: int) -> bytes:
    # Written on the socket before any framework sees the request: the body is the usual problem's.
    exc = HeaderTooLarge(f"the request line and headers exceed {limit} bytes", limit="max_header_bytes", value=limit)
    detail = json.dumps(problem_body(exc), separators=(",", ":")).encode()
    return HEAD_TOO_LARGE % (len(detail), detail)


class WebSockets(Protocol):
    def make_room(self) -> bool:
        """Close an idle WebSocket; False when there is none."""


def bounded_protocol(bounds: ConnectionBounds, websockets: WebSockets | None = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class with ``bounds`` (pass it as ``uvicorn.run(http=...)``);
    ``websockets`` are the app's, which it may close to make room."""

    class Bounded(_Bounded):
        pass

    Bounded.bounds = bounds
    Bounded.websockets = websockets
    Bounded.waiting = OrderedDict()  # this server's own: the connections waiting for a head, oldest first
    return Bounded


class _Bounded(HttpToolsProtocol):
    bounds: ConnectionBounds  # set by ``bounded_protocol``
    waiting: OrderedDict[_Bounded, None] = OrderedDict()
    websockets: WebSockets | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._timer: asyncio.TimerHandle | None = None

    # -- phases: waiting for a head, reading a body, answering ---------------------------------
    @property
    def _in_head(self) -> bool:
        return self in self.waiting

    def _wait_for_head(self) -> None:
        self.waiting[self] = None
        self.waiting.move_to_end(self)
        self._head_bytes = 0
        self._arm(self.bounds.header_timeout)

    def _got_head(self) -> None:
        self.waiting.pop(self, None)

    def _arm(self, seconds: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None if seconds is None else self.loop.call_later(seconds, self._expired)

    def _expired(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._wait_for_head()
        if len(self.connections) > self.bounds.max_connections:
            self._make_room()

    def _make_room(self) -> None:
        """Close the connection waiting longest for a head (in constant time: a flood of new connections
        must not cost a walk over every open one), else an idle WebSocket, or this one if every other
        is answering."""
        for oldest in self.waiting:
            if oldest is self:
                break
            oldest._got_head()
            oldest.transport.close()
            return
        if self.websockets is not None and self.websockets.make_room():
            return  # (upgraded connections are not in ``waiting``: their protocol is uvicorn's)
        self._got_head()
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm(None)
        self._got_head()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        waiting = self._in_head
        super().data_received(data)
        if waiting and self._in_head:  # still in the head after this chunk
            self._head_bytes += len(data)
            if self._head_bytes > self.bounds.max_header_bytes and not self.transport.is_closing():
                self.transport.write(_head_problem(self.bounds.max_header_bytes))
                self.transport.close()

    def on_headers_complete(self) -> None:
        self._got_head()
        self._arm(self.bounds.body_timeout)
        before = self.cycle
        super().on_headers_complete()
        # Only a cycle made for this request (an upgrade makes none: the previous one may be
        # mid-answer), and not a HEAD's (its response is its head alone: nothing would send it on).
        if self.cycle is not before and self.cycle is not None and self.scope.get("method") != "HEAD":
            self.cycle.transport = _OneWrite(self.transport)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        self._arm(None)
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        answering = self.cycle is not None and not self.cycle.response_complete  # a pipelined request
        if not self.transport.is_closing() and not answering:
            # uvicorn's keep-alive timer closes an idle connection; ours bounds a slow next head
            self._wait_for_head()

    def handle_websocket_upgrade(self) -> None:
        self._arm(None)  # the connection is the WebSocket protocol's from here on
        self._got_head()
        if self.cycle is not None and isinstance(self.cycle.transport, _OneWrite):
            self.cycle.transport.flush()  # (a response under way goes out as far as uvicorn's own would)
        super().handle_websocket_upgrade()


class _OneWrite:
    """A response's transport that holds its head, when it declares a length, until the body's
    first write (which uvicorn makes even of an empty body) or the connection's close (an app that
    failed after its head), and writes them together. Only the response's first write is its head
    (an informational ``100 Continue`` before it passes through): nothing written after it is
    ever held, whatever its bytes."""

    __slots__ = ("transport", "head", "fresh")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.head: bytes | None = None
        self.fresh = True  # the head is not written yet

    def write(self, data: bytes) -> None:
        if self.head is not None:
            data, self.head = b"".join((self.head, data)), None
        elif self.fresh and not data.startswith(b"HTTP/1.1 1"):
            self.fresh = False
            if b"\r\ncontent-length: " in data:
                self.head = bytes(data)
                return
        self.transport.write(data)

    def flush(self) -> None:
        head, self.head = self.head, None
        if head is not None:
            self.transport.write(head)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def bounded_websockets(close_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's WebSocket protocol class (pass it as ``uvicorn.run(ws=...)``) that closes the
    connection ``close_timeout`` seconds after sending a close frame the peer has not answered."""
    if AutoWebSocketsProtocol is None:
        raise RuntimeError("no WebSocket library is installed (uvicorn[standard] brings websockets)")
    base: Any = AutoWebSocketsProtocol

    class BoundedWebSocket(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.close_timeout = close_timeout  # (uvicorn's WebSocket protocols set 10 s here)

    return BoundedWebSocket
