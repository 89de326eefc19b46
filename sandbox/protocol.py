"""Framing between the service and a sandbox worker: a 4-byte big-endian length, then UTF-8 JSON.

Standard library only: the worker imports this module.
"""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

HEADER = struct.Struct(">I")
# Frames carry whole states; the service enforces its own, smaller state limit.
MAX_FRAME_BYTES = 256 * 1024 * 1024
# How deeply a value from environment code (a result, a state) may nest. Well under what the
# service's own recursion (decoding, viewing, encoding responses) can take on top of its stack.
MAX_DEPTH = 400


class ProtocolError(Exception):
    """The peer sent something that is not a frame, or closed mid-frame."""


def encode_frame(message: Any) -> bytes:
    try:
        body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: JSON escapes carry them, UTF-8 cannot
        body = json.dumps(message, separators=(",", ":")).encode("ascii")
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from exc
    except RecursionError:
        raise ProtocolError("frame nests too deeply") from None


def depth_within(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether decoded JSON nests no deeper than ``limit`` (iterative: deep input cannot recurse)."""
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= limit:
            return False
        todo.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True


def decode_bounded(text: bytes | str, limit: int = MAX_DEPTH) -> Any:
    """JSON from an untrusted process, or None if it is not JSON or nests deeper than ``limit``."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if depth_within(value, limit) else None


def frame_length(header: bytes) -> int:
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    return int(length)


def read_exact(stream: BinaryIO, size: int) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            raise ProtocolError("peer closed the stream mid-frame" if chunks or size != HEADER.size else "eof")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(stream: BinaryIO) -> Any:
    """Read one frame from a blocking stream. Raises ProtocolError('eof') on a clean close."""
    header = read_exact(stream, HEADER.size)
    return decode_body(read_exact(stream, frame_length(header)))


def write_frame(stream: BinaryIO, message: Any) -> None:
    stream.write(encode_frame(message))
    stream.flush()
