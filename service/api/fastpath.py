"""The tool-call route without the framework's per-request machinery.

``POST /v1/sessions/{id}/calls`` is what rollout workers send thousands of times a second, and on
it route matching, dependency resolution and response-model validation cost more CPU than the
call itself. This layer answers a well-formed call directly: it checks the key, parses and
validates the body with the route's own model, and renders the route's own response model. Any
request it does not fully accept (no or a bad key, a body the model refuses, another route) goes
on, untouched, to the framework, which answers exactly as it always does; an error the engine
raises is answered by the app's own exception handlers. So the contract has one definition, in
``service.api.rest``, and ``tests/test_fuzz.py`` and the API tests hold this layer to it.

It stands in front of the framework (``service.server.app.Service``), inside only the access log
and the body limit: the framework's own layers (error pages, telemetry, its body limit) cost a
tenth of a call's CPU and do nothing a call answered here needs. The app's exception handlers
still answer whatever the call raises, as they would behind those layers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from types import SimpleNamespace
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from service.api import calls, schemas
from service.engine import idempotency
from service.engine.sessions import Sessions

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ROUTE = SimpleNamespace(path="/v1/sessions/{session_id}/calls")  # what the access log reads of a route
CALLS = re.compile(r"/v1/sessions/([^/]+)/calls")
JSON_TYPES = (b"application/json", b"application/json; charset=utf-8")


class FastCalls:
    def __init__(self, app: ASGIApp, service: Any) -> None:
        self.app = app  # the framework, which answers every request this layer does not
        self.service = service  # the FastAPI app: its state and exception handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        matched = CALLS.fullmatch(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if matched is None:
            await self.app(scope, receive, send)
            return
        body, more = await _body(receive)
        if more is not None:  # the client went away mid-body: as the framework would see it
            await self.app(scope, more, send)
            return
        replay = _replay(body, receive)
        accepted = self._accept(scope, matched.group(1), body)
        if accepted is None:
            await self.app(scope, replay, send)
            return
        engine, call = accepted
        try:
            applied = await calls.run(engine, call)
            content = schemas.CallResult(**calls.view(applied)).model_dump_json().encode()
        except Exception as exc:
            handler = _handler(self.service, exc)
            if handler is None:
                raise
            response = await handler(Request(scope, replay), exc)
            await response(scope, replay, send)
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
        if applied.replayed:
            headers.append((idempotency.REPLAYED.lower().encode(), b"true"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def _accept(self, scope: Scope, session_id: str, body: bytes) -> tuple[Sessions, calls.CallRequest] | None:
        """What the call is, if this layer may answer it; None hands it to the framework."""
        app = scope["app"] = self.service  # (as the framework would set it, for the handlers' requests)
        headers = dict(scope["headers"])
        if headers.get(b"content-type") not in JSON_TYPES or "%" in session_id:
            return None
        key: str | None = None
        if (raw_key := headers.get(idempotency.HEADER.lower().encode())) is not None:
            key = raw_key.decode("latin-1")
            if not calls.KEY.fullmatch(key):
                return None
        authorization = headers.get(b"authorization")
        try:
            who = app.state.keys.authenticate(None if authorization is None else authorization.decode("latin-1"), "run")
            body_ = schemas.ToolCallRequest.model_validate(json.loads(body))
        except (ValidationError, ValueError, RecursionError, UnicodeDecodeError):
            return None
        except Exception:
            return None  # a refused key: the framework answers it as it answers every route
        # What the access log and the metrics read of a routed request.
        scope.setdefault("state", {})["tenant"] = who.tenant or "-"
        scope["route"], scope["path_params"] = ROUTE, {"session_id": session_id}
        return app.state.sessions, calls.CallRequest(session_id, body_.name, body_.arguments, key, who.tenant)


async def _body(receive: Receive) -> tuple[bytes, Receive | None]:
    """The whole request body; a disconnect mid-body is handed on as it came."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), _replayed(message, receive)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(body: bytes, receive: Receive) -> Receive:
    return _replayed({"type": "http.request", "body": body, "more_body": False}, receive)


def _replayed(first: Message, receive: Receive) -> Receive:
    """``receive`` as if ``first`` had not been read yet."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return first
        return await receive()

    return again


def _handler(app: Any, exc: Exception) -> Any:
    handlers = app.exception_handlers
    for kind in type(exc).__mro__:
        if kind in handlers:
            return handlers[kind]
    return None
