"""Frames over a Unix socket between the worker's own processes, with descriptors passed alongside.

Same framing as ``protocol`` (4-byte length, JSON). Reads are exact and bounded by a deadline,
so a stuck or hostile peer costs a timeout, never a hang; descriptors travel with a one-byte
message of their own, read only when a frame announced them. Standard library only.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from sandbox.wire import protocol
from sandbox.worker import polling

FDS_MARK = b"F"


def send(sock: socket.socket, message: Any, fds: tuple[int, ...] = ()) -> None:
    sock.sendall(protocol.encode_frame(message))
    if fds:
        socket.send_fds(sock, [FDS_MARK], list(fds))


def _exact(sock: socket.socket, size: int, deadline: float, cap: int) -> bytes | None:
    if size > cap:
        return None
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        wait = deadline - time.monotonic()
        if wait <= 0:
            return None
        if not polling.ready(sock, wait):
            continue
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket, deadline: float, cap: int = protocol.MAX_FRAME_BYTES) -> dict[str, Any] | None:
    """One frame (a JSON object), or None if the peer closed, stalled past ``deadline``, or sent garbage."""
    header = _exact(sock, protocol.HEADER.size, deadline, cap)
    if header is None:
        return None
    try:
        body = _exact(sock, protocol.frame_length(header), deadline, cap)
        message = None if body is None else protocol.decode_body(body)
    except protocol.ProtocolError:
        return None
    return message if isinstance(message, dict) else None


def receive_fds(sock: socket.socket, count: int, deadline: float) -> list[int] | None:
    wait = deadline - time.monotonic()
    if wait <= 0 or not polling.ready(sock, wait):
        return None
    mark, fds, _, _ = socket.recv_fds(sock, len(FDS_MARK), count)
    if mark != FDS_MARK or len(fds) != count:
        for fd in fds:
            _close(fd)
        return None
    return list(fds)


def _close(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass
