"""A session's step record: what the store keeps of each step, and what clients see of it.

Two kinds: a tool ``call`` and, in conversation mode, a ``message`` to the simulated user. A
call's record also says what it did to the state (``_state``, ``_parts``: see ``service.engine.past``),
which only the service reads; ``public`` is the record as every transport shows it, with the
observation an agent framework shows the model (derived when read, so it is not stored twice).
"""

from __future__ import annotations

import json
from typing import Any, Literal, NotRequired, TypedDict

from sandbox.pool.calls import CallOutcome
from sandbox.state.view import Diff, cut_diff
from sandbox.wire.protocol import unicode_json

PRIVATE = ("_state", "_parts")
TRUNCATED_PART = 1024  # bytes of an argument or result kept whole in a record cut to its bound


class CallStep(TypedDict):
    step: int
    kind: Literal["call"]
    name: str
    arguments: Any
    ok: bool
    result: Any
    error: dict[str, str] | None
    diff: Diff
    observation: NotRequired[str]  # (public only)
    _state: NotRequired[Literal["same", "parts", "whole"]]  # (stored only)
    _parts: NotRequired[dict[str, Any]]


class MessageStep(TypedDict):
    step: int
    kind: Literal["message"]
    content: str
    reply: str
    done: bool


def call_step(step: int, name: str, arguments: Any, outcome: CallOutcome) -> dict[str, Any]:
    """The record of a call, with what it did to the state."""
    record: CallStep = {"step": step, "kind": "call", "name": name, "arguments": arguments, "ok": outcome.ok,
                        "result": outcome.result, "error": outcome.error, "diff": outcome.diff}
    if outcome.delta is not None:
        record["_state"], record["_parts"] = "parts", outcome.delta
    else:
        record["_state"] = "same" if outcome.state is None else "whole"
    return dict(record)


def message_step(step: int, content: str, reply: str, done: bool) -> dict[str, Any]:
    record: MessageStep = {"step": step, "kind": "message", "content": content, "reply": reply, "done": done}
    return dict(record)


def observation(ok: bool, result: Any, error: dict[str, str] | None) -> str:
    """The text an agent framework shows the model for this call."""
    if not ok and error:
        return f"Error ({error['type']}): {error['message']}"
    if isinstance(result, str):
        return result
    return unicode_json(result)


def public(record: dict[str, Any]) -> dict[str, Any]:
    """A stored record as clients see it (records written before ``kind`` existed are calls)."""
    for name in PRIVATE:
        record.pop(name, None)
    if record.setdefault("kind", "call") == "call" and "observation" not in record:
        record["observation"] = observation(record["ok"], record["result"], record["error"])
    return record


def encoded(record: dict[str, Any], limit: int) -> str:
    """The record as stored, within ``limit`` bytes. Over it, what the step changed goes first (a
    past state is then replayed), then the diff is summarised; if the arguments or the result
    still take it over, they are stored as ``{"$truncated": "size", "bytes": n}`` (the answer to
    the call keeps them whole). Encoded once on the hot path, again only when cut."""
    text = json.dumps(record)
    if len(text) <= limit or record.get("kind") != "call":
        return text
    if "_parts" in record:
        record.pop("_parts")
        record["_state"] = "whole"
        text = json.dumps(record)
        if len(text) <= limit:
            return text
    if not record["diff"].get("truncated"):
        record["diff"] = cut_diff(len(json.dumps(record["diff"])))
        text = json.dumps(record)
    if len(text) > limit:
        stored = dict(record)
        for part in ("arguments", "result"):
            size = len(json.dumps(stored[part]))
            if size > TRUNCATED_PART:
                stored[part] = {"$truncated": "size", "bytes": size}
        text = json.dumps(stored)
    return text
