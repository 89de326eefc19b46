"""ASGI middleware that refuses request bodies over the size limits with a 413 problem.

A declared Content-Length over the limit is refused before anything is read.
Otherwise the body is read here, counting, and handed on only if it stays
under the limit; the app would buffer it whole anyway, and counting here means
a chunked body cannot slip past as a parse error.

Bytes alone do not bound the work: parsing and validating a JSON body happens
on the event loop, and a few megabytes of ``[1,1,1,...]`` are millions of
values. Counting commas (at C speed, an upper bound on the values a JSON body
holds beyond the first) refuses such bodies before they are parsed.

``NaN``, ``Infinity`` and ``-Infinity`` are not JSON, but Python's parser takes them and a
state or a config would then hold a value no client can read back (it is stored as ``null``).
A JSON body that holds one is refused with a 422 naming the field; only a body whose bytes
hold one of these words is parsed here to find it.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.problems import problem_response


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, max_values: int = 200_000) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_values = max_values

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        buffered: list[Message] = []
        seen = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        if sum(m.get("body", b"").count(b",") for m in buffered) >= self.max_values:
            response = problem_response(
                413, "payload-too-large", "Payload too large",
                f"request body holds more than {self.max_values} JSON values", scope.get("path"),
                limit="max_body_values", value=self.max_values,
            )
            await response(scope, receive, send)
            return

        content_type = dict(scope["headers"]).get(b"content-type", b"")
        if b"json" in content_type and (found := non_finite(b"".join(m.get("body", b"") for m in buffered))):
            where, word = found
            response = problem_response(
                422, "invalid-request", "Invalid request", f"{where}: {word} is not a JSON number",
                scope.get("path"), errors=[{"field": where, "message": f"{word} is not a JSON number (JSON has no "
                                                                       "NaN or Infinity)"}],
            )
            await response(scope, receive, send)
            return

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(
            413, "payload-too-large", "Payload too large",
            f"request body exceeds the {self.max_bytes} byte limit", scope.get("path"), limit="max_body_bytes",
            value=self.max_bytes,
        )
        await response(scope, receive, send)


class _Found(Exception):
    pass


def _refuse(word: str) -> None:
    raise _Found(word)


class _NonFinite:
    def __init__(self, word: str) -> None:
        self.word = word


def non_finite(body: bytes) -> tuple[str, str] | None:
    """The dotted field and the word of the first NaN or Infinity a JSON body holds, or None."""
    if b"NaN" not in body and b"Infinity" not in body:
        return None  # (the common case: a search at C speed)
    try:
        json.loads(body, parse_constant=_refuse)  # the words may be inside strings: walk only if one is a number
        return None
    except _Found:
        value = json.loads(body, parse_constant=_NonFinite)
    except (ValueError, RecursionError):
        return None  # not JSON: the route's own parser names that
    todo: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while todo:
        item, path = todo.pop()
        if isinstance(item, _NonFinite):
            return ".".join(path) or "body", item.word
        if isinstance(item, dict):
            todo.extend((v, (*path, str(k))) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            todo.extend((v, (*path, str(i))) for i, v in reversed(list(enumerate(item))))
    return None
