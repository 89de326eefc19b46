"""What a service error becomes at each edge, in one place: RFC 9457 problem+json over HTTP, a
JSON-RPC error code (MCP and OpenEnv's JSON-RPC methods), and OpenEnv's WebSocket error code.

The errors themselves are ``service.errors``. Every transport sends the same problem body (REST as
the answer, JSON-RPC as ``error.data``, OpenEnv's WebSocket as ``data.problem``), so a client
branches on its ``type`` whichever way it came. This module also registers the handlers for the
framework's own errors (validation, unknown routes) and the store's.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import RETRYABLE, ServiceError, Unavailable, announced_retry, problem_type
from service.stores.store import StoreError

MEDIA_TYPE = "application/problem+json"
# Validation problems listed in one answer (the rest are counted in ``errors_omitted``).
MAX_ERRORS = 20
# JSON-RPC 2.0's codes, and the one MCP servers answer for a missing resource.
RPC_INVALID_REQUEST = -32600
RPC_METHOD_NOT_FOUND = -32601
RPC_INVALID_PARAMS = -32602
RPC_SERVER_ERROR = -32000
RPC_NOT_FOUND = -32002


def problem_body(exc: ServiceError) -> dict[str, Any]:
    """The RFC 9457 body for ``exc``: what every transport sends along with its own code."""
    return {"type": problem_type(exc.slug), "title": exc.title, "status": exc.status, "detail": exc.detail,
            **exc.extra}


def rpc_code(exc: ServiceError) -> int:
    """The JSON-RPC error code for ``exc``: not found, bad parameters, or the server-defined range."""
    if exc.status == 404:
        return RPC_NOT_FOUND
    if exc.status in (400, 413, 422):
        return RPC_INVALID_PARAMS
    return RPC_SERVER_ERROR


def openenv_code(exc: ServiceError) -> str:
    """OpenEnv's WebSocket error code for ``exc``."""
    if exc.status == 429:
        return "CAPACITY_REACHED"
    if exc.status in (400, 404, 413, 422):
        return "VALIDATION_ERROR"
    return "EXECUTION_ERROR"


def problem_response(status: int, slug: str, title: str, detail: str, instance: str | None = None,
                     retry_after: float | None = None, **extra: Any) -> JSONResponse:
    body: dict[str, Any] = {"type": problem_type(slug), "title": title, "status": status, "detail": detail}
    if instance:
        body["instance"] = instance
    body.update(extra)
    headers: dict[str, str] = {}
    if slug in RETRYABLE or retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after or 0)))
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers or None)


def error_response(exc: ServiceError, instance: str) -> JSONResponse:
    """The problem+json answer to ``exc`` (also a refused WebSocket upgrade's)."""
    extra = dict(exc.extra)
    retry = extra.pop("retry_after", None)
    return problem_response(exc.status, exc.slug, exc.title, exc.detail, instance,
                            retry if retry is not None else announced_retry(exc), **extra)


# Where a value came from: the name alone says which field (a header keeps its own name).
SOURCES = frozenset({"body", "query", "header", "path", "cookie"})


def _field(error: dict[str, Any]) -> str:
    """The dotted name of the field an error is about; 'body' when the body is not JSON at all."""
    if error.get("type") == "json_invalid":
        return "body"  # its loc is a character position, not a field
    loc = list(error.get("loc", ()))
    if loc and loc[0] in SOURCES:
        loc = loc[1:]
    # pydantic names the member of a union it tried ('dict[str,any]', 'function-after[...]'): not a field
    parts = [str(p) for p in loc if not (isinstance(p, str) and "[" in p)]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into problem+json."""

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc, request.url.path)

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError) -> JSONResponse:
        return problem_response(Unavailable.status, Unavailable.slug, Unavailable.title, str(exc), request.url.path,
                                announced_retry(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # A body can fail in millions of places; the answer names the first few, never echoes input.
        raw = exc.errors()
        errors = [{"field": _field(e)[:200], "message": str(e.get("msg", ""))[:500]}
                  for e in raw[:MAX_ERRORS]]
        first = errors[0] if errors else {"field": "body", "message": "invalid"}
        detail = f"{first['field']}: {first['message']}"
        extra: dict[str, Any] = {"errors": errors}
        if len(raw) > MAX_ERRORS:
            extra["errors_omitted"] = len(raw) - MAX_ERRORS
        return problem_response(422, "invalid-request", "Invalid request", detail, request.url.path, **extra)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # the body could not be parsed at all (e.g. nested too deeply)
            return problem_response(422, "invalid-request", "Invalid request", f"body: {exc.detail}",
                                    request.url.path, errors=[{"field": "body", "message": str(exc.detail)}])
        slug = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return problem_response(exc.status_code, slug, str(exc.detail), str(exc.detail), request.url.path)
