"""What the service hands the pool for a request and gets back: an environment's code, a session's
stored state, a call's outcome; and a worker's answer or error decoded into them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sandbox.errors import RequestFailed
from sandbox.state.view import Diff, no_diff


@dataclass(frozen=True)
class EnvCode:
    """What a worker needs to compile an environment; ``key`` is the code hash (with the layers).
    ``layers``: the package folders its host puts on ``sys.path`` (under ``Limits.layers_root``)."""

    key: str
    env_id: str
    class_name: str
    code: str
    layers: tuple[str, ...] = ()


@dataclass
class CallOutcome:
    ok: bool
    result: Any
    error: dict[str, str] | None
    state: str | None  # new encoded state, or None when the call changed nothing (or sent a delta)
    diff: Diff
    delta: dict[str, Any] | None = None  # the parts it changed, against the session's base (see sandbox.state.deltas)
    rebase: bool = False  # ``state`` is to be the session's new base (its delta had grown)


@dataclass(frozen=True)
class NeedState:
    """A session call that needs the session's stored state: no process holds it live at the step."""


NEED_STATE_ANSWER = NeedState()


@dataclass
class Stored:
    """A session's stored state, and its delta when it is kept as a base plus a delta."""

    text: str
    delta: dict[str, str] | None = None
    # When the state is a base plus ``delta`` and the base is a template's initial state: its key,
    # config and digest. A worker holding that template rebuilds the session as a fork of it with
    # the delta applied, instead of decoding ``text``.
    template: str | None = None
    init_config: dict[str, Any] | None = None
    base: str = ""


def outcome(answer: dict[str, Any]) -> CallOutcome:
    """A checked answer (``answers.checked``) as the outcome of the call."""
    failure = answer.get("error")
    if failure is not None:
        return CallOutcome(False, None, {"type": failure["type"], "message": failure["message"]}, None, no_diff())
    return CallOutcome(True, answer.get("result"), None, answer.get("state"), answer["diff"], answer.get("delta"),
                       answer.get("rebase") is True)


def request_failed(reported: Any) -> RequestFailed:
    """An error a worker reported; malformed ones (environment code can forge answers) become sandbox errors."""
    if isinstance(reported, dict) and isinstance(reported.get("type"), str) and isinstance(reported.get("message"), str):
        return RequestFailed(reported["type"], reported["message"][:2000])
    return RequestFailed("sandbox_error", "the sandbox sent a malformed error")


def randomness(stream: str | None, seed: int | None) -> dict[str, Any]:
    """The request fields naming a session's randomness (``frames.Init``)."""
    fields: dict[str, Any] = {}
    if stream is not None:
        fields["random"] = stream
    if seed is not None:
        fields["seed"] = seed
    return fields
