"""Errors of the synthesis pipeline. One root; fields are typed, never text to parse.

    SynthesisError
    ├── ConfigError       the config file or the corpus is unusable (``path``, ``field``)
    ├── LLMError          the endpoint failed us
    │   ├── LLMGaveUp     429 / 5xx / timeouts persisted for ``attempts`` tries (``last``)
    │   └── LLMRejected   the endpoint refused the request (``status``); retrying cannot help
    ├── EndpointUnusable  no request of the run can succeed (key refused, model unknown, server unreachable):
    │                     the run stops at once (``cause``)
    ├── ParseError        one answer does not have the required format (``reason``)
    ├── AnswerRejected    every answer, re-asks included, failed to parse (``template``, ``attempts``)
    └── Dropped           an item is rejected on its merits (``reason`` code, ``detail``)

``Dropped`` is an outcome, not a failure: the item is finished and a rerun
skips it. ``EndpointUnusable`` stops the whole run. Every other error marks the
item failed; a rerun tries it again.
"""

from __future__ import annotations


class SynthesisError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(SynthesisError):
    def __init__(self, message: str, *, path: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.field = field


class LLMError(SynthesisError):
    pass


class LLMGaveUp(LLMError):
    def __init__(self, endpoint: str, model: str, attempts: int, last: str) -> None:
        super().__init__(f"{endpoint} ({model}): gave up after {attempts} attempts; last error: {last}")
        self.endpoint = endpoint
        self.model = model
        self.attempts = attempts
        self.last = last


class LLMRejected(LLMError):
    def __init__(self, endpoint: str, model: str, status: int, body: str) -> None:
        super().__init__(f"{endpoint} ({model}): the endpoint refused the request with HTTP {status}: {body}")
        self.endpoint = endpoint
        self.model = model
        self.status = status
        self.body = body


class EndpointUnusable(SynthesisError):
    """An answer no item can get past: the key is refused (401, 403), the model is unknown (404), or the
    server stays unreachable after its retries. Not an ``LLMError``: nothing may fall back from it."""

    def __init__(self, cause: LLMError) -> None:
        super().__init__(f"the endpoint cannot serve this run: {cause.message}")
        self.cause = cause


class ParseError(SynthesisError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AnswerRejected(SynthesisError):
    def __init__(self, template: str, attempts: int, last: str) -> None:
        super().__init__(f"{template}: no usable answer in {attempts} attempts; last problem: {last}")
        self.template = template
        self.attempts = attempts
        self.last = last


class Dropped(SynthesisError):
    """The item is judged unfit. ``reason`` is a short code the summary groups by."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
