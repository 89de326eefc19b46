"""A minimal async client for any OpenAI-compatible ``/chat/completions`` endpoint (the agent's LLM).

Chat completions change nothing anywhere, so every failure that may pass (429, 5xx, no answer, a
body that is not a completion) is retried with backoff; what is left raises ``LLMError``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from envfoundry_client.errors import EnvfoundryError
from envfoundry_client.exchange import Retry, retry_after
from envfoundry_client.models import JSON


class LLMError(EnvfoundryError):
    """The agent's LLM endpoint failed or answered something that is not a chat completion."""


@dataclass(frozen=True)
class Completion:
    message: JSON  # the assistant message as the API returned it (role, content, tool_calls)
    finish_reason: str
    usage: dict[str, int]


class ChatLLM:
    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 120.0,
                 retry: Retry | None = None, temperature: float | None = None, max_tokens: int | None = None,
                 max_connections: int = 64) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        # an LLM endpoint that is down stays down for longer than a restart: a few attempts, then the episode fails
        self.retry = retry or Retry(attempts=4, backoff=0.5, seconds=None)
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers,
                                       timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
                                       limits=httpx.Limits(max_connections=max_connections))

    async def complete(self, messages: list[JSON], tools: list[JSON] | None = None) -> Completion:
        body: JSON = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        attempt, started = 0, time.monotonic()
        while True:
            wait: float | None = None
            try:
                response = await self._http.post("/chat/completions", json=body)
            except httpx.TransportError as exc:
                problem = f"no answer from the LLM endpoint ({type(exc).__name__}: {exc})"
            else:
                if response.status_code == 200:
                    try:
                        return _completion(response.json())
                    except (ValueError, KeyError, TypeError, IndexError) as exc:
                        problem = f"the LLM endpoint's answer is not a chat completion ({exc!r}): {response.text[:200]}"
                elif response.status_code == 429 or response.status_code >= 500:
                    problem = f"the LLM endpoint answered {response.status_code}: {response.text[:200]}"
                    wait = retry_after(response.headers)
                else:  # a request the endpoint rejects will be rejected again
                    raise LLMError(f"the LLM endpoint answered {response.status_code}: {response.text[:500]}")
            pause = self.retry.wait(attempt, wait, time.monotonic() - started)
            if pause is None:
                raise LLMError(f"{problem} (after {attempt + 1} attempts)")
            await asyncio.sleep(pause)
            attempt += 1

    async def aclose(self) -> None:
        await self._http.aclose()


def _completion(body: Any) -> Completion:
    choice = body["choices"][0]
    message = choice["message"]
    if not isinstance(message, dict):
        raise TypeError("message is not an object")
    usage = body.get("usage") or {}
    counts = {k: int(usage.get(k) or 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    if not counts["total_tokens"]:
        counts["total_tokens"] = counts["prompt_tokens"] + counts["completion_tokens"]
    clean: JSON = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        clean["tool_calls"] = message["tool_calls"]
    json.dumps(clean)  # a completion we cannot write back out is not one
    return Completion(clean, str(choice.get("finish_reason") or "stop"), counts)
