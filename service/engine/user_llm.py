"""The simulated user of conversation mode: an LLM behind any OpenAI-compatible endpoint.

In EnvScaler's conversational setting the task is held by a user, not given to
the agent: the user reveals it step by step and ends the conversation with a
stop marker once satisfied. The task stays a hidden goal in the system prompt.
The LLM plays the user, so the agent's messages are sent with the ``user`` role
and the simulated user's own earlier replies with the ``assistant`` role.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

STOP = "###STOP###"
MAX_REPLY_CHARS = 4000

SYSTEM = """You are role-playing a customer who talks to a support agent. You want the following done:

<goal>
{task}
</goal>

How to behave:
- Write as the customer, in the first person, in plain sentences. You are not the agent: never offer help, never describe tools, never pretend to look things up.
- Reveal your goal gradually. Start with the main request; give further details (names, ids, dates, preferences) only when the agent needs them or asks.
- Never invent facts. Every name, id, number and date you give must come from the goal, copied exactly. If the agent asks for something the goal does not say, answer that you do not know.
- Do not accept outcomes that contradict your goal; say what is wrong.
- When everything in your goal has been done (or the agent has made clear it cannot be done), reply with a short closing sentence and then {stop} on a line of its own. Do not write {stop} before that."""

OPENING = "The conversation starts now. Write your first message to the agent."


class UserLLMFailed(Exception):
    """The simulated user's endpoint failed, timed out, or answered something unusable."""


@dataclass(frozen=True)
class Exchange:
    agent: str
    user: str


@dataclass(frozen=True)
class Reply:
    text: str
    done: bool


class UserSimulator:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, timeout: float = 60.0,
                 temperature: float = 0.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.timeout = timeout
        self.temperature = temperature
        self.client = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    async def opening(self, task: str) -> str:
        """The user's first message. Raises UserLLMFailed."""
        reply = await self._complete(task, [], OPENING)
        if reply.done and not reply.text:
            raise UserLLMFailed("the simulated user ended the conversation before it began")
        return reply.text

    async def reply(self, task: str, opening: str, exchanges: list[Exchange], content: str) -> Reply:
        """The user's answer to the agent's ``content``. Raises UserLLMFailed."""
        history: list[dict[str, str]] = [{"role": "user", "content": OPENING}, {"role": "assistant", "content": opening}]
        for exchange in exchanges:
            history += [{"role": "user", "content": exchange.agent}, {"role": "assistant", "content": exchange.user}]
        return await self._complete(task, history, content)

    async def _complete(self, task: str, history: list[dict[str, str]], last: str) -> Reply:
        messages = [{"role": "system", "content": SYSTEM.format(task=task, stop=STOP)}, *history,
                    {"role": "user", "content": last}]
        body = {"model": self.model, "messages": messages, "temperature": self.temperature}
        try:
            response = await self.client.post("/chat/completions", json=body)
        except httpx.TimeoutException as exc:
            raise UserLLMFailed(f"the simulated user's endpoint timed out ({exc.__class__.__name__})") from exc
        except httpx.HTTPError as exc:
            raise UserLLMFailed(f"the simulated user's endpoint is unreachable: {exc}") from exc
        if response.status_code != 200:
            raise UserLLMFailed(f"the simulated user's endpoint answered HTTP {response.status_code}")
        return _parse(response)

    async def close(self) -> None:
        await self.client.aclose()


def _parse(response: httpx.Response) -> Reply:
    try:
        data: Any = response.json()
        content = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise UserLLMFailed("the simulated user's endpoint answered without a chat completion message") from exc
    if not isinstance(content, str):
        raise UserLLMFailed("the simulated user's message is not text")
    done = STOP in content
    text = content.replace(STOP, "").strip()
    if not text and not done:
        raise UserLLMFailed("the simulated user's message is empty")
    if len(text) > MAX_REPLY_CHARS:
        text = text[:MAX_REPLY_CHARS]
    return Reply(text, done)
