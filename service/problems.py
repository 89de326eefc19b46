"""Service errors and their one translation into RFC 9457 problem+json.

    ServiceError            500 internal
    ├── NotFound            404 not-found            (env, scenario, session)
    ├── InvalidRequest      422 invalid-request      (a field fails validation)
    ├── InvalidEnvironment  422 invalid-environment  (code fails in the sandbox)
    ├── Conflict            409 conflict             (id taken, concurrent change)
    ├── PayloadTooLarge     413 payload-too-large
    ├── SessionBusy         409 session-busy         (previous call still running)
    ├── IdempotencyKeyReused 422 idempotency-key-reused (same key, different request)
    ├── NotConversation     409 not-conversation     (messages to a task-mode session)
    ├── ConversationEnded   409 conversation-ended   (the simulated user already stopped)
    ├── UserLLMFailed       502 user-llm-failed      (the simulated user's endpoint failed)
    ├── Unavailable         503 unavailable          (sandbox or store down)
    ├── UserLLMUnavailable  503 user-llm-unavailable (no simulated user configured)
    ├── Unauthorized        401 unauthorized         (no API key, or an unknown one)
    ├── Forbidden           403 forbidden            (the key lacks the scope)
    ├── LimitExceeded       422 limit-exceeded       (a named bound: array length, depth, size...)
    └── QuotaExceeded       429 quota-exceeded       (a tenant's quota; Retry-After says when to retry)

``type`` is a stable URN per class; clients branch on it, not on ``detail``. A store error that
reaches the edge untranslated is a 503 too, never a 500: an outage is not a bug.

Retryable problems (session busy, unavailable, a failed simulated user) and quotas carry
``Retry-After``: the seconds the failing part announced (an unreachable Redis says when it will be
tried again, a quota when it frees up) or, without such a figure, one second.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.stores.store import StoreError

MEDIA_TYPE = "application/problem+json"
# Validation problems listed in one answer (the rest are counted in ``errors_omitted``).
MAX_ERRORS = 20
# Problems a client may retry as they are (the same request can succeed later).
RETRYABLE = frozenset({"session-busy", "unavailable", "user-llm-failed"})


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


class IdempotencyKeyReused(ServiceError):
    status = 422
    slug = "idempotency-key-reused"
    title = "Idempotency key reused"


class NotConversation(ServiceError):
    status = 409
    slug = "not-conversation"
    title = "Not a conversation"


class ConversationEnded(ServiceError):
    status = 409
    slug = "conversation-ended"
    title = "Conversation ended"


class NotTurnBased(ServiceError):
    status = 409
    slug = "not-turn-based"
    title = "Not turn-based"


class TurnsEnded(ServiceError):
    status = 409
    slug = "turns-ended"
    title = "Every turn has ended"


class UserLLMFailed(ServiceError):
    status = 502
    slug = "user-llm-failed"
    title = "Simulated user failed"


class Unauthorized(ServiceError):
    status = 401
    slug = "unauthorized"
    title = "Unauthorized"


class Forbidden(ServiceError):
    status = 403
    slug = "forbidden"
    title = "Forbidden"


class LimitExceeded(ServiceError):
    """A request over a named bound; ``extra`` carries ``limit`` (its name) and ``value``."""

    status = 422
    slug = "limit-exceeded"
    title = "Limit exceeded"


class QuotaExceeded(ServiceError):
    """``extra`` carries ``quota`` (its name), ``value`` and ``retry_after`` (seconds)."""

    status = 429
    slug = "quota-exceeded"
    title = "Quota exceeded"


class UserLLMUnavailable(ServiceError):
    status = 503
    slug = "user-llm-unavailable"
    title = "No simulated user"


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
