"""ASGI middleware that refuses request bodies over the size limits with a 413 problem.

A declared Content-Length over the limit is refused before anything is read.
Otherwise the body is read here, counting, and handed on only if it stays
under the limit; the app would buffer it whole anyway, and counting here means
a chunked body cannot slip past as a parse error.

Bytes alone do not bound the work: parsing and validating a JSON body happens
on the event loop, and a few megabytes of ``[1,1,1,...]`` are millions of
values. Counting commas (at C speed, an upper bound on the values a JSON body
holds beyond the first) refuses such bodies before they are parsed.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.problems import problem_response


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
