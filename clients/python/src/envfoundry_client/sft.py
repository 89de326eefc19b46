"""Fine-tuning data from rollout records: OpenAI chat messages, or the ShareGPT layout LlamaFactory reads.

A record is kept when its reward reaches ``min_reward`` and it is well formed: every assistant
turn parses (tool calls with JSON-object arguments, no broken ``<tool_call>`` block), every tool
call is answered by its tool message before the next assistant turn, no tool message answers a
call that was not made, and the conversation ends with an assistant message that calls no tool
(a simulated user's closing words after it are dropped). Each dropped record counts under the
first reason that applies.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from envfoundry_client.actions import parse_action
from envfoundry_client.models import JSON

Format = Literal["openai", "sharegpt"]


class Rejected(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class ExportReport:
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)

    def lines(self) -> list[str]:
        out = [f"kept {self.kept}, dropped {sum(self.dropped.values())}"]
        out += [f"  dropped {n}: {reason}" for reason, n in sorted(self.dropped.items())]
        return out


def well_formed(messages: list[JSON]) -> list[JSON]:
    """The messages to train on (trailing user turns removed). Raises ``Rejected`` with the reason."""
    trimmed = list(messages)
    while trimmed and trimmed[-1].get("role") == "user":
        trimmed.pop()
    pending: set[str] = set()
    for m in trimmed:
        role = m.get("role")
        if role == "assistant":
            if pending:
                raise Rejected("unanswered_tool_call")
            action = parse_action(m)
            if action.error is not None:
                raise Rejected("unparsable_assistant_turn")
            if action.calls and not m.get("tool_calls"):  # a call written in text that was never made
                raise Rejected("tool_call_left_in_text")
            pending = {str(c.get("id")) for c in m.get("tool_calls") or []}
        elif role == "tool":
            call_id = str(m.get("tool_call_id"))
            if call_id not in pending:
                raise Rejected("tool_message_without_call")
            pending.discard(call_id)
        elif role in ("user", "system"):
            if pending:
                raise Rejected("unanswered_tool_call")
        else:
            raise Rejected("unknown_role")
    if pending:
        raise Rejected("unanswered_tool_call")
    last = trimmed[-1] if trimmed else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        raise Rejected("not_ended_by_assistant")
    return trimmed


def to_openai(messages: list[JSON], tools: list[JSON]) -> JSON:
    out: list[JSON] = []
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            out.append({"role": "assistant", "content": m.get("content"), "tool_calls": m["tool_calls"]})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return {"messages": out, "tools": tools}


def to_sharegpt(messages: list[JSON], tools: list[JSON]) -> JSON:
    """``conversations`` alternating human/observation and gpt/function_call turns, ``system``, and
    ``tools`` as a JSON string of function schemas. Parallel calls are one function_call turn holding
    a JSON list, and their results one observation turn (one result per line)."""
    system = ""
    turns: list[JSON] = []
    results: list[str] = []
    for m in messages:
        role = m["role"]
        if role == "tool":
            results.append(str(m["content"]))
            continue
        if results:
            turns.append({"from": "observation", "value": "\n".join(results)})
            results = []
        if role == "system":
            system = str(m.get("content") or "")
        elif role == "user":
            turns.append({"from": "human", "value": str(m.get("content") or "")})
        elif m.get("tool_calls"):
            calls = parse_action(m).calls
            shaped = [{"name": c.name, "arguments": c.arguments} for c in calls]
            turns.append({"from": "function_call",
                          "value": json.dumps(shaped[0] if len(shaped) == 1 else shaped, ensure_ascii=False)})
        else:
            turns.append({"from": "gpt", "value": str(m.get("content") or "")})
    for i, turn in enumerate(turns):  # LlamaFactory requires user-side turns at even places, model-side at odd
        if (turn["from"] in ("human", "observation")) != (i % 2 == 0):
            raise Rejected("turns_do_not_alternate")
    functions = [t.get("function", t) for t in tools]
    return {"conversations": turns, "system": system, "tools": json.dumps(functions, ensure_ascii=False)}


def export(records: Iterable[Any], fmt: Format, min_reward: float | None = None) -> tuple[list[JSON], ExportReport]:
    """Convert rollout records; returns the examples and how many were kept and dropped, and why."""
    report = ExportReport()
    examples: list[JSON] = []
    for record in records:
        try:
            if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
                raise Rejected("not_a_rollout_record")
            reward = record.get("reward")
            if min_reward is not None and (reward is None or float(reward) < min_reward):
                raise Rejected("reward_below_minimum")
            if record.get("finish_reason") in ("llm_error", "service_error"):
                raise Rejected("episode_failed")
            messages = well_formed(record["messages"])
            tools = list(record.get("tools") or [])
            examples.append(to_openai(messages, tools) if fmt == "openai" else to_sharegpt(messages, tools))
            report.kept += 1
        except Rejected as exc:
            report.dropped[exc.reason] += 1
    return examples, report


def read_jsonl(text: str) -> list[Any]:
    """Records of a JSONL file; a line that is not JSON becomes ``None`` (dropped as not a record)."""
    out: list[Any] = []
    for line in text.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                out.append(None)
    return out
