"""What an answer from a process that ran environment code may pass on to the service.

Such an answer may be forged: a field of the worker's own (``unhealthy``), a result over its
limit, a state the service could not read back. ``checked`` is the one place it is judged, by
whichever process reads it from the environment's process: the worker for a request it serves,
the service for a call it sends straight to a session's process (see ``sandbox.lane``).

``ToolError`` names every error type a tool call may answer (the API contract's list).

Standard library only: the worker imports this module.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any, TypeGuard

from sandbox.state import deltas
from sandbox.state.view import Diff, cut_diff
from sandbox.wire import protocol
from sandbox.wire.limits import DEFAULTS


class ToolError(enum.StrEnum):
    """The error types of a tool call's answer, as the API contract lists them."""

    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    TOOL_EXCEPTION = "tool_exception"
    TIMEOUT = "timeout"
    RESOURCE_LIMIT = "resource_limit"
    SANDBOX_ERROR = "sandbox_error"


CALL_ERRORS = frozenset(e.value for e in ToolError)
# Errors raised before environment code ran: the session's process still holds what is stored.
UNTOUCHED = frozenset({ToolError.UNKNOWN_TOOL.value, ToolError.INVALID_ARGUMENTS.value})
# A request naming a template leaves its ``init_config`` out (a scenario's may be megabytes, and
# the worker holding the template built needs none of it); a worker or process that would have
# to build the instance after all answers this, and the service sends the request again with it.
NEED_CONFIG = "need_config"
# A call of a session that leaves its state out, to a worker holding no live instance of that
# session at the step named; the service sends it again with the stored state.
NEED_STATE = "need_state"
# A session call's answer field (the worker's): the session is live in a lodge, a process holding
# many sessions' instances (see ``sandbox.worker.lodge``), not in a process of its own.
LODGED = "lodged"
# Room for the JSON around a call's state and result, beyond their own limits.
FRAME_SLACK = 1 << 20


def answer_cap(request: Mapping[str, Any]) -> int:
    """The most bytes an answer to ``request`` may take."""
    return int(request.get("max_state_bytes", DEFAULTS.state_bytes)) \
        + int(request.get("max_result_bytes", DEFAULTS.result_bytes)) + FRAME_SLACK


def error(kind: str, message: str) -> dict[str, Any]:
    return {"type": kind, "message": message}


def malformed() -> dict[str, Any]:
    return {"error": error(ToolError.SANDBOX_ERROR.value, "the call process sent a malformed answer")}


def untouched(answer: dict[str, Any]) -> bool:
    """Whether the process that sent ``answer`` still holds what is stored: it succeeded, or failed
    before environment code ran (the process applies the same rule and exits otherwise)."""
    failure = answer.get("error")
    return failure is None or isinstance(failure, dict) and failure.get("type") in UNTOUCHED


def checked(op: str, answer: dict[str, Any], request: Mapping[str, Any], *, bounded: bool = False) -> dict[str, Any]:
    """Only the fields of ``op`` of ``answer``, of the right types and within ``request``'s limits
    (``max_result_bytes``, ``max_state_bytes``, ``max_diff_bytes``); an error answer otherwise.
    An init from a template may leave out the state the service said it ``known``s by its digest.
    ``bounded``: ``answer`` was decoded by ``protocol.decode_bounded``, so what it holds nests no
    deeper than the limit either."""
    failure = answer.get("error")
    if failure is not None:
        if isinstance(failure, dict) and type(failure.get("type")) is str and type(failure.get("message")) is str:
            return {"error": error(failure["type"][:100], failure["message"][:4000])}
        return malformed()
    state_limit = int(request.get("max_state_bytes", DEFAULTS.state_bytes))
    if op == "init":
        digest, known = answer.get("digest"), request.get("known")
        if type(known) is str and answer.get("state") is None and digest == known:
            return {"state": None, "digest": known}
        state = answer.get("state")
        if not isinstance(state, str) or not readable(state):
            return malformed()
        problem = state_problem(state, state_limit)
        if problem:
            return sent(f"the init process sent {problem}")
        return {"state": state, **({"digest": digest[:64]} if type(digest) is str else {})}
    if op == "validate":
        found = answer.get("failure")
        if answer.get("ok") is True:
            return {"ok": True}
        if isinstance(found, dict) and type(found.get("kind")) is str and type(found.get("message")) is str:
            return {"ok": False, "failure": {"kind": found["kind"][:100], "message": found["message"][:4000]}}
        return malformed()
    state, diff, result = answer.get("state"), answer.get("diff"), answer.get("result")
    if answer.get("ok") is not True or not (state is None or readable(state)) or not isinstance(diff, dict) \
            or not is_diff(diff):
        return malformed()
    if not bounded and (not protocol.depth_within(result) or not protocol.depth_within(diff)):
        return sent(f"the call process sent a result nested deeper than {protocol.MAX_DEPTH} levels")
    size = len(protocol.unicode_json(result).encode())
    limit = int(request.get("max_result_bytes", DEFAULTS.result_bytes))
    if size > limit:
        return sent(f"the call process sent a result of {size} bytes, over the {limit} byte limit")
    checked = {"ok": True, "result": result, "error": None, "state": state,
               "diff": bounded_diff(diff, int(request.get("max_diff_bytes", 0)))}
    delta = answer.get("delta")
    if state is not None:
        problem = state_problem(state, state_limit)
        if problem:
            return sent(f"the call process sent {problem}")
        if answer.get("rebase") is True:
            checked["rebase"] = True
    elif delta is not None and request.get("deltas") is True:
        problem = deltas.problem(delta, state_limit)
        if problem:
            return sent(f"the call process sent {problem}")
        checked["delta"] = delta
    return checked


def sent(message: str) -> dict[str, Any]:
    return {"error": error(ToolError.SANDBOX_ERROR.value, message)}


def state_problem(text: str, limit: int) -> str | None:
    size = len(text.encode())
    if size > limit:
        return f"a state of {size} bytes, over the {limit} byte limit"
    return None


def is_diff(value: Any) -> TypeGuard[Diff]:
    return isinstance(value, dict) and all(isinstance(value.get(k), list) for k in ("added", "removed", "changed"))


def bounded_diff(diff: Diff, limit: int) -> Diff:
    """The diff, or its summary when its JSON passes ``limit`` bytes (0: no limit): the service
    would only cut it on its event loop, after decoding and walking it there."""
    if not limit or not (diff["added"] or diff["removed"] or diff["changed"]):
        return diff
    size = len(json.dumps(diff, ensure_ascii=False))
    if size <= limit:
        return diff
    return cut_diff(size)


def readable(state: Any) -> bool:
    """Whether a state a fork sent is text the service can store and read back: a JSON object (the
    decoder's own recursion limit bounds its depth). Whether the codec's tags in it make sense is
    the session's own affair: a view shows a tag it cannot read as ``{"$truncated": "invalid"}``,
    and the session's next call fails as a sandbox error; no other session reads it."""
    if type(state) is not str:
        return False
    try:
        return isinstance(json.loads(state), dict)
    except (ValueError, RecursionError):
        return False
