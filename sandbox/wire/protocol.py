"""Framing between the service and a sandbox worker: a 4-byte big-endian length, then UTF-8 JSON.

Standard library only: the worker imports this module.
"""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

HEADER = struct.Struct(">I")
# A body that starts with BLOB carries a state's bytes after its JSON (see ``encode_body``).
BLOB = b"\x00"
BLOB_HEAD = struct.Struct(">Q")
BLOB_FIELD = "$bytes"
BLOB_MIN = 4096
# A field whose value is bytes, carried after the JSON as they are (one per frame).
RAW_FIELD = "answer"
# The byte that carries descriptors a worker hands the service (see ``sandbox.lane``).
LEND_MARK = b"L"
# Frames carry whole states; the service enforces its own, smaller state limit.
MAX_FRAME_BYTES = 256 * 1024 * 1024
# How deeply a value from environment code (a result, a state) may nest. Well under what the
# service's own recursion (decoding, viewing, encoding responses) can take on top of its stack.
MAX_DEPTH = 400


# ``json.dumps`` with other than its default options makes an encoder for every call: these are made once.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":")).encode
unicode_json = json.JSONEncoder(ensure_ascii=False).encode  # ``json.dumps(value, ensure_ascii=False)``


class ProtocolError(Exception):
    """The peer sent something that is not a frame, or closed mid-frame."""


def encode_body(message: Any, *, ascii_fallback: bool = True) -> bytes:
    """A message as a frame body: its JSON, or, when it carries a large ``state`` (JSON text
    itself), ``BLOB``, the length of the JSON of the rest, that JSON, then the state's own bytes.
    A state sent as a JSON string would be escaped on one side and unescaped on the other (every
    quote in it), twice per call; as bytes it is copied. Raises UnicodeEncodeError for text UTF-8
    cannot carry (lone surrogates) unless ``ascii_fallback`` (JSON escapes carry them)."""
    raw = message.get(RAW_FIELD) if isinstance(message, dict) else None
    if isinstance(raw, bytes):  # carried as it is, never as JSON
        head = _json({**message, RAW_FIELD: None, BLOB_FIELD: RAW_FIELD}, ascii_fallback)
        return BLOB + BLOB_HEAD.pack(len(head)) + head + raw
    state = message.get("state") if isinstance(message, dict) else None
    if isinstance(state, str) and len(state) >= BLOB_MIN:
        try:
            blob = state.encode("utf-8")
        except UnicodeEncodeError:
            pass
        else:
            head = _json({**message, "state": None, BLOB_FIELD: "state"}, ascii_fallback)
            return BLOB + BLOB_HEAD.pack(len(head)) + head + blob
    return _json(message, ascii_fallback)


def _json(message: Any, ascii_fallback: bool) -> bytes:
    try:
        return _COMPACT(message).encode("utf-8")
    except UnicodeEncodeError:
        if not ascii_fallback:
            raise
        return _COMPACT_ASCII(message).encode("ascii")


def encode_frame(message: Any) -> bytes:
    body = encode_body(message)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes, depth: int | None = None) -> Any:
    """Inverse of ``encode_body``; with ``depth``, refuse JSON nested deeper (untrusted senders)."""
    blob = None
    if body[:1] == BLOB:
        if len(body) < 1 + BLOB_HEAD.size:
            raise ProtocolError("frame ends inside its header")
        (size,) = BLOB_HEAD.unpack_from(body, 1)
        start = 1 + BLOB_HEAD.size
        if start + size > len(body):
            raise ProtocolError("frame ends inside its JSON")
        body, blob = body[start:start + size], body[start + size:]
    try:
        message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from exc
    except RecursionError:
        raise ProtocolError("frame nests too deeply") from None
    if depth is not None and not depth_within(message, depth):
        raise ProtocolError("frame nests too deeply")
    if blob is not None:
        named = message.pop(BLOB_FIELD, None) if isinstance(message, dict) else None
        if named == RAW_FIELD:
            message[RAW_FIELD] = blob
            return message
        if named != "state":
            raise ProtocolError("frame carries bytes it does not name")
        try:
            message["state"] = blob.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"state bytes are not UTF-8: {exc}") from exc
    return message


def depth_within(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether decoded JSON nests no deeper than ``limit`` (level by level: deep input cannot
    recurse, and a call's answer is walked on the event loop, so each level is one tight loop)."""
    containers = (dict, list)
    level = [value] if isinstance(value, containers) else []
    depth = 0
    while level:
        if depth >= limit:
            return False
        below = []
        for item in level:
            for child in item.values() if isinstance(item, dict) else item:
                if isinstance(child, containers):
                    below.append(child)
        level = below
        depth += 1
    return True


def decode_bounded(body: bytes, limit: int = MAX_DEPTH) -> Any:
    """A frame body from an untrusted process, or None if it is not one or nests deeper than ``limit``."""
    try:
        return decode_body(body, limit)
    except ProtocolError:
        return None


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
