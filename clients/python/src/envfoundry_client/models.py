"""Typed results of API v1. Each ``from_json`` accepts the documented body and nothing looser.

Fields the service added later (``session_ids``, ``mode``, trajectory paging, message steps) have
defaults so that the client also reads answers of a service that predates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

JSON = dict[str, Any]
Mode = Literal["task", "conversation"]
GroupSeeds = Literal["derived", "same"]  # a seeded group's members: seeds derived per member, or one for all


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _mode(value: Any) -> Mode:
    if value is None or value == "task":
        return "task"
    if value == "conversation":
        return "conversation"
    raise ValueError(f"unknown session mode {value!r}")


@dataclass(frozen=True)
class EnvironmentSummary:
    env_id: str
    class_name: str
    summary: str
    tool_count: int
    scenario_count: int

    @classmethod
    def from_json(cls, body: JSON) -> EnvironmentSummary:
        return cls(str(body["env_id"]), str(body["class_name"]), str(body["summary"]), int(body["tool_count"]),
                   int(body["scenario_count"]))


@dataclass(frozen=True)
class Environment:
    env_id: str
    class_name: str
    summary: str
    introduction: str
    rules: list[str]
    tools: list[JSON] = field(repr=False)
    source: str = field(default="", repr=False)
    provenance: JSON | None = field(default=None, repr=False)
    requirements: list[str] = field(default_factory=list)  # packages it declares beyond the standard library
    version: str = ""  # the digest of its content: env_id@version names this version for ever
    label: str | None = None

    @classmethod
    def from_json(cls, body: JSON) -> Environment:
        return cls(str(body["env_id"]), str(body["class_name"]), str(body["summary"]), str(body["introduction"]),
                   [str(r) for r in body["rules"]], list(body["tools"]), str(body.get("source", "")),
                   body.get("provenance"), [str(r) for r in body.get("requirements") or []],
                   str(body.get("version") or ""), _str_or_none(body.get("label")))


@dataclass(frozen=True)
class EnvironmentVersion:
    version: str
    label: str | None
    added_at: float | None  # unix time it was added over the API; None for a loaded catalog's
    latest: bool  # whether the bare env_id names it
    tools: list[str]
    changes: dict[str, list[str]]  # tools added, removed and changed from the version before it

    @classmethod
    def from_json(cls, body: JSON) -> EnvironmentVersion:
        added = body.get("added_at")
        return cls(str(body["version"]), _str_or_none(body.get("label")), None if added is None else float(added),
                   bool(body["latest"]), [str(t) for t in body["tools"]],
                   {str(k): [str(n) for n in v] for k, v in body["changes"].items()})


@dataclass(frozen=True)
class CatalogManifest:
    digest: str  # two services serve the same catalogs exactly when their digests agree
    environments: dict[str, str]  # id -> version
    scenarios: dict[str, str]
    drift: list[str]  # how the loaded folders differ from their lock files

    @classmethod
    def from_json(cls, body: JSON) -> CatalogManifest:
        return cls(str(body["digest"]), {str(k): str(v) for k, v in body["environments"].items()},
                   {str(k): str(v) for k, v in body["scenarios"].items()}, [str(d) for d in body["drift"]])


@dataclass(frozen=True)
class ScenarioSummary:
    scenario_id: str
    env_id: str
    task: str
    split: str | None = None
    tags: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, body: JSON) -> ScenarioSummary:
        return cls(str(body["scenario_id"]), str(body["env_id"]), str(body["task"]), _str_or_none(body.get("split")),
                   tuple(str(t) for t in body.get("tags") or ()))


@dataclass(frozen=True)
class ScenarioPage:
    """One page of a scenario listing: ``next_cursor`` continues it (None on the last page)."""

    scenarios: list[ScenarioSummary]
    total: int
    next_cursor: str | None = None

    @classmethod
    def from_json(cls, body: JSON) -> ScenarioPage:
        return cls([ScenarioSummary.from_json(s) for s in body["scenarios"]],
                   int(body.get("total", len(body["scenarios"]))), _str_or_none(body.get("next_cursor")))


@dataclass(frozen=True)
class CheckItem:
    item: str
    check: str

    def to_json(self) -> JSON:
        return {"item": self.item, "check": self.check}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: JSON = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class Scenario:
    scenario_id: str
    env_id: str
    task: str
    init_config: JSON = field(repr=False)
    checklist: list[CheckItem] = field(repr=False)
    reference_solution: list[ToolCall] | None = field(default=None, repr=False)
    split: str | None = None
    tags: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, body: JSON) -> Scenario:
        solution = body.get("reference_solution")
        return cls(str(body["scenario_id"]), str(body["env_id"]), str(body["task"]), dict(body["init_config"]),
                   [CheckItem(str(c["item"]), str(c["check"])) for c in body["checklist"]],
                   None if solution is None else [ToolCall(str(c["name"]), dict(c.get("arguments") or {}))
                                                  for c in solution],
                   _str_or_none(body.get("split")), tuple(str(t) for t in body.get("tags") or ()))


@dataclass(frozen=True)
class Session:
    """A created (or forked) session group: ``session_ids`` holds all n ids, ``session_id`` the first."""

    session_id: str
    session_ids: list[str]
    env_id: str
    scenario_id: str | None
    task: str | None
    introduction: str
    rules: list[str]
    tools: list[JSON] = field(repr=False)
    mode: Mode = "task"
    user_message: str | None = None
    turn: int | None = None  # turn-based scenarios: the turn in progress (user_message is its message)
    turns: int | None = None  # and how many there are

    @classmethod
    def from_json(cls, body: JSON) -> Session:
        sid = str(body["session_id"])
        ids = [str(i) for i in body.get("session_ids") or [sid]]
        mode = _mode(body.get("mode"))
        turn, turns = body.get("turn"), body.get("turns")
        return cls(sid, ids, str(body["env_id"]), _str_or_none(body.get("scenario_id")), _str_or_none(body.get("task")),
                   str(body["introduction"]), [str(r) for r in body["rules"]], list(body["tools"]), mode,
                   _str_or_none(body.get("user_message")), None if turn is None else int(turn),
                   None if turns is None else int(turns))

    @property
    def prompt(self) -> str:
        """What the agent is first told: the task, in conversation mode the user's opening message, in a
        turn-based episode the turn's message."""
        if self.turns is not None:
            return self.user_message or ""
        return (self.user_message if self.mode == "conversation" else self.task) or ""


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    env_id: str
    scenario_id: str | None
    parent_id: str | None
    steps: int
    created_at: datetime
    expires_at: datetime
    mode: Mode = "task"
    done: bool = False

    @classmethod
    def from_json(cls, body: JSON) -> SessionInfo:
        return cls(str(body["session_id"]), str(body["env_id"]), _str_or_none(body.get("scenario_id")),
                   _str_or_none(body.get("parent_id")), int(body["steps"]), _datetime(body["created_at"]),
                   _datetime(body["expires_at"]), _mode(body.get("mode")), bool(body.get("done", False)))


def _datetime(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class CallError:
    type: str  # unknown_tool, invalid_arguments, tool_exception, timeout, resource_limit, sandbox_error
    message: str


def _call_error(value: Any) -> CallError | None:
    return None if value is None else CallError(str(value["type"]), str(value["message"]))


@dataclass(frozen=True)
class CallResult:
    """One tool call. ``ok``: the tool ran and answered, a refusal (``{"success": False, ...}``) included,
    which is in ``result``; ``ok`` false: the call produced no answer and ``error`` says why. Neither is
    a service error (those raise)."""

    step: int
    ok: bool
    result: Any
    error: CallError | None
    observation: str

    @classmethod
    def from_json(cls, body: JSON) -> CallResult:
        return cls(int(body["step"]), bool(body["ok"]), body.get("result"), _call_error(body.get("error")),
                   str(body["observation"]))


@dataclass(frozen=True)
class MessageReply:
    """The simulated user's answer to one agent message; ``done`` once the user ended the conversation."""

    step: int
    reply: str
    done: bool

    @classmethod
    def from_json(cls, body: JSON) -> MessageReply:
        return cls(int(body["step"]), str(body["reply"]), bool(body["done"]))


@dataclass(frozen=True)
class StateView:
    step: int
    state: JSON

    @classmethod
    def from_json(cls, body: JSON) -> StateView:
        return cls(int(body["step"]), dict(body["state"]))


@dataclass(frozen=True)
class CallStep:
    step: int
    name: str
    arguments: Any
    ok: bool
    result: Any
    error: CallError | None
    observation: str
    diff: JSON
    kind: Literal["call"] = "call"


@dataclass(frozen=True)
class MessageStep:
    step: int
    content: str
    reply: str
    done: bool
    kind: Literal["message"] = "message"


@dataclass(frozen=True)
class TurnStep:
    """The end of a turn of a turn-based episode, with its checks as they ran then."""

    step: int
    turn: int
    content: str | None
    checks: list[CheckResult]
    done: bool
    kind: Literal["turn"] = "turn"


Step = CallStep | MessageStep | TurnStep


def step_from_json(body: JSON) -> Step:
    if body.get("kind", "call") == "message":
        return MessageStep(int(body["step"]), str(body["content"]), str(body["reply"]), bool(body["done"]))
    if body.get("kind") == "turn":
        return TurnStep(int(body["step"]), int(body["turn"]), _str_or_none(body.get("content")),
                        [CheckResult(str(c["item"]), bool(c["passed"]), _str_or_none(c.get("error")))
                         for c in body.get("checks") or []], bool(body["done"]))
    return CallStep(int(body["step"]), str(body["name"]), body.get("arguments"), bool(body["ok"]), body.get("result"),
                    _call_error(body.get("error")), str(body["observation"]), dict(body["diff"]))


@dataclass(frozen=True)
class TrajectoryPage:
    steps: list[Step]
    total: int
    offset: int

    @classmethod
    def from_json(cls, body: JSON) -> TrajectoryPage:
        steps = [step_from_json(s) for s in body["steps"]]
        return cls(steps, int(body.get("total", len(steps))), int(body.get("offset", 0)))


@dataclass(frozen=True)
class CheckResult:
    item: str
    passed: bool
    error: str | None


if TYPE_CHECKING:
    from envfoundry_client.turns import TurnScore


@dataclass(frozen=True)
class Score:
    reward: float | None  # passed / total; None when the session has no checks; turn-based: see aggregation
    passed: int
    total: int
    checks: list[CheckResult]
    env_version: str | None = None  # the environment version the session ran
    scenario_version: str | None = None  # the scenario version whose checks scored it
    # Turn-based scenarios (None otherwise): how reward is made of the turns ("all_turns": every turn
    # must pass), each turn's checks, and the fraction of turns passed.
    aggregation: str | None = None
    turns: list[TurnScore] | None = None
    partial_credit: float | None = None

    @classmethod
    def from_json(cls, body: JSON) -> Score:
        from envfoundry_client.turns import turn_scores

        reward, partial = body.get("reward"), body.get("partial_credit")
        return cls(None if reward is None else float(reward), int(body["passed"]), int(body["total"]),
                   [CheckResult(str(c["item"]), bool(c["passed"]), _str_or_none(c.get("error")))
                    for c in body["checks"]], _str_or_none(body.get("env_version")),
                   _str_or_none(body.get("scenario_version")), _str_or_none(body.get("aggregation")),
                   turn_scores(body), None if partial is None else float(partial))
