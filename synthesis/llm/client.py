"""The client of an OpenAI-compatible endpoint: ``/chat/completions`` and ``/embeddings`` over httpx.

vLLM, Ollama, llama.cpp's server, LiteLLM and OpenAI itself all speak this
wire format, so they are configurations of this one client, not separate
implementations. It bounds requests in flight, retries 429, 5xx, timeouts and
connection errors with exponential backoff (honouring ``Retry-After``) and
gives up after ``max_attempts`` with ``LLMGaveUp``; answers are cached on
disk by content, and identical requests in flight at once are sent once.

An answer no request can get past (the key refused, the model unknown, the
server unreachable after its retries) raises ``EndpointUnusable`` for that
request and every later one, without sending them. Until a first answer has
come back, requests go one at a time, so a hopeless endpoint costs one request
(and its retries), not one per item in flight.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from synthesis.errors import EndpointUnusable, LLMGaveUp, LLMRejected
from synthesis.llm.cache import ResponseCache, request_key
from synthesis.llm.usage import Ledger
from synthesis.run.config import Role, SynthConfig

Message = dict[str, str]
Check = Callable[[Any], None]  # raises on a response body of the wrong shape


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str | None
    cached: bool
    key: str = ""  # the cache key of the request, so an answer that proves unusable can be forgotten


# Refusals that no other request of the run would escape: a bad key, or a model (or URL) the endpoint lacks.
# A 404 from /embeddings is not one: deduplication falls back to lexical similarity.
_HOPELESS = {"chat/completions": {401, 403, 404}, "embeddings": {401, 403}}


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None, *, unreachable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.unreachable = unreachable  # no connection could be made at all


class LLMClient:
    def __init__(
        self,
        config: SynthConfig,
        ledger: Ledger,
        *,
        api_key: str | None = None,
        cache: ResponseCache | None = None,
        concurrency: int | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.cache = cache
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=config.llm.base_url.rstrip("/") + "/", headers=headers, timeout=config.llm.timeout
        )
        self._slots = asyncio.Semaphore(concurrency or config.run.concurrency)
        self._inflight: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._proven = False  # an answer came back: requests may go concurrently
        self._alone = asyncio.Lock()  # until then, one at a time
        self._unusable: EndpointUnusable | None = None

    async def aclose(self) -> None:
        await self._http.aclose()

    async def chat(self, role: Role, messages: list[Message], *, stage: str, label: str = "") -> Completion:
        """One completion for ``messages`` from the model configured for ``role``.

        ``label`` names the request (template, environment, item, turn). It is
        sent as the ``llm.label_header`` header when that is configured, and is
        never part of the prompt or of the cache key.

        Raises:
            LLMGaveUp: retryable failures persisted for ``llm.max_attempts`` tries.
            LLMRejected: the endpoint refused this request (HTTP 400, 422, ...).
            EndpointUnusable: no request can succeed (key refused, model unknown, server unreachable).
        """
        body: dict[str, Any] = {
            "model": self.config.model_for(role),
            "messages": messages,
            "temperature": self.config.temperature_for(role),
            "max_tokens": self.config.llm.max_tokens,
        }
        data, cached, key = await self._cached("chat/completions", body, role, stage, _check_chat, label)
        choice = data["choices"][0]
        return Completion(str(choice["message"].get("content") or ""), choice.get("finish_reason"), cached, key)

    def forget(self, key: str) -> None:
        """Drop a cached answer that proved unusable, so a rerun asks the endpoint again instead of replaying it."""
        if self.cache is not None and key:
            self.cache.drop(key)

    async def embed(self, texts: list[str], *, stage: str) -> list[list[float]]:
        """One vector per text, in order, from ``llm.embedding_model``.

        Raises:
            LLMGaveUp, LLMRejected, EndpointUnusable: as for ``chat``.
        """
        body = {"model": self.config.model_for("embedding"), "input": texts}
        data, _, _ = await self._cached("embeddings", body, "embedding", stage, _check_embeddings, "")
        rows = sorted(data["data"], key=lambda row: int(row.get("index", 0)))
        return [[float(x) for x in row["embedding"]] for row in rows]

    async def _cached(
        self, endpoint: str, body: dict[str, Any], role: Role, stage: str, check: Check, label: str
    ) -> tuple[dict[str, Any], bool, str]:
        key = request_key({"endpoint": endpoint, **body})
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.ledger.cache_hit(stage)
                return hit, True, key
        pending = self._inflight.get(key)
        if pending is not None:  # the same request is on its way: share its answer
            self.ledger.cache_hit(stage)
            return await asyncio.shield(pending), True, key
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            data = await self._post(endpoint, body, role, stage, check, label)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # consumed here: no "exception never retrieved" when nobody shared it
            raise
        finally:
            del self._inflight[key]
        future.set_result(data)
        if self.cache is not None:
            self.cache.put(key, {"endpoint": endpoint, **body}, data)
        return data, False, key

    async def _post(
        self, endpoint: str, body: dict[str, Any], role: Role, stage: str, check: Check, label: str
    ) -> dict[str, Any]:
        if not self._proven:
            async with self._alone:
                if not self._proven:
                    return await self._tries(endpoint, body, role, stage, check, label)
        return await self._tries(endpoint, body, role, stage, check, label)

    async def _tries(
        self, endpoint: str, body: dict[str, Any], role: Role, stage: str, check: Check, label: str
    ) -> dict[str, Any]:
        attempts = self.config.llm.max_attempts
        model = str(body["model"])
        last: _Retryable | None = None
        for attempt in range(1, attempts + 1):
            if self._unusable is not None:
                raise self._unusable
            self.ledger.request(stage)
            try:
                data = await self._send(endpoint, body, model, check, label)
            except _Retryable as exc:
                last = exc
                if attempt < attempts:
                    await asyncio.sleep(self._delay(attempt, exc.retry_after))
                continue
            except LLMRejected as exc:
                if exc.status in _HOPELESS[endpoint]:
                    self._unusable = EndpointUnusable(exc)
                    raise self._unusable from None
                self._proven = True
                raise
            self._proven = True
            usage = data.get("usage") or {}
            self.ledger.answer(stage, role, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
            return data
        assert last is not None
        gave_up = LLMGaveUp(endpoint, model, attempts, last.reason)
        if last.unreachable:
            self._unusable = EndpointUnusable(gave_up)
            raise self._unusable
        raise gave_up

    async def _send(self, endpoint: str, body: dict[str, Any], model: str, check: Check, label: str) -> dict[str, Any]:
        header = self.config.llm.label_header
        headers = {header: label} if header and label else None
        async with self._slots:  # backoff sleeps happen outside: a waiting retry holds no slot
            try:
                response = await self._http.post(endpoint, json=body, headers=headers)
            except httpx.TimeoutException:
                raise _Retryable(f"no answer within {self.config.llm.timeout:g} s") from None
            except httpx.ConnectError as exc:
                raise _Retryable(f"connection failed: {type(exc).__name__}: {exc}", unreachable=True) from None
            except httpx.TransportError as exc:
                raise _Retryable(f"connection failed: {type(exc).__name__}: {exc}") from None
        status = response.status_code
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}: {response.text[:200]}", _retry_after(response))
        if status != 200:
            raise LLMRejected(endpoint, model, status, response.text[:500])
        try:
            data = response.json()
            check(data)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            # A proxy or an overloaded server can answer 200 with junk; a retry usually helps.
            raise _Retryable(f"malformed response body: {exc}") from None
        result: dict[str, Any] = data
        return result

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        llm = self.config.llm
        delay: float = min(llm.backoff_max, llm.backoff_initial * (1 << (attempt - 1)))
        delay *= 0.5 + random.random() / 2  # jitter: concurrent retries do not stampede together
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, llm.backoff_max)


def _retry_after(response: httpx.Response) -> float | None:
    value: str | None = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: rare from LLM servers; plain backoff is good enough


def _check_chat(data: Any) -> None:
    message = data["choices"][0]["message"]
    if not isinstance(message, dict):
        raise TypeError("choices[0].message is not an object")


def _check_embeddings(data: Any) -> None:
    if not isinstance(data["data"], list) or not all(isinstance(row["embedding"], list) for row in data["data"]):
        raise TypeError("data[].embedding is missing")
