"""``Client`` and ``AsyncClient``: two thin transports over the operations in ``endpoints``.

Each public method is an endpoint function bound to a transport, so both clients have the same
methods, signatures and docstrings by construction. A transport only sends an operation, retries
it when ``exchange.should_retry`` says so, and hands the answer to ``exchange.read``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from envfoundry_client import endpoints
from envfoundry_client.endpoints import Operation
from envfoundry_client.errors import TransportError
from envfoundry_client.exchange import Config, Retry, config, read, request_kwargs, should_retry
from envfoundry_client.models import ScenarioSummary, Step

P = ParamSpec("P")
T = TypeVar("T")
PAGE = 500


def _sync(build: Callable[P, Operation[T]]) -> Callable[Concatenate[Client, P], T]:
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.send(build(*args, **kwargs))

    method.__name__ = method.__qualname__ = build.__name__
    method.__doc__ = build.__doc__
    return method


def _async(build: Callable[P, Operation[T]]) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.send(build(*args, **kwargs))

    method.__name__ = method.__qualname__ = build.__name__
    method.__doc__ = build.__doc__
    return method


def _failed(op: Operation[Any], exc: httpx.TransportError, attempt: int) -> TransportError:
    tried = f" (after {attempt + 1} attempts)" if op.retryable else " (not repeated: it is not safe to)"
    return TransportError(f"{op.method} {op.path}: {type(exc).__name__}: {exc or 'no answer'}{tried}")


class Client:
    """Synchronous client. One connection pool per instance; use it as a context manager or ``close()`` it.

    Args:
        base_url: the service (default ``ENVFOUNDRY_URL``, else ``http://127.0.0.1:8000``).
        api_key: sent as a bearer token (default ``ENVFOUNDRY_API_KEY``).
        timeout: seconds per request (a float, or an ``httpx.Timeout``).
        retry: attempts and backoff for the operations that are safe to repeat.
    """

    def __init__(self, base_url: str | None = None, *, api_key: str | None = None,
                 timeout: float | httpx.Timeout = 120.0, retry: Retry | None = None,
                 headers: dict[str, str] | None = None, transport: httpx.BaseTransport | None = None) -> None:
        self.config: Config = config(base_url, api_key, timeout, retry, headers)
        self._http = httpx.Client(base_url=self.config.base_url, headers=self.config.headers,
                                  timeout=self.config.timeout, transport=transport)

    def send(self, op: Operation[T]) -> T:
        """Run one operation, retrying where safe. Raises a ``ProblemError`` subclass or ``TransportError``."""
        attempt, started = 0, time.monotonic()
        while True:
            try:
                response = self._http.request(op.method, op.path, **request_kwargs(op))
            except httpx.TransportError as exc:
                wait = should_retry(op, None, attempt, self.config.retry, time.monotonic() - started)
                if wait is None:
                    raise _failed(op, exc, attempt) from exc
            else:
                wait = should_retry(op, response, attempt, self.config.retry, time.monotonic() - started)
                if wait is None:
                    return read(op, response)
            time.sleep(wait)
            attempt += 1

    def iter_trajectory(self, session_id: str, *, page_size: int = PAGE) -> Iterator[Step]:
        """Every step of a session, fetched a page at a time."""
        offset = 0
        while True:
            page = self.trajectory(session_id, offset=offset, limit=page_size)
            yield from page.steps
            offset += len(page.steps)
            if not page.steps or offset >= page.total:
                return

    def iter_scenarios(self, *, env_id: str | None = None, split: str | None = None, tags: Sequence[str] = (),
                       page_size: int = PAGE) -> Iterator[ScenarioSummary]:
        """Every scenario the filters select (as ``find_scenarios``), by id, fetched a page at a time."""
        cursor = None
        while True:
            page = self.find_scenarios(env_id=env_id, split=split, tags=tags, limit=page_size, cursor=cursor)
            yield from page.scenarios
            cursor = page.next_cursor
            if cursor is None:
                return

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    health = _sync(endpoints.health)
    list_environments = _sync(endpoints.list_environments)
    get_environment = _sync(endpoints.get_environment)
    environment_versions = _sync(endpoints.environment_versions)
    catalog_manifest = _sync(endpoints.catalog_manifest)
    create_environment = _sync(endpoints.create_environment)
    delete_environment = _sync(endpoints.delete_environment)
    list_scenarios = _sync(endpoints.list_scenarios)
    find_scenarios = _sync(endpoints.find_scenarios)
    get_scenario = _sync(endpoints.get_scenario)
    create_scenario = _sync(endpoints.create_scenario)
    delete_scenario = _sync(endpoints.delete_scenario)
    create_session = _sync(endpoints.create_session)
    get_session = _sync(endpoints.get_session)
    tools = _sync(endpoints.tools)
    call = _sync(endpoints.call)
    send_message = _sync(endpoints.send_message)
    end_turn = _sync(endpoints.end_turn)
    turn = _sync(endpoints.turn)
    state = _sync(endpoints.state)
    trajectory = _sync(endpoints.trajectory)
    score = _sync(endpoints.score)
    fork = _sync(endpoints.fork)
    delete_session = _sync(endpoints.delete_session)


class AsyncClient:
    """Asynchronous client with the same methods as ``Client``, each a coroutine. Use ``async with``."""

    def __init__(self, base_url: str | None = None, *, api_key: str | None = None,
                 timeout: float | httpx.Timeout = 120.0, retry: Retry | None = None,
                 headers: dict[str, str] | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 max_connections: int = 100) -> None:
        self.config: Config = config(base_url, api_key, timeout, retry, headers)
        self._http = httpx.AsyncClient(base_url=self.config.base_url, headers=self.config.headers,
                                       timeout=self.config.timeout, transport=transport,
                                       limits=httpx.Limits(max_connections=max_connections))

    async def send(self, op: Operation[T]) -> T:
        """Run one operation, retrying where safe. Raises a ``ProblemError`` subclass or ``TransportError``."""
        attempt, started = 0, time.monotonic()
        while True:
            try:
                response = await self._http.request(op.method, op.path, **request_kwargs(op))
            except httpx.TransportError as exc:
                wait = should_retry(op, None, attempt, self.config.retry, time.monotonic() - started)
                if wait is None:
                    raise _failed(op, exc, attempt) from exc
            else:
                wait = should_retry(op, response, attempt, self.config.retry, time.monotonic() - started)
                if wait is None:
                    return read(op, response)
            await asyncio.sleep(wait)
            attempt += 1

    async def iter_trajectory(self, session_id: str, *, page_size: int = PAGE) -> AsyncIterator[Step]:
        """Every step of a session, fetched a page at a time."""
        offset = 0
        while True:
            page = await self.trajectory(session_id, offset=offset, limit=page_size)
            for step in page.steps:
                yield step
            offset += len(page.steps)
            if not page.steps or offset >= page.total:
                return

    async def iter_scenarios(self, *, env_id: str | None = None, split: str | None = None, tags: Sequence[str] = (),
                             page_size: int = PAGE) -> AsyncIterator[ScenarioSummary]:
        """Every scenario the filters select (as ``find_scenarios``), by id, fetched a page at a time."""
        cursor = None
        while True:
            page = await self.find_scenarios(env_id=env_id, split=split, tags=tags, limit=page_size, cursor=cursor)
            for scenario in page.scenarios:
                yield scenario
            cursor = page.next_cursor
            if cursor is None:
                return

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    health = _async(endpoints.health)
    list_environments = _async(endpoints.list_environments)
    get_environment = _async(endpoints.get_environment)
    environment_versions = _async(endpoints.environment_versions)
    catalog_manifest = _async(endpoints.catalog_manifest)
    create_environment = _async(endpoints.create_environment)
    delete_environment = _async(endpoints.delete_environment)
    list_scenarios = _async(endpoints.list_scenarios)
    find_scenarios = _async(endpoints.find_scenarios)
    get_scenario = _async(endpoints.get_scenario)
    create_scenario = _async(endpoints.create_scenario)
    delete_scenario = _async(endpoints.delete_scenario)
    create_session = _async(endpoints.create_session)
    get_session = _async(endpoints.get_session)
    tools = _async(endpoints.tools)
    call = _async(endpoints.call)
    send_message = _async(endpoints.send_message)
    end_turn = _async(endpoints.end_turn)
    turn = _async(endpoints.turn)
    state = _async(endpoints.state)
    trajectory = _async(endpoints.trajectory)
    score = _async(endpoints.score)
    fork = _async(endpoints.fork)
    delete_session = _async(endpoints.delete_session)
