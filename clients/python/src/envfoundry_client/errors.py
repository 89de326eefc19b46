"""Exceptions raised by the client, one per problem type the service answers.

    EnvfoundryError                 root; also any problem of an unknown type
    ├── TransportError              no HTTP answer (connection refused, timeout)
    ├── ProtocolError               an answer that is not what the API promises
    └── ProblemError                an RFC 9457 problem+json answer (has status, type, detail, errors)
        ├── NotFound                404 not-found
        ├── InvalidRequest          422 invalid-request (``errors`` names the fields)
        ├── InvalidEnvironment      422 invalid-environment
        ├── IdempotencyKeyReused    422 idempotency-key-reused
        ├── PayloadTooLarge         413 payload-too-large
        ├── Unauthorized            401 unauthorized
        ├── Forbidden               403 forbidden
        ├── QuotaExceeded           429 quota-exceeded
        ├── Conflict                409 conflict
        │   ├── SessionBusy         409 session-busy
        │   ├── NotConversation     409 not-conversation
        │   └── ConversationEnded   409 conversation-ended
        ├── UserLLMFailed           502 user-llm-failed
        └── Unavailable             503 unavailable
            └── UserLLMUnavailable  503 user-llm-unavailable

Code branches on the class (or ``problem_type``), never on ``detail``. A problem whose type the
client does not know becomes the class of its status (e.g. an unknown 404 type is ``NotFound``),
or ``ProblemError`` when the status has no class of its own.
"""

from __future__ import annotations

from typing import Any

PROBLEM_PREFIX = "urn:envfoundry:problem:"


class EnvfoundryError(Exception):
    """Root of every error the client raises."""


class TransportError(EnvfoundryError):
    """The service could not be reached or did not answer in time (after any retries)."""


class ProtocolError(EnvfoundryError):
    """The service answered something the API does not promise (wrong status or body)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ProblemError(EnvfoundryError):
    """A problem+json answer. ``slug`` is the part of ``type`` after ``urn:envfoundry:problem:``."""

    slug = ""

    def __init__(self, status: int, problem_type: str, title: str, detail: str, *,
                 instance: str | None = None, errors: list[dict[str, str]] | None = None,
                 extra: dict[str, Any] | None = None, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {problem_type}: {detail}")
        self.status = status
        self.problem_type = problem_type
        self.title = title
        self.detail = detail
        self.instance = instance
        self.errors = errors or []
        self.extra = extra or {}
        self.retry_after = retry_after

    @property
    def field(self) -> str | None:
        """The request field at fault, when the problem names one (in ``errors`` or as ``field``)."""
        if self.errors and self.errors[0].get("field"):
            return self.errors[0]["field"]
        named = self.extra.get("field")
        return named if isinstance(named, str) else None


class NotFound(ProblemError):
    slug = "not-found"


class InvalidRequest(ProblemError):
    slug = "invalid-request"


class InvalidEnvironment(ProblemError):
    slug = "invalid-environment"


class IdempotencyKeyReused(ProblemError):
    slug = "idempotency-key-reused"


class PayloadTooLarge(ProblemError):
    slug = "payload-too-large"


class Unauthorized(ProblemError):
    slug = "unauthorized"


class Forbidden(ProblemError):
    slug = "forbidden"


class QuotaExceeded(ProblemError):
    slug = "quota-exceeded"


class Conflict(ProblemError):
    slug = "conflict"


class SessionBusy(Conflict):
    slug = "session-busy"


class NotConversation(Conflict):
    slug = "not-conversation"


class ConversationEnded(Conflict):
    slug = "conversation-ended"


class NotTurnBased(Conflict):
    slug = "not-turn-based"


class TurnsEnded(Conflict):
    slug = "turns-ended"


class UserLLMFailed(ProblemError):
    slug = "user-llm-failed"


class Unavailable(ProblemError):
    slug = "unavailable"


class UserLLMUnavailable(Unavailable):
    slug = "user-llm-unavailable"


_BY_SLUG: dict[str, type[ProblemError]] = {
    cls.slug: cls for cls in (NotFound, InvalidRequest, InvalidEnvironment, IdempotencyKeyReused, PayloadTooLarge,
                              Unauthorized, Forbidden, QuotaExceeded, Conflict, SessionBusy, NotConversation,
                              ConversationEnded, NotTurnBased, TurnsEnded, UserLLMFailed, Unavailable,
                              UserLLMUnavailable)
}
_BY_STATUS: dict[int, type[ProblemError]] = {
    401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 413: PayloadTooLarge, 422: InvalidRequest,
    429: QuotaExceeded, 503: Unavailable,
}  # 502 is left out: a gateway's Bad Gateway is not the user LLM failing


def problem_class(status: int, problem_type: str) -> type[ProblemError]:
    """The exception class for a problem: by its type URN, else by its status, else the root."""
    if problem_type.startswith(PROBLEM_PREFIX):
        known = _BY_SLUG.get(problem_type[len(PROBLEM_PREFIX):])
        if known is not None:
            return known
    return _BY_STATUS.get(status, ProblemError)


def from_response(status: int, body: Any, text: str, retry_after: float | None = None) -> ProblemError:
    """Build the typed exception for an error answer; a body that is not problem+json still gives one."""
    if isinstance(body, dict) and isinstance(body.get("type"), str):
        known = {"type", "title", "status", "detail", "instance", "errors"}
        errors = body.get("errors")
        return problem_class(status, body["type"])(
            status, body["type"], str(body.get("title", "")), str(body.get("detail", "")),
            instance=body.get("instance") if isinstance(body.get("instance"), str) else None,
            errors=[dict(e) for e in errors if isinstance(e, dict)] if isinstance(errors, list) else None,
            extra={k: v for k, v in body.items() if k not in known}, retry_after=retry_after)
    detail = text.strip()[:500] or f"HTTP {status} with an empty body"
    return _BY_STATUS.get(status, ProblemError)(status, "about:blank", "", detail, retry_after=retry_after)
