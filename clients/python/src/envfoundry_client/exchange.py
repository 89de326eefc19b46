"""What both clients share around one HTTP exchange: configuration, headers, reading an answer
into a result or a typed error, and the retry schedule. Pure functions; no I/O."""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import httpx

from envfoundry_client import __version__
from envfoundry_client.endpoints import Operation
from envfoundry_client.environ import seconds_from_environment
from envfoundry_client.errors import PROBLEM_PREFIX, ProtocolError, from_response

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8000"
# Retry on these answers: the service is saturated or briefly down, nothing was applied.
RETRY_STATUSES = frozenset({429, 503})
# And on these when they carry Retry-After, which the service sends with the problems that are
# worth repeating as they are (a session busy with an earlier call, a simulated user that failed).
RETRY_WHEN_TOLD = frozenset({409, 502})
# A 503 that no wait will mend: the service has no simulated user configured.
PERMANENT = frozenset({PROBLEM_PREFIX + "user-llm-unavailable"})


RETRY_SECONDS = 30.0  # a restart of the service takes a few seconds: the default budget rides over it


def _budget_from_environment() -> float:
    """``ENVFOUNDRY_RETRY_SECONDS``, else the default budget."""
    seconds = seconds_from_environment("ENVFOUNDRY_RETRY_SECONDS", 0, "seconds, 0 or more (0: no retry)")
    return RETRY_SECONDS if seconds is None else seconds


@dataclass(frozen=True)
class Retry:
    """How long, and how often, to keep repeating an operation that is safe to repeat.

    The budget is time: an operation is repeated until ``seconds`` have passed since its first
    attempt (default 30, or ``ENVFOUNDRY_RETRY_SECONDS``; 0: no retry; None: no time limit, which
    needs ``attempts``), or ``attempts`` have been made when that is set. A service restart takes
    a few seconds; counting attempts alone gave up before it came back.
    """

    attempts: int | None = None  # first try included; None: as many as the time budget allows
    backoff: float = 0.25  # seconds before the 2nd attempt, doubled each time, with jitter
    max_delay: float = 30.0  # no wait is longer, whatever Retry-After says
    seconds: float | None = field(default_factory=_budget_from_environment)  # None: attempts only
    max_backoff: float = 2.0  # backoff stops doubling here, so a service back up is found soon

    def __post_init__(self) -> None:
        if self.attempts is None and self.seconds is None:
            raise ValueError("Retry needs a limit: attempts, seconds or both")

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0-based)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay)
        base = min(self.backoff * 2.0 ** min(attempt, 30), self.max_backoff)
        return min(base * (0.5 + random.random() / 2), self.max_delay)  # jitter spreads a herd of clients

    def wait(self, attempt: int, retry_after: float | None, elapsed: float) -> float | None:
        """The wait before attempt ``attempt + 1``, or None when the budget is spent.

        A wait that would overrun the time budget is cut to what is left: one last attempt at the end.
        """
        if self.attempts is not None and attempt + 1 >= self.attempts:
            return None
        wait = self.delay(attempt, retry_after)
        if self.seconds is not None:
            left = self.seconds - elapsed
            if left <= 0:
                return None
            wait = min(wait, left)
        return wait


@dataclass(frozen=True)
class Config:
    base_url: str
    headers: dict[str, str]
    timeout: httpx.Timeout
    retry: Retry


def config(base_url: str | None, api_key: str | None, timeout: float | httpx.Timeout, retry: Retry | None,
           headers: dict[str, str] | None) -> Config:
    """Resolve arguments against ``ENVFOUNDRY_URL`` and ``ENVFOUNDRY_API_KEY``; arguments win."""
    url = (base_url or os.environ.get("ENVFOUNDRY_URL") or DEFAULT_URL).rstrip("/")
    key = api_key if api_key is not None else os.environ.get("ENVFOUNDRY_API_KEY")
    merged = {"User-Agent": f"envfoundry-client/{__version__}", "Accept": "application/json"}
    if key:
        merged["Authorization"] = f"Bearer {key}"
    merged.update(headers or {})
    limits = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout, connect=min(timeout, 10.0))
    return Config(url, merged, limits, retry or Retry())


def request_kwargs(op: Operation[Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"headers": op.headers()}
    if op.body is not None:
        kwargs["json"] = op.body
    if op.params:
        kwargs["params"] = op.params
    return kwargs


def retry_after(headers: httpx.Headers) -> float | None:
    """``Retry-After`` in seconds, from either of its two forms (delta-seconds or an HTTP date)."""
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    from datetime import UTC, datetime

    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


def should_retry(op: Operation[Any], response: httpx.Response | None, attempt: int, retry: Retry,
                 elapsed: float = 0.0) -> float | None:
    """Seconds to wait before sending ``op`` again, or None to stop. ``response`` None: no answer came.
    ``elapsed``: seconds since the operation's first attempt."""
    if not op.retryable:
        return None
    if response is None:
        return retry.wait(attempt, None, elapsed)
    told = retry_after(response.headers)
    if response.status_code in RETRY_STATUSES and not _permanent(response):
        return retry.wait(attempt, told, elapsed)
    if response.status_code in RETRY_WHEN_TOLD and told is not None:
        return retry.wait(attempt, told, elapsed)
    return None


def _permanent(response: httpx.Response) -> bool:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(body, dict) and body.get("type") in PERMANENT


def read(op: Operation[T], response: httpx.Response) -> T:
    """The operation's result, or the typed error the answer stands for.

    Raises:
        ProblemError (a subclass per problem type) for an error answer; ProtocolError for an
        answer the API does not promise.
    """
    status = response.status_code
    if status == op.status:
        if status == 204:
            return op.parse(None)
        try:
            body = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"{op.method} {op.path}: the answer is not JSON ({exc})", status) from exc
        try:
            return op.parse(body)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"{op.method} {op.path}: unexpected answer body ({exc!r}): {response.text[:300]}",
                                status) from exc
    if status >= 400:
        try:
            body = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        raise from_response(status, body, response.text, retry_after(response.headers))
    raise ProtocolError(f"{op.method} {op.path}: expected HTTP {op.status}, got {status}: {response.text[:300]}",
                        status)
