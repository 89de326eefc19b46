"""Reading what an agent produced: OpenAI tool calls (objects or JSON text), text holding
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks as Qwen3-family models write
them, or a plain message. One parser for the Gymnasium adapter, the rollout runner and export.

A malformed action is a value (``Action.error``), never an exception: the agent is told what was
wrong and may try again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from envfoundry_client.models import JSON

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: JSON
    call_id: str | None = None


@dataclass(frozen=True)
class Action:
    """Tool calls to make (maybe none), the text around them, or why the action could not be read."""

    calls: list[ParsedCall] = field(default_factory=list)
    text: str = ""
    error: str | None = None

    @property
    def is_message(self) -> bool:
        return self.error is None and not self.calls


def parse_action(action: Any) -> Action:
    """Read an action of any accepted shape (see the module docstring)."""
    if isinstance(action, str):
        stripped = action.strip()
        if stripped[:1] in ("{", "[") and OPEN not in stripped:
            try:
                decoded = json.loads(stripped)
            except json.JSONDecodeError:
                return Action(text=action)  # prose that happens to start with a brace is a message
            if _looks_like_calls(decoded):
                return parse_action(decoded)
            return Action(text=action)
        return parse_text(action)
    if isinstance(action, list):
        return _calls(action, "")
    if isinstance(action, dict):
        if "tool_calls" in action or "role" in action:  # a whole assistant message
            content = action.get("content")
            text = content if isinstance(content, str) else ""
            tool_calls = action.get("tool_calls") or []
            if not isinstance(tool_calls, list):
                return Action(text=text, error="tool_calls must be a list")
            if not tool_calls:
                return parse_text(text)
            return _calls(tool_calls, text)
        return _calls([action], "")
    return Action(error=f"an action is a tool call, a list of them, or text; got {type(action).__name__}")


def parse_text(text: str) -> Action:
    """Text with zero or more ``<tool_call>`` blocks. The text outside the blocks is kept."""
    found: list[Any] = []
    for n, match in enumerate(_BLOCK.finditer(text), 1):
        body = match.group(1).strip()
        try:
            found.append(json.loads(body))
        except json.JSONDecodeError as exc:
            return Action(text=text, error=f"tool call {n} is not valid JSON ({exc.msg} at position {exc.pos}): "
                                           f"{body[:200]}")
    rest = _BLOCK.sub("", text)
    if OPEN in rest or CLOSE in rest:
        return Action(text=text, error=f"a {OPEN} block is not closed (or a {CLOSE} has no opening tag)")
    rest = rest.strip()
    if not found:
        return Action(text=rest)
    return _calls(found, rest)


def _looks_like_calls(value: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(isinstance(i, dict) and ("name" in i or "function" in i or "tool_calls" in i)
                               for i in items)


def _calls(items: list[Any], text: str) -> Action:
    calls: list[ParsedCall] = []
    for n, item in enumerate(items, 1):
        call, error = parse_call(item)
        if call is None:
            return Action(text=text, error=f"tool call {n}: {error}")
        calls.append(call)
    return Action(calls, text)


def parse_call(item: Any) -> tuple[ParsedCall | None, str]:
    """One tool call from ``{"type": "function", "function": {...}}`` or ``{"name", "arguments"}``."""
    if not isinstance(item, dict):
        return None, f"expected an object, got {type(item).__name__}"
    call_id = item.get("id") if isinstance(item.get("id"), str) else None
    inner: Any = item.get("function") if isinstance(item.get("function"), dict) else item
    name = inner.get("name")
    if not isinstance(name, str) or not name:
        return None, 'it has no "name"'
    raw = inner.get("arguments", inner.get("parameters", {}))
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            return None, f"the arguments of {name} are not valid JSON ({exc.msg})"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return None, f"the arguments of {name} must be a JSON object, got {type(raw).__name__}"
    return ParsedCall(name, raw, call_id), ""


def openai_tool_call(call: ParsedCall, call_id: str) -> JSON:
    """The OpenAI chat shape of a call (arguments as a JSON string, as the API carries them)."""
    return {"id": call_id, "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}


def render_call(call: ParsedCall) -> str:
    """A call as a ``<tool_call>`` block, the form prompt-mode models are asked to write."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def tools_prompt(tools: list[JSON]) -> str:
    """System-prompt text that lists the tools and asks for ``<tool_call>`` blocks (prompt mode)."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False, sort_keys=True) for t in tools)
    return ("# Tools\n\nThese functions are available. Their JSON schemas are listed between <tools> and </tools>:\n"
            f"<tools>\n{listing}\n</tools>\n\n"
            "To call a function, write one block per call, each holding a JSON object with the function's name "
            "and its arguments:\n"
            f'{OPEN}\n{{"name": "function_name", "arguments": {{"argument": "value"}}}}\n{CLOSE}\n'
            "The results come back between <tool_response> and </tool_response>. "
            "Answer without any block when you are done.")


def tool_response(observation: str) -> str:
    return f"<tool_response>\n{observation}\n</tool_response>"
