"""Every problem type maps to its exception class; unknown types fall back by status."""

from __future__ import annotations

import pytest
from envfoundry_client import errors

CASES = [
    (404, "not-found", errors.NotFound), (422, "invalid-request", errors.InvalidRequest),
    (422, "invalid-environment", errors.InvalidEnvironment), (409, "conflict", errors.Conflict),
    (413, "payload-too-large", errors.PayloadTooLarge), (409, "session-busy", errors.SessionBusy),
    (503, "unavailable", errors.Unavailable), (401, "unauthorized", errors.Unauthorized),
    (403, "forbidden", errors.Forbidden), (429, "quota-exceeded", errors.QuotaExceeded),
    (422, "idempotency-key-reused", errors.IdempotencyKeyReused),
    (409, "not-conversation", errors.NotConversation), (409, "conversation-ended", errors.ConversationEnded),
    (503, "user-llm-unavailable", errors.UserLLMUnavailable), (502, "user-llm-failed", errors.UserLLMFailed),
]


@pytest.mark.parametrize(("status", "slug", "cls"), CASES)
def test_each_problem_type_has_its_class(status: int, slug: str, cls: type[errors.ProblemError]) -> None:
    body = {"type": f"urn:envfoundry:problem:{slug}", "title": "t", "status": status, "detail": f"why {slug}",
            "instance": "/v1/x", "errors": [{"field": "n", "message": "too big"}], "reason": "extra"}
    exc = errors.from_response(status, body, "", retry_after=2.0)
    assert type(exc) is cls and isinstance(exc, errors.EnvfoundryError)
    assert (exc.status, exc.slug, exc.detail, exc.instance) == (status, slug, f"why {slug}", "/v1/x")
    assert exc.errors == [{"field": "n", "message": "too big"}] and exc.extra == {"reason": "extra"}
    assert exc.retry_after == 2.0


def test_conversation_and_busy_problems_are_conflicts() -> None:
    assert issubclass(errors.SessionBusy, errors.Conflict)
    assert issubclass(errors.ConversationEnded, errors.Conflict)
    assert issubclass(errors.UserLLMUnavailable, errors.Unavailable)


@pytest.mark.parametrize(("status", "cls"), [(404, errors.NotFound), (503, errors.Unavailable),
                                             (429, errors.QuotaExceeded), (500, errors.ProblemError), (502, errors.ProblemError),
                                             (418, errors.ProblemError)])
def test_unknown_types_fall_back_by_status(status: int, cls: type[errors.ProblemError]) -> None:
    exc = errors.from_response(status, {"type": "urn:envfoundry:problem:brand-new", "detail": "d"}, "")
    assert type(exc) is cls and exc.problem_type == "urn:envfoundry:problem:brand-new"


def test_an_answer_that_is_not_problem_json_still_gives_a_typed_error() -> None:
    exc = errors.from_response(502, None, "<html>Bad Gateway</html>")
    assert type(exc) is errors.ProblemError  # a proxy's 502 is not the user LLM failing
    assert exc.status == 502 and "Bad Gateway" in exc.detail
