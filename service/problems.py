"""Service errors and their one translation into RFC 9457 problem+json.

    ServiceError            500 internal
    ├── NotFound            404 not-found            (env, scenario, session)
    ├── InvalidRequest      422 invalid-request      (a field fails validation)
    ├── InvalidEnvironment  422 invalid-environment  (code fails in the sandbox)
    ├── Conflict            409 conflict             (id taken, concurrent change)
    ├── PayloadTooLarge     413 payload-too-large
    ├── SessionBusy         409 session-busy         (previous call still running)
    └── Unavailable         503 unavailable          (sandbox or store down)

``type`` is a stable URN per class; clients branch on it, not on ``detail``. A store error that
reaches the edge untranslated is a 503 too, never a 500: an outage is not a bug.

409 and 503 answers carry ``Retry-After``: the seconds the failing part announced (an
unreachable Redis says when it will be tried again) or, without such a figure, one second.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.store import StoreError

MEDIA_TYPE = "application/problem+json"


def problem_type(slug: str) -> str:
    return f"urn:envfoundry:problem:{slug}"


class ServiceError(Exception):
    status = 500
    slug = "internal"
    title = "Internal error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class NotFound(ServiceError):
    status = 404
    slug = "not-found"
    title = "Not found"


class InvalidRequest(ServiceError):
    status = 422
    slug = "invalid-request"
    title = "Invalid request"


class InvalidEnvironment(ServiceError):
    status = 422
    slug = "invalid-environment"
    title = "Environment code failed validation"


class Conflict(ServiceError):
    status = 409
    slug = "conflict"
    title = "Conflict"


class PayloadTooLarge(ServiceError):
    status = 413
    slug = "payload-too-large"
    title = "Payload too large"


class SessionBusy(ServiceError):
    status = 409
    slug = "session-busy"
    title = "Session busy"


class Unavailable(ServiceError):
    status = 503
    slug = "unavailable"
    title = "Service unavailable"


def problem_response(status: int, slug: str, title: str, detail: str, instance: str | None = None,
                     retry_after: float | None = None, **extra: Any) -> JSONResponse:
    body: dict[str, Any] = {"type": problem_type(slug), "title": title, "status": status, "detail": detail}
    if instance:
        body["instance"] = instance
    body.update(extra)
    headers = None
    if status in (409, 503) and slug != "conflict":
        headers = {"Retry-After": str(max(1, math.ceil(retry_after or 0)))}
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def announced_retry(exc: BaseException | None) -> float | None:
    """The ``retry_after`` an error or one of its causes carries (e.g. the store's reconnect delay)."""
    seen = 0
    while exc is not None and seen < 8:
        value = getattr(exc, "retry_after", None)
        if isinstance(value, int | float):
            return float(value)
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into problem+json."""

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return problem_response(exc.status, exc.slug, exc.title, exc.detail, request.url.path,
                                announced_retry(exc), **exc.extra)

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError) -> JSONResponse:
        return problem_response(Unavailable.status, Unavailable.slug, Unavailable.title, str(exc), request.url.path,
                                announced_retry(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"field": _field(e.get("loc", ())), "message": e.get("msg", "")} for e in exc.errors()]
        first = errors[0] if errors else {"field": "body", "message": "invalid"}
        detail = f"{first['field']}: {first['message']}"
        return problem_response(422, "invalid-request", "Invalid request", detail, request.url.path, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # the body could not be parsed at all (e.g. nested too deeply)
            return problem_response(422, "invalid-request", "Invalid request", f"body: {exc.detail}",
                                    request.url.path, errors=[{"field": "body", "message": str(exc.detail)}])
        slug = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return problem_response(exc.status_code, slug, str(exc.detail), str(exc.detail), request.url.path)
