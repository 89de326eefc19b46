"""Request and response bodies of REST API v1: the public contract."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandbox.wire.answers import ToolError
from service.catalog.model import LABEL_PATTERN, MAX_TAGS, MAX_TURNS
from service.catalog.versions import LABEL_PATTERN as VERSION_LABEL

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# The tool-error types of the contract, as ``sandbox.wire.answers.ToolError`` defines them (spelled out
# so that type checkers see them; the assertion keeps the two lists one).
ErrorType = Literal["unknown_tool", "invalid_arguments", "tool_exception", "timeout", "resource_limit",
                    "sandbox_error"]
assert get_args(ErrorType) == tuple(kind.value for kind in ToolError), "ErrorType must list ToolError's values"


VERSION_MEANING = ("The digest of its code, tools, rules and requirements: env_id@<digest or a prefix of 6 or "
                   "more> names this version for ever.")
SCENARIO_VERSION_MEANING = ("The digest of its environment id, initial state, task, checks and reference solution: "
                            "scenario_id@<digest prefix> names this version for ever.")


class EnvironmentVersion(BaseModel):
    version: str = Field(description=VERSION_MEANING)
    label: str | None
    added_at: float | None = Field(description="When it was added over the API (unix time); null for a loaded "
                                                "catalog's.")
    latest: bool = Field(description="Whether the bare env_id names it.")
    tools: list[str]
    changes: dict[str, list[str]] = Field(description="Tools added, removed and changed (description or parameters) "
                                                      "from the version before it.")


class CatalogManifest(BaseModel):
    digest: str = Field(description="One digest of every version below: two services serve the same catalogs "
                                    "exactly when theirs agree.")
    environments: dict[str, str] = Field(description="The version of each environment the loaded catalogs serve.")
    scenarios: dict[str, str] = Field(description="The version of each scenario the loaded catalogs serve.")
    drift: list[str] = Field(description="How the loaded folders differ from their lock files "
                                         "(envfoundry catalog lock); empty when they agree or have none.")


class EnvironmentVersions(BaseModel):
    env_id: str
    versions: list[EnvironmentVersion] = Field(description="Oldest first.")


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
    source: str = Field(description="The class source (it runs only in sandbox workers).")
    provenance: dict[str, Any] | None = Field(
        default=None, description="What synthesis recorded about the environment (its assessment), if it made it."
    )
    requirements: list[str] = Field(default_factory=list, description="Packages it declares (see "
                                    "EnvironmentCreate.requirements).")
    version: str = Field(default="", description=VERSION_MEANING)
    label: str | None = Field(default=None, description="The name its adder gave this version, if any.")


# Bounds on what clients submit; each is named in the 422 that enforces it.
MAX_TEXT = 64 * 1024
MAX_RULES = 100
MAX_CHECKS = 100
MAX_SOLUTION_CALLS = 1000


class EnvironmentCreate(Strict):
    env_id: str = Field(pattern=ID_PATTERN, description=(
        "Its id. Other code under an existing id is that id's new, latest version; the earlier ones stay "
        "servable as env_id@<version> and the sessions made from them go on with them."))
    label: str | None = Field(default=None, pattern=VERSION_LABEL, description=(
        "A name for this version, unique under the id (env_id@label names it)."))
    class_name: str = Field(pattern=IDENTIFIER)
    code: str = Field(min_length=1, max_length=1 << 20)
    summary: str = Field(default="", max_length=MAX_TEXT)
    introduction: str = Field(default="", max_length=MAX_TEXT)
    rules: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=MAX_RULES)
    requirements: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=list, max_length=32, description="Packages the code imports beyond the standard library "
        "(PEP 508: 'mpmath==1.3.0', 'pydantic>=2.7,<3'); each must be allowed by the service "
        "(ENVFOUNDRY_ALLOWED_REQUIREMENTS), which installs them once into a read-only layer only this "
        "environment's sandbox processes see.")


# -- scenarios --------------------------------------------------------------------------------
class CheckItem(Strict):
    item: str = Field(max_length=4096)
    check: str = Field(max_length=MAX_TEXT, description="Source defining check_func(final_state) -> bool.")
    kind: Literal["change", "keep"] | None = Field(default=None, description=(
        "'change': a state the agent must bring about (it should fail on the initial state); 'keep': one it "
        "must leave as it was (it passes on the initial state too). Optional; `catalog validate` uses it."))


class ToolCallSpec(Strict):
    name: str = Field(max_length=256)
    arguments: dict[str, Any] = Field(default_factory=dict)


class TurnSpec(Strict):
    message: str = Field(max_length=64 * 1024, description="The user's message that opens the turn.")
    tools: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=256, description=(
        "Tools that become available from this turn on (before it, calling one is an unknown_tool failure). "
        "Tools no turn names are available from the start."))
    checklist: list[CheckItem] = Field(default_factory=list, max_length=100, description=(
        "Checks run when the agent ends the turn, on the state and on the turn's responses: besides "
        "initial_state, check_func sees the global turn_responses = {turn, calls: [{name, arguments, ok, "
        "result, error}], message} (the turn's calls, failed ones too, and the agent's closing message)."))
    reference_solution: list[ToolCallSpec] | None = Field(default=None, max_length=1000,
                                                          description="The turn's part of a solution.")


TURNS_MEANING = ("A turn-based scenario's user turns, in order: sessions show the first, the agent ends each with "
                 "POST /v1/sessions/{id}/turns, and each turn's checks run when it ends. Null: the task is given "
                 "at once.")
SPLIT_MEANING = "The benchmark split the scenario belongs to (e.g. 'test', 'train', a BFCL category), if any."
TAGS_MEANING = "Labels to select scenarios by (e.g. a benchmark and its domain)."
Label = Annotated[str, Field(pattern=LABEL_PATTERN)]


class ScenarioSummary(BaseModel):
    scenario_id: str
    env_id: str
    task: str
    split: str | None = Field(default=None, description=SPLIT_MEANING)
    tags: list[str] = Field(default_factory=list, description=TAGS_MEANING)


class ScenarioList(BaseModel):
    scenarios: list[ScenarioSummary] = Field(description="This page, by scenario id.")
    total: int = Field(description="Scenarios matching the filters, on every page.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
    next: str | None = Field(description="The next page's path and query (the same filters and limit); null on "
                             "the last page.")


class ScenarioDetail(BaseModel):
    scenario_id: str
    env_id: str
    task: str
    init_config: dict[str, Any]
    checklist: list[CheckItem]
    reference_solution: list[ToolCallSpec] | None = None
    split: str | None = Field(default=None, description=SPLIT_MEANING)
    tags: list[str] = Field(default_factory=list, description=TAGS_MEANING)
    turns: list[TurnSpec] | None = Field(default=None, description=TURNS_MEANING)
    version: str = Field(default="", description=SCENARIO_VERSION_MEANING)
    label: str | None = Field(default=None, description="The name its adder gave this version, if any.")


class ScenarioCreate(Strict):
    scenario_id: str | None = Field(default=None, pattern=ID_PATTERN, description=(
        "Its id. Other content under an existing id is that id's new, latest version; sessions made from an "
        "earlier one go on with its initial state and checks."))
    label: str | None = Field(default=None, pattern=VERSION_LABEL, description=(
        "A name for this version, unique under the id (scenario_id@label names it)."))
    env_id: str = Field(max_length=128)
    task: str | None = Field(default=None, max_length=MAX_TEXT, description=(
        "The task; required unless turns are given (then it defaults to the first turn's message)."))
    init_config: dict[str, Any] = Field(default_factory=dict)
    checklist: list[CheckItem] = Field(default_factory=list, max_length=MAX_CHECKS)
    reference_solution: list[ToolCallSpec] | None = Field(default=None, max_length=MAX_SOLUTION_CALLS)
    split: Label | None = Field(default=None, description=SPLIT_MEANING)
    tags: list[Label] = Field(default_factory=list, max_length=MAX_TAGS, description=TAGS_MEANING)
    turns: list[TurnSpec] | None = Field(default=None, min_length=1, max_length=MAX_TURNS, description=TURNS_MEANING)

    @field_validator("tags")
    @classmethod
    def distinct(cls, tags: list[str]) -> list[str]:
        if len(set(tags)) != len(tags):
            raise ValueError("tags must not repeat")
        return tags


# -- sessions ---------------------------------------------------------------------------------
Mode = Literal["task", "conversation"]
GroupSeeds = Literal["derived", "same"]
MAX_SEED = 2**63 - 1


class SessionCreate(Strict):
    scenario_id: str | None = Field(default=None, description=(
        "The scenario to start (its latest version, or scenario_id@<label or digest prefix>)."))
    env_id: str | None = Field(default=None, description=(
        "The environment to start without a scenario (env_id or env_id@<label or digest prefix>); with "
        "scenario_id, only a version of the scenario's environment (env_id@...), to replay exactly what an "
        "earlier session ran."))
    init_config: dict[str, Any] | None = None
    n: int = Field(default=1, ge=1, description="How many sessions to create from the same initial state "
                   "(a group for GRPO-style rollouts); all or none. At most the service's max_group.")
    mode: Mode = Field(default="task", description="'conversation': a simulated user holds the scenario's task "
                       "and reveals it through POST /messages; needs scenario_id.")
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, description=(
        "Make every draw reproducible: the random module is seeded with it before __init__, and os.urandom, "
        "uuid4, secrets and new random.Random() instances draw from a generator seeded from it. The same seed "
        "gives the same draws on any replica and after any rebuild. Without it a session draws as a fresh "
        "process would."))
    group_seeds: GroupSeeds = Field(default="derived", description=(
        "With n > 1 and a seed: 'derived' gives each member a seed of its own, derived from (seed, its index), "
        "after the shared __init__; 'same' lets every member go on drawing alike."))
    idle_ttl_seconds: float | None = Field(default=None, ge=1, description=(
        "Seconds the sessions live after their last call, instead of the service's session TTL, which is also "
        "the longest allowed (a longer one is 422 naming this field). A trainer that may be killed without "
        "closing its sessions sets a short one so they are reaped soon after. Forks keep it."))

    @model_validator(mode="after")
    def one_source(self) -> SessionCreate:
        if self.scenario_id is None and self.env_id is None:
            raise ValueError("give exactly one of scenario_id or env_id")
        if self.scenario_id is not None and self.env_id is not None and "@" not in self.env_id:
            raise ValueError("give exactly one of scenario_id or env_id (with a scenario, env_id may only name a "
                             "version of its environment: env_id@<label or digest prefix>)")
        if self.scenario_id is not None and self.init_config is not None:
            raise ValueError("init_config goes with env_id; a scenario brings its own")
        return self


class SessionCreated(BaseModel):
    session_id: str = Field(description="The first of session_ids.")
    session_ids: list[str] = Field(description="Every session made by this request, in order.")
    env_id: str
    scenario_id: str | None
    mode: Mode
    task: str | None = Field(description="The task; null in conversation mode, where the simulated user holds it.")
    user_message: str | None = Field(description="Conversation mode: the simulated user's opening message.")
    introduction: str
    rules: list[str]
    tools: list[dict[str, Any]] = Field(description="The tools available now (in a turn-based episode, this turn's).")
    turn: int | None = Field(default=None, description="Turn-based scenario: the turn in progress (0: the first); "
                             "user_message is its message. Null otherwise.")
    turns: int | None = Field(default=None, description="Turn-based scenario: how many turns it has.")
    env_version: str | None = Field(default=None, description="The environment version the sessions run (its "
                                                              "digest; env_id@<it> names it).")
    scenario_version: str | None = Field(default=None, description="The scenario version they run.")


class ForkRequest(Strict):
    n: int = Field(default=1, ge=1, description="How many forks to make; all or none. At most max_group.")
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, description=(
        "Reseed the forks' randomness from this seed (as POST /v1/sessions does). Without it a fork goes on "
        "drawing where its parent was."))
    group_seeds: GroupSeeds = Field(default="derived", description=(
        "With n > 1 and a seed: 'derived' (each fork's seed derived from (seed, its index)) or 'same'."))
    step: int | None = Field(default=None, ge=0, description=(
        "Fork at the state after this step (0: the initial state), with the trajectory's first `step` steps; "
        "by default the current step. A past state is the initial state plus the parts the first `step` steps "
        "recorded changing; where a step stored a whole state instead, the recorded calls are replayed from "
        "the initial state, and a step that answers otherwise when run again (an environment that does not "
        "repeat itself) is 409 naming it. A step after the current one is 422."))


class SessionInfo(BaseModel):
    session_id: str
    env_id: str
    scenario_id: str | None
    parent_id: str | None = Field(description="The session this one was forked from.")
    mode: Mode
    done: bool = Field(description="Conversation mode: the simulated user has ended the conversation.")
    steps: int
    created_at: datetime
    expires_at: datetime
    env_version: str | None = Field(default=None, description="The environment version it runs (" + "its digest).")
    scenario_version: str | None = Field(default=None, description="The scenario version it runs (its digest).")


class SessionList(BaseModel):
    sessions: list[SessionInfo]
    total: int = Field(description="Live sessions of this tenant.")
    offset: int


class MessageRequest(Strict):
    content: str = Field(min_length=1, max_length=64 * 1024, description="The agent's message to the user.")


class MessageResult(BaseModel):
    step: int
    reply: str = Field(description="The simulated user's answer.")
    done: bool = Field(description="The user ended the conversation (it emitted its stop signal).")


class TurnEnd(Strict):
    content: str | None = Field(default=None, max_length=64 * 1024, description=(
        "The agent's closing message for the turn, if any (the turn's checks read it as turn_responses.message)."))


class TurnView(BaseModel):
    turn: int | None = Field(description="The turn in progress (0: the first); null once every turn has ended.")
    turns: int = Field(description="How many turns the scenario has.")
    done: bool = Field(description="Every turn has ended.")
    user_message: str | None = Field(description="The user's message of the turn in progress.")
    tools: list[dict[str, Any]] = Field(description="The tools available in the turn in progress.")


class TurnResult(BaseModel):
    step: int = Field(description="The step that ended the turn.")
    ended_turn: int = Field(description="The turn that ended.")
    turn: int | None = Field(description="The turn now in progress; null when that was the last.")
    turns: int
    done: bool = Field(description="That was the last turn: score the session.")
    user_message: str | None = Field(description="The next turn's user message.")
    new_tools: list[dict[str, Any]] = Field(description="Tools that become available with the next turn.")


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


OK_MEANING = ("Whether the tool ran and answered. A tool that said no ({\"success\": false, ...}) is ok, with its "
              "refusal in result; false when the call produced no answer (error says why; the state is unchanged).")


class CallResult(BaseModel):
    step: int
    ok: bool = Field(description=OK_MEANING)
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
    truncated: bool | None = Field(default=None, description="The diff exceeded max_record_bytes and was dropped.")
    bytes: int | None = Field(default=None, description="Size of the dropped diff.")


class Step(BaseModel):
    step: int
    kind: Literal["call"] = "call"
    name: str
    arguments: Any = Field(description='As sent; {"$truncated": "size", "bytes": n} when the record passed '
                           "max_record_bytes with its diff summarised.")
    ok: bool = Field(description=OK_MEANING)
    result: Any = Field(default=None, description='As answered; {"$truncated": "size", "bytes": n} as for arguments.')
    error: CallError | None = None
    observation: str
    diff: StateDiff


class MessageStep(BaseModel):
    step: int
    kind: Literal["message"]
    content: str = Field(description="The agent's message.")
    reply: str = Field(description="The simulated user's answer.")
    done: bool


class CheckResult(BaseModel):
    item: str
    passed: bool
    error: str | None


class TurnStep(BaseModel):
    step: int
    kind: Literal["turn"]
    turn: int = Field(description="The turn this step ended.")
    content: str | None = Field(description="The agent's closing message, if it sent one.")
    checks: list[CheckResult] = Field(description="The turn's checks as they ran when it ended.")
    done: bool = Field(description="It was the last turn.")


class Trajectory(BaseModel):
    steps: list[Annotated[Step | MessageStep | TurnStep, Field(discriminator="kind")]]
    total: int = Field(description="Steps in the whole trajectory.")
    offset: int = Field(description="Index of the first step of this page.")


class TurnScore(BaseModel):
    turn: int
    status: Literal["ended", "in_progress", "not_reached"] = Field(description=(
        "'ended': its checks as they ran when it ended; 'in_progress': checked on the current state; "
        "'not_reached': failed."))
    passed: bool = Field(description="Every check of the turn passed (a turn without checks passes).")
    checks: list[CheckResult]


class Score(BaseModel):
    reward: float | None = Field(description="passed / total; null when the session has no checks. Turn-based: "
                                 "under `aggregation`.")
    passed: int
    total: int
    checks: list[CheckResult]
    aggregation: Literal["all_turns"] | None = Field(default=None, description=(
        "Turn-based scenarios: how reward is made of the turns. 'all_turns' (BFCL's): 1.0 when every turn "
        "passed, else 0.0."))
    turns: list[TurnScore] | None = Field(default=None, description="Turn-based scenarios: each turn's checks.")
    turns_passed: int | None = Field(default=None, description="Turn-based scenarios: turns whose checks all passed.")
    partial_credit: float | None = Field(default=None, description="Turn-based scenarios: turns_passed / turns.")
    env_version: str | None = Field(default=None, description="The environment version the session ran.")
    scenario_version: str | None = Field(default=None, description="The scenario version whose checks scored it.")


class Health(BaseModel):
    status: str


class Problem(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, str]] | None = None
