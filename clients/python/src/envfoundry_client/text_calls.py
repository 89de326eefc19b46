"""Tool calls a model wrote as text (``<tool_call>`` blocks) instead of native ``tool_calls``.

A model served without a tool parser (or trained on a chat template whose calls are text) answers
with its calls in the content. verifiers' renderers read the two forms its Qwen parsers know, and
this reads them the same way, from the text instead of token ids:

- Hermes JSON: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- XML: ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>``, each
  value read as JSON when it is JSON, else kept as its text.

What comes before the first block is the message's content. A block that cannot be read (not JSON,
no name, no ``<function=...>``, never closed) is kept with the reason, so the model is told why
instead of its call being dropped in silence.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
FUNCTION = re.compile(r"<function=([^>]+)>")
PARAMETER = re.compile(r"<parameter=([^>]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


@dataclass(frozen=True)
class TextCall:
    """One block: a call (``name`` and ``arguments``), or ``problem`` saying why it is not one."""

    raw: str
    name: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None


def parse(text: str) -> tuple[str, list[TextCall]]:
    """The content before the first ``<tool_call>`` and each block's call, in order."""
    start = text.find(OPEN)
    if start == -1:
        return text, []
    calls: list[TextCall] = []
    at = start
    while (at := text.find(OPEN, at)) != -1:
        end = text.find(CLOSE, at + len(OPEN))
        if end == -1:
            calls.append(TextCall(text[at + len(OPEN):].strip(), problem="the <tool_call> block is never closed"))
            break
        calls.append(_block(text[at + len(OPEN):end]))
        at = end + len(CLOSE)
    return text[:start], calls


def _block(body: str) -> TextCall:
    raw = body.strip()
    if raw.startswith("{"):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as exc:
            return TextCall(raw, problem=f"the call is not valid JSON ({exc.msg} at character {exc.pos})")
        name = parsed.get("name") if isinstance(parsed, dict) else None
        arguments = parsed.get("arguments", {}) if isinstance(parsed, dict) else {}
        if isinstance(arguments, str):  # (some models write the arguments as a JSON string, as the API does)
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return TextCall(raw, problem="the call's arguments are not a JSON object")
        if not isinstance(name, str) or not name:
            return TextCall(raw, problem='the call has no "name"')
        if not isinstance(arguments, dict):
            return TextCall(raw, problem="the call's arguments are not a JSON object")
        return TextCall(raw, name, arguments)
    function = FUNCTION.search(body)
    if function is None:
        return TextCall(raw, problem='the call is neither JSON nor <function=NAME> with <parameter=KEY> parts')
    arguments = {}
    for match in PARAMETER.finditer(body):
        value = match.group(2).strip()
        try:
            arguments[match.group(1)] = json.loads(value)
        except ValueError:
            arguments[match.group(1)] = value
    return TextCall(raw, function.group(1).strip(), arguments)
