"""Request and response bodies of REST API v1: the public contract."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
ErrorType = Literal[
    "unknown_tool", "invalid_arguments", "tool_exception", "timeout", "resource_limit", "sandbox_error"
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- environments -----------------------------------------------------------------------------
class EnvironmentSummary(BaseModel):
    env_id: str
    class_name: str
    summary: str
    tool_count: int
    scenario_count: int


class EnvironmentList(BaseModel):
    environments: list[EnvironmentSummary]


class EnvironmentDetail(BaseModel):
    env_id: str
    class_name: str
    summary: str
    introduction: str
    rules: list[str]
    tools: list[dict[str, Any]] = Field(description="OpenAI function-calling tool schemas.")


class EnvironmentCreate(Strict):
    env_id: str = Field(pattern=ID_PATTERN)
    class_name: str = Field(pattern=IDENTIFIER)
    code: str = Field(min_length=1, max_length=1 << 20)
    summary: str = ""
    introduction: str = ""
    rules: list[str] = Field(default_factory=list)


# -- scenarios --------------------------------------------------------------------------------
class CheckItem(Strict):
    item: str
    check: str = Field(description="Source defining check_func(final_state) -> bool.")


class ToolCallSpec(Strict):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScenarioSummary(BaseModel):
    scenario_id: str
    env_id: str
    task: str


class ScenarioList(BaseModel):
    scenarios: list[ScenarioSummary]


class ScenarioDetail(BaseModel):
    scenario_id: str
    env_id: str
    task: str
    init_config: dict[str, Any]
    checklist: list[CheckItem]
    reference_solution: list[ToolCallSpec] | None = None


class ScenarioCreate(Strict):
    scenario_id: str | None = Field(default=None, pattern=ID_PATTERN)
    env_id: str
    task: str
    init_config: dict[str, Any] = Field(default_factory=dict)
    checklist: list[CheckItem] = Field(default_factory=list)
    reference_solution: list[ToolCallSpec] | None = None


# -- sessions ---------------------------------------------------------------------------------
class SessionCreate(Strict):
    scenario_id: str | None = None
    env_id: str | None = None
    init_config: dict[str, Any] | None = None

    @model_validator(mode="after")
    def one_source(self) -> SessionCreate:
        if (self.scenario_id is None) == (self.env_id is None):
            raise ValueError("give exactly one of scenario_id or env_id")
        if self.scenario_id is not None and self.init_config is not None:
            raise ValueError("init_config goes with env_id; a scenario brings its own")
        return self


class SessionCreated(BaseModel):
    session_id: str
    env_id: str
    scenario_id: str | None
    task: str | None
    introduction: str
    rules: list[str]
    tools: list[dict[str, Any]]


class SessionInfo(BaseModel):
    session_id: str
    env_id: str
    scenario_id: str | None
    parent_id: str | None = Field(description="The session this one was forked from.")
    steps: int
    created_at: datetime
    expires_at: datetime


class ToolList(BaseModel):
    tools: list[dict[str, Any]]


class ToolCallRequest(Strict):
    name: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any] | str = Field(
        default_factory=dict, description="An object, or the JSON-encoded string an OpenAI tool call carries."
    )


class CallError(BaseModel):
    type: ErrorType
    message: str


class CallResult(BaseModel):
    step: int
    ok: bool
    result: Any = None
    error: CallError | None = None
    observation: str


class StateView(BaseModel):
    step: int
    state: dict[str, Any]


class StateDiff(BaseModel):
    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    changed: list[dict[str, Any]]


class Step(BaseModel):
    step: int
    name: str
    arguments: Any
    ok: bool
    result: Any = None
    error: CallError | None = None
    observation: str
    diff: StateDiff


class Trajectory(BaseModel):
    steps: list[Step]


class CheckResult(BaseModel):
    item: str
    passed: bool
    error: str | None


class Score(BaseModel):
    reward: float | None = Field(description="passed / total; null when the session has no checks.")
    passed: int
    total: int
    checks: list[CheckResult]


class Health(BaseModel):
    status: str


class Problem(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, str]] | None = None
