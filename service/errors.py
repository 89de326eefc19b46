"""The service's errors, at the bottom of every layer: what each means and the problem it becomes.

    ServiceError            500 internal
    ├── NotFound            404 not-found            (env, scenario, session)
    ├── InvalidRequest      422 invalid-request      (a field fails validation)
    ├── InvalidEnvironment  422 invalid-environment  (code fails in the sandbox)
    ├── Conflict            409 conflict             (id taken, concurrent change)
    ├── PayloadTooLarge     413 payload-too-large
    ├── HeaderTooLarge      431 header-too-large     (request line and headers, refused before routing)
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

Each class names its HTTP status and problem slug here, once; ``service.api.problems`` turns them
into RFC 9457 problem+json and the JSON-RPC transports into their error codes.

``type`` is a stable URN per class; clients branch on it, not on ``detail``. A store error that
reaches the edge untranslated is a 503 too, never a 500: an outage is not a bug.

Retryable problems (session busy, unavailable, a failed simulated user) and quotas carry
``Retry-After``: the seconds the failing part announced (an unreachable Redis says when it will be
tried again, a quota when it frees up) or, without such a figure, one second.
"""

from __future__ import annotations

from typing import Any

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


class HeaderTooLarge(ServiceError):
    status = 431
    slug = "header-too-large"
    title = "Request header fields too large"


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
