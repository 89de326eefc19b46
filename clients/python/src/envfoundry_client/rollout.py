"""The rollout runner: an agent (any OpenAI-compatible chat endpoint) plays envfoundry scenarios.

Each scenario gets one group of ``samples`` sessions made in one request (``n``); each session is
one episode. The agent sees the environment's introduction and rules as the system prompt and the
task (or the simulated user's opening message) as the first user message. Tools go to the model
natively (``tools=``) or, in prompt mode, are listed in the system prompt and read back from
``<tool_call>`` blocks. An episode ends when the agent answers without a tool call (task mode),
when the simulated user says it is done (conversation mode), in a turn-based episode when its last
turn ends (each answer without a tool call ends a turn; the next user message follows, with the
tools that arrive with it), at ``max_steps`` agent turns, or on
an error; then the session is scored and deleted. Every finished episode is written at once as
one JSON line.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from envfoundry_client.actions import Action, openai_tool_call, parse_action, parse_text, tool_response, tools_prompt
from envfoundry_client.chat import ChatLLM, LLMError
from envfoundry_client.client import AsyncClient
from envfoundry_client.errors import EnvfoundryError
from envfoundry_client.models import JSON, Mode, Score, Session

ToolFormat = Literal["native", "prompt"]


@dataclass(frozen=True)
class RolloutOptions:
    mode: Mode = "task"
    tool_format: ToolFormat = "native"
    samples: int = 1
    concurrency: int = 4
    max_steps: int = 30
    keep_sessions: bool = False


@dataclass
class Episode:
    """What an episode accumulates while it runs; ``record()`` is its JSONL line."""

    session: Session
    session_id: str
    sample: int
    options: RolloutOptions
    model: str
    messages: list[JSON] = field(default_factory=list)  # OpenAI chat format, what training reads
    wire: list[JSON] = field(default_factory=list)  # what the model was sent (differs in prompt mode)
    calls: list[JSON] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0,
                                                            "total_tokens": 0})
    turns: int = 0
    steps: int = 0
    # The tools the model is offered: the session's, and in a turn-based episode those that arrive later.
    tools: list[JSON] = field(default_factory=list)
    finish_reason: str = ""
    error: str | None = None
    score: JSON = field(default_factory=lambda: {"reward": None, "passed": 0, "total": 0, "checks": []})
    catalog_digest: str | None = None  # the service's catalog manifest digest when the run started

    def say(self, message: JSON, wire: JSON | None = None) -> None:
        self.messages.append(message)
        self.wire.append(wire or message)

    def record(self) -> JSON:
        return {
            "scenario_id": self.session.scenario_id, "env_id": self.session.env_id, "sample": self.sample,
            "session_id": self.session_id, "mode": self.options.mode, "tool_format": self.options.tool_format,
            "model": self.model, "tools": self.tools or self.session.tools, "messages": self.messages, "tool_calls": self.calls,
            "reward": self.score["reward"], "passed": self.score["passed"], "total": self.score["total"],
            "checks": self.score["checks"], "usage": self.usage, "turns": self.turns, "steps": self.steps,
            "finish_reason": self.finish_reason, "error": self.error,
            # what produced the reward, to re-score or reproduce it against exactly that
            "env_version": self.score.get("env_version"), "scenario_version": self.score.get("scenario_version"),
            "catalog_digest": self.catalog_digest,
        }


def system_prompt(session: Session, tool_format: ToolFormat) -> str:
    parts = [session.introduction.strip()] if session.introduction.strip() else []
    if session.rules:
        parts.append("Rules:\n" + "\n".join(f"- {r}" for r in session.rules))
    if tool_format == "prompt":
        parts.append(tools_prompt(session.tools))
    return "\n\n".join(parts)


async def play(ef: AsyncClient, llm: ChatLLM, ep: Episode) -> JSON:
    """Run one episode to its end, score it, and return its record. Never raises for the agent's or
    the service's failures: they end the episode with a ``finish_reason`` and an ``error``."""
    opts = ep.options
    ep.tools = list(ep.session.tools)
    ep.say({"role": "system", "content": system_prompt(ep.session, opts.tool_format)})
    ep.say({"role": "user", "content": ep.session.prompt})
    try:
        await _turns(ef, llm, ep)
        ep.score = _score_json(await ef.score(ep.session_id))
    except LLMError as exc:
        ep.finish_reason, ep.error = "llm_error", str(exc)
        ep.score = await _score_or_empty(ef, ep)
    except EnvfoundryError as exc:
        ep.finish_reason, ep.error = "service_error", str(exc)
    if not opts.keep_sessions:
        try:
            await ef.delete_session(ep.session_id)
        except EnvfoundryError:
            pass  # it expires on its own
    return ep.record()


async def _turns(ef: AsyncClient, llm: ChatLLM, ep: Episode) -> None:
    opts = ep.options
    native = opts.tool_format == "native"
    while True:
        if ep.turns >= opts.max_steps:
            ep.finish_reason = "max_steps"
            return
        ep.turns += 1
        completion = await llm.complete(ep.wire, ep.tools if native else None)
        for key, value in completion.usage.items():
            ep.usage[key] += value
        reply = completion.message
        text = reply.get("content") or ""
        action: Action = parse_action(reply) if native else parse_text(text)
        if action.error is not None:
            feedback = f"Your last message could not be read: {action.error}. Nothing was done; try again."
            answered = [c["id"] for c in reply.get("tool_calls") or [] if isinstance(c, dict) and c.get("id")]
            if native and answered:  # every tool call id needs its answer, or the next request is rejected
                ep.say(reply)
                for call_id in answered:
                    ep.say({"role": "tool", "tool_call_id": call_id, "content": feedback})
            else:
                ep.say({"role": "assistant", "content": text})
                ep.say({"role": "user", "content": feedback})
            continue
        if action.calls:
            ids = [c.call_id or f"call_{len(ep.calls) + i + 1}" for i, c in enumerate(action.calls)]
            assistant = {"role": "assistant", "content": action.text or None,
                         "tool_calls": [openai_tool_call(c, i) for c, i in zip(action.calls, ids, strict=True)]}
            ep.say(assistant, assistant if native else {"role": "assistant", "content": text})
            responses = []
            for call, call_id in zip(action.calls, ids, strict=True):
                result = await ef.call(ep.session_id, call.name, call.arguments)
                ep.steps += 1
                ep.calls.append({"id": call_id, "name": call.name, "arguments": call.arguments,
                                 "step": result.step, "ok": result.ok, "result": result.result,
                                 "error": None if result.error is None else
                                 {"type": result.error.type, "message": result.error.message},
                                 "observation": result.observation})
                tool_message = {"role": "tool", "tool_call_id": call_id, "name": call.name,
                                "content": result.observation}
                if native:
                    ep.say(tool_message)
                else:
                    ep.messages.append(tool_message)
                    responses.append(tool_response(result.observation))
            if responses:  # prompt mode: the model reads results as one user turn, as Qwen3 templates do
                ep.wire.append({"role": "user", "content": "\n".join(responses)})
            continue
        ep.say({"role": "assistant", "content": action.text})
        if opts.mode == "conversation":
            answer = await ef.send_message(ep.session_id, action.text)
            ep.steps += 1
            ep.say({"role": "user", "content": answer.reply})
            if answer.done:
                ep.finish_reason = "user_done"
                return
            continue
        if ep.session.turns is not None:  # a turn-based episode: the answer ends the user's turn (BFCL's protocol)
            following = await ef.end_turn(ep.session_id, action.text or None)
            ep.steps += 1
            if following.done:
                ep.finish_reason = "user_done"
                return
            ep.tools += following.new_tools
            message = following.user_message or ""
            if following.new_tools and not native:  # prompt mode: the tools that arrived, before the message
                message = f"{tools_prompt(following.new_tools)}\n\n{message}"
            ep.say({"role": "user", "content": message})
            continue
        ep.finish_reason = "length" if completion.finish_reason == "length" else "stop"
        return


def _score_json(score: Score) -> JSON:
    return {"reward": score.reward, "passed": score.passed, "total": score.total,
            "checks": [{"item": c.item, "passed": c.passed, "error": c.error} for c in score.checks],
            "env_version": score.env_version, "scenario_version": score.scenario_version}


async def _score_or_empty(ef: AsyncClient, ep: Episode) -> JSON:
    try:
        return _score_json(await ef.score(ep.session_id))
    except EnvfoundryError:
        return ep.score


async def select(ef: AsyncClient, scenario_ids: list[str], env_ids: list[str], *, split: str | None = None,
                 tags: Sequence[str] = ()) -> list[str]:
    """The scenarios named, or those the service selects: of the environments named (default: all), in
    ``split`` and carrying every one of ``tags`` when given."""
    if scenario_ids:
        if split is not None or tags:
            raise EnvfoundryError("name scenarios or select them by split and tag, not both")
        for sid in scenario_ids:
            await ef.get_scenario(sid)  # an unknown id fails here, before any episode runs
        return list(dict.fromkeys(scenario_ids))
    chosen: list[str] = []
    envs: list[str | None] = [*env_ids] or [None]  # None: every environment, in one listing
    for env_id in envs:
        chosen.extend([s.scenario_id async for s in ef.iter_scenarios(env_id=env_id, split=split, tags=tags)])
    return list(dict.fromkeys(chosen))


async def rollout(ef: AsyncClient, llm: ChatLLM, scenario_ids: list[str], options: RolloutOptions, out: Path,
                  on_record: Callable[[JSON], None] | None = None,
                  on_start: Callable[[], None] | None = None) -> list[JSON]:
    """Play every scenario ``options.samples`` times; write each record to ``out`` as it finishes."""
    gate = asyncio.Semaphore(options.concurrency)
    records: list[JSON] = []
    lock = asyncio.Lock()
    digest = (await ef.catalog_manifest()).digest
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as sink:

        async def episode(session: Session, session_id: str, sample: int) -> None:
            async with gate:
                if on_start:
                    on_start()
                record = await play(ef, llm, Episode(session, session_id, sample, options, llm.model,
                                                     catalog_digest=digest))
            async with lock:
                sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                sink.flush()
                records.append(record)
                if on_record:
                    on_record(record)

        async def group(scenario_id: str) -> None:
            async with gate:
                session = await ef.create_session(scenario_id, n=options.samples, mode=options.mode)
            await asyncio.gather(*(episode(session, sid, i) for i, sid in enumerate(session.session_ids)))

        # A group that cannot even start (unknown scenario, no user LLM configured) stops the run:
        # the task group cancels the other episodes, and the first cause is raised as it is.
        try:
            async with asyncio.TaskGroup() as tasks:
                for scenario_id in scenario_ids:
                    tasks.create_task(group(scenario_id))
        except BaseExceptionGroup as failed:
            raise _first(failed) from None
    return records


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
