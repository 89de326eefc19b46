"""Turn-based episodes: the turn a session is in, ending it, and a score per turn.

A turn-based scenario scripts the user's messages: the session shows the first, the agent works on
it, then ends the turn (``Client.end_turn``) and gets the next message with any tools that arrive
with it, until ``done``. Each turn's checks run when it ends; ``Client.score`` then reports them per
turn (``Score.turns`` is ``None`` for other sessions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envfoundry_client.models import JSON, CheckResult


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class TurnView:
    """Where a turn-based session is: the turn in progress (``None`` once ``done``), its user message and tools."""

    turn: int | None
    turns: int
    done: bool
    user_message: str | None
    tools: list[JSON] = field(repr=False)

    @classmethod
    def from_json(cls, body: JSON) -> TurnView:
        return cls(_int_or_none(body.get("turn")), int(body["turns"]), bool(body["done"]),
                   _str_or_none(body.get("user_message")), list(body.get("tools") or []))


@dataclass(frozen=True)
class TurnResult:
    """The answer to ending a turn: the next user message and the tools that arrive with it, or ``done``."""

    step: int
    ended_turn: int
    turn: int | None
    turns: int
    done: bool
    user_message: str | None
    new_tools: list[JSON] = field(repr=False)

    @classmethod
    def from_json(cls, body: JSON) -> TurnResult:
        return cls(int(body["step"]), int(body["ended_turn"]), _int_or_none(body.get("turn")), int(body["turns"]),
                   bool(body["done"]), _str_or_none(body.get("user_message")), list(body.get("new_tools") or []))


@dataclass(frozen=True)
class TurnScore:
    """One turn's checks: as they ran when it ended, on the current state (``in_progress``), or failed
    (``not_reached``)."""

    turn: int
    status: str
    passed: bool
    checks: list[CheckResult]

    @classmethod
    def from_json(cls, body: JSON) -> TurnScore:
        return cls(int(body["turn"]), str(body["status"]), bool(body["passed"]),
                   [CheckResult(str(c["item"]), bool(c["passed"]), _str_or_none(c.get("error")))
                    for c in body.get("checks") or []])


def turn_scores(body: JSON) -> list[TurnScore] | None:
    """The per-turn part of a score, None for a session without turns."""
    turns = body.get("turns")
    return None if turns is None else [TurnScore.from_json(t) for t in turns]
