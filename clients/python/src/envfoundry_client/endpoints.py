"""Every v1 endpoint as a pure function from arguments to an ``Operation``: what to send, how to
read the answer, and whether a retry is safe. Both clients run these; neither builds requests.

Retries are safe for reads, for ``score`` (it changes nothing), and for the writes that carry an
``Idempotency-Key``: the key is made once per operation, so every retry of it is the same logical
call and the service answers a repeat with the first response instead of applying it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from envfoundry_client.environ import seconds_from_environment
from envfoundry_client.models import (
    JSON,
    CallResult,
    CatalogManifest,
    CheckItem,
    Environment,
    EnvironmentSummary,
    EnvironmentVersion,
    GroupSeeds,
    MessageReply,
    Mode,
    Scenario,
    ScenarioPage,
    ScenarioSummary,
    Score,
    Session,
    SessionInfo,
    StateView,
    ToolCall,
    TrajectoryPage,
)
from envfoundry_client.turns import TurnResult, TurnView

T = TypeVar("T")


@dataclass(frozen=True)
class Operation(Generic[T]):
    method: str
    path: str
    parse: Callable[[Any], T] = field(repr=False)
    body: Any = None
    params: dict[str, Any] | None = None
    status: int = 200
    safe: bool = False  # no side effect: may be sent again
    idempotency_key: str | None = None

    @property
    def retryable(self) -> bool:
        return self.safe or self.idempotency_key is not None

    def headers(self) -> dict[str, str]:
        return {"Idempotency-Key": self.idempotency_key} if self.idempotency_key else {}


def _seg(value: str) -> str:
    return quote(value, safe="")


def _key(given: str | None) -> str:
    return given if given is not None else uuid.uuid4().hex


def _none(_: Any) -> None:
    return None


def _get(path: str, parse: Callable[[Any], T], params: dict[str, Any] | None = None) -> Operation[T]:
    return Operation("GET", path, parse, params=params, safe=True)


# -- service and catalog ---------------------------------------------------------------------
def health() -> Operation[str]:
    """The service's status (``"ok"`` when it serves)."""
    return _get("/healthz", lambda b: str(b["status"]))


def list_environments() -> Operation[list[EnvironmentSummary]]:
    """Every environment served, with its tool and scenario counts."""
    return _get("/v1/environments", lambda b: [EnvironmentSummary.from_json(e) for e in b["environments"]])


def get_environment(env_id: str) -> Operation[Environment]:
    """An environment's summary, introduction, rules and tool schemas. Raises ``NotFound``."""
    return _get(f"/v1/environments/{_seg(env_id)}", Environment.from_json)


def create_environment(env_id: str, class_name: str, code: str, *, summary: str = "", introduction: str = "",
                       rules: list[str] | None = None, requirements: list[str] | None = None,
                       label: str | None = None) -> Operation[Environment]:
    """Add an environment from its class source; the service validates it in the sandbox. Other
    code under an existing id is that id's new, latest version (``env_id@label`` names it, with
    ``label``); sessions made from earlier versions go on with theirs.

    ``requirements``: packages the code imports beyond the standard library (PEP 508, e.g.
    ``"mpmath==1.3.0"``), each allowed by the service's operator.

    Raises ``InvalidEnvironment`` (the code fails to load; an import it does not declare; a
    requirement not allowed or not installable: ``reason`` says which) or ``Conflict`` (the id
    belongs to a loaded catalog, or ``label`` names another version).
    """
    body: dict[str, object] = {"env_id": env_id, "class_name": class_name, "code": code, "summary": summary,
                               "introduction": introduction, "rules": list(rules or [])}
    if requirements:
        body["requirements"] = list(requirements)
    if label:
        body["label"] = label
    return Operation("POST", "/v1/environments", Environment.from_json, body, status=201)


def environment_versions(env_id: str) -> Operation[list[EnvironmentVersion]]:
    """Every version of an environment, oldest first, with what changed in its tools. Raises ``NotFound``."""
    return _get(f"/v1/environments/{_seg(env_id)}/versions",
                lambda body: [EnvironmentVersion.from_json(v) for v in body["versions"]])


def catalog_manifest() -> Operation[CatalogManifest]:
    """The version of everything the service's loaded catalogs serve, with one digest of it all."""
    return _get("/v1/catalog/manifest", CatalogManifest.from_json)


def delete_environment(env_id: str) -> Operation[None]:
    """Remove an environment. Raises ``NotFound``."""
    return Operation("DELETE", f"/v1/environments/{_seg(env_id)}", _none, status=204)


def list_scenarios(env_id: str) -> Operation[list[ScenarioSummary]]:
    """The scenarios of one environment, by id: as many as one page holds (1000); ``iter_scenarios``
    reads past that. Raises ``NotFound`` for an unknown environment."""
    return _get(f"/v1/environments/{_seg(env_id)}/scenarios",
                lambda b: [ScenarioSummary.from_json(s) for s in b["scenarios"]])


def find_scenarios(*, env_id: str | None = None, split: str | None = None, tags: Sequence[str] = (),
                   limit: int | None = None, cursor: str | None = None) -> Operation[ScenarioPage]:
    """One page of the scenarios served, by id: of ``env_id``, in ``split``, carrying every one of ``tags``
    (each filter when given). Pass the page's ``next_cursor`` as ``cursor`` for the next one, with the same
    filters. Raises ``NotFound`` (unknown environment), ``InvalidRequest`` (a bad label, limit or cursor)."""
    params: dict[str, Any] = {k: v for k, v in (("env", env_id), ("split", split), ("limit", limit),
                                                ("cursor", cursor)) if v is not None}
    if tags:
        params["tag"] = list(tags)
    return _get("/v1/scenarios", ScenarioPage.from_json, params or None)


def get_scenario(scenario_id: str) -> Operation[Scenario]:
    """A whole scenario: task, initial state, checks and reference solution. Raises ``NotFound``."""
    return _get(f"/v1/scenarios/{_seg(scenario_id)}", Scenario.from_json)


def create_scenario(env_id: str, task: str, *, init_config: JSON | None = None,
                    checklist: list[CheckItem] | None = None, reference_solution: list[ToolCall] | None = None,
                    scenario_id: str | None = None, split: str | None = None,
                    tags: Sequence[str] = (), label: str | None = None) -> Operation[Scenario]:
    """Add a scenario to an environment (the service picks an id unless given), optionally in a ``split``
    and with ``tags``; other content under an existing ``scenario_id`` is its new version (``label``
    names it). Raises ``NotFound``, ``InvalidRequest`` (a bad label names ``split`` or ``tags``)."""
    body: JSON = {"env_id": env_id, "task": task, "init_config": init_config or {},
                  "checklist": [c.to_json() for c in checklist or []]}
    if split is not None:
        body["split"] = split
    if tags:
        body["tags"] = list(tags)
    if reference_solution is not None:
        body["reference_solution"] = [c.to_json() for c in reference_solution]
    if scenario_id is not None:
        body["scenario_id"] = scenario_id
    if label:
        body["label"] = label
    return Operation("POST", "/v1/scenarios", Scenario.from_json, body, status=201)


def delete_scenario(scenario_id: str) -> Operation[None]:
    """Remove a scenario. Raises ``NotFound``."""
    return Operation("DELETE", f"/v1/scenarios/{_seg(scenario_id)}", _none, status=204)


# -- sessions --------------------------------------------------------------------------------
def idle_seconds_from_environment() -> float | None:
    """``ENVFOUNDRY_SESSION_IDLE_SECONDS``: the idle TTL every session this process opens asks for
    (None: the service's), so a trainer whose harness builds the clients (verifiers, TRL) can have
    what a SIGKILL leaves reaped in seconds without a change to its code."""
    return seconds_from_environment("ENVFOUNDRY_SESSION_IDLE_SECONDS", 1, "seconds, 1 or more")


def create_session(scenario_id: str | None = None, *, env_id: str | None = None, init_config: JSON | None = None,
                   n: int = 1, mode: Mode = "task", seed: int | None = None, group_seeds: GroupSeeds = "derived",
                   idempotency_key: str | None = None, idle_ttl_seconds: float | None = None) -> Operation[Session]:
    """Start ``n`` sessions from a scenario (or from an environment and an initial state).

    All n are created or none. In ``conversation`` mode the result carries the simulated user's
    opening message instead of the task. With ``seed`` every draw the environment makes (``random``,
    ``uuid4``, ``os.urandom``, ``secrets``) is reproducible; a group's members draw from seeds
    derived from it and their index (``group_seeds="same"``: all alike). With ``idle_ttl_seconds``
    (default: ``ENVFOUNDRY_SESSION_IDLE_SECONDS``, else the service's TTL) the sessions expire that
    many seconds after their last call, so a killed trainer's are reaped soon. Raises ``NotFound``,
    ``InvalidRequest`` (bad ``n``, both or neither source), ``UserLLMUnavailable`` (conversation
    mode without a user LLM).
    """
    body: JSON = {}
    if scenario_id is not None:
        body["scenario_id"] = scenario_id
    if env_id is not None:
        body["env_id"] = env_id
    if init_config is not None:
        body["init_config"] = init_config
    # Defaults are left out so that a service that predates groups and modes accepts the body.
    if n != 1:
        body["n"] = n
    if mode != "task":
        body["mode"] = mode
    body.update(_seeding(seed, group_seeds))
    idle = idle_seconds_from_environment() if idle_ttl_seconds is None else idle_ttl_seconds
    if idle is not None:
        body["idle_ttl_seconds"] = idle
    return Operation("POST", "/v1/sessions", Session.from_json, body, status=201,
                     idempotency_key=_key(idempotency_key))


def get_session(session_id: str) -> Operation[SessionInfo]:
    """Environment, scenario, parent, step count, mode, whether it is done, created and expiry times."""
    return _get(f"/v1/sessions/{_seg(session_id)}", SessionInfo.from_json)


def tools(session_id: str) -> Operation[list[JSON]]:
    """The session's tools as OpenAI function-calling schemas."""
    return _get(f"/v1/sessions/{_seg(session_id)}/tools", lambda b: list(b["tools"]))


def call(session_id: str, name: str, arguments: JSON | str | None = None, *,
         idempotency_key: str | None = None) -> Operation[CallResult]:
    """Call one tool. ``arguments`` is an object or the JSON string an OpenAI tool call carries.

    A tool that fails answers ``ok=False`` with an ``error``; only service failures raise
    (``NotFound``, ``SessionBusy``, ``Unavailable``, ...).
    """
    body = {"name": name, "arguments": {} if arguments is None else arguments}
    return Operation("POST", f"/v1/sessions/{_seg(session_id)}/calls", CallResult.from_json, body,
                     idempotency_key=_key(idempotency_key))


def send_message(session_id: str, content: str, *, idempotency_key: str | None = None) -> Operation[MessageReply]:
    """Send the agent's message to the simulated user of a conversation-mode session; get its reply.

    Raises ``NotConversation``, ``ConversationEnded``, ``UserLLMFailed``, ``UserLLMUnavailable``.
    """
    return Operation("POST", f"/v1/sessions/{_seg(session_id)}/messages", MessageReply.from_json,
                     {"content": content}, idempotency_key=_key(idempotency_key))


def end_turn(session_id: str, content: str | None = None, *,
             idempotency_key: str | None = None) -> Operation[TurnResult]:
    """End the turn in progress of a turn-based session (its checks run then); get the user's next message and
    the tools that arrive with it, or ``done`` after the last turn. ``content``: the agent's closing message.

    Raises ``TurnsEnded`` once every turn has ended, ``NotTurnBased`` for a session without turns.
    """
    return Operation("POST", f"/v1/sessions/{_seg(session_id)}/turns", TurnResult.from_json,
                     {} if content is None else {"content": content}, idempotency_key=_key(idempotency_key))


def turn(session_id: str) -> Operation[TurnView]:
    """Where a turn-based session is: the turn in progress, its user message and its tools."""
    return _get(f"/v1/sessions/{_seg(session_id)}/turns", TurnView.from_json)


def state(session_id: str, *, step: int | None = None) -> Operation[StateView]:
    """The session's state as JSON, with the step it belongs to; with ``step``, the state after that
    step (0: the initial state), rebuilt as for a fork at that step."""
    return _get(f"/v1/sessions/{_seg(session_id)}/state", StateView.from_json,
                None if step is None else {"step": step})


def trajectory(session_id: str, *, offset: int = 0, limit: int | None = None) -> Operation[TrajectoryPage]:
    """A page of the session's steps (tool calls and messages) from ``offset``, with the total count."""
    params: dict[str, Any] = {}
    if offset:
        params["offset"] = offset
    if limit is not None:
        params["limit"] = limit
    return _get(f"/v1/sessions/{_seg(session_id)}/trajectory", TrajectoryPage.from_json, params or None)


def score(session_id: str, *, scenario: str | None = None) -> Operation[Score]:
    """Run the scenario's checks on the current state; the session goes on. With ``scenario``
    (its own scenario's id for the latest version, or ``scenario_id@<version>``), the checks of that
    version instead of the one the session started on."""
    return Operation("POST", f"/v1/sessions/{_seg(session_id)}/score", Score.from_json,
                     params=None if scenario is None else {"scenario": scenario}, safe=True)


def fork(session_id: str, *, n: int = 1, step: int | None = None, seed: int | None = None,
         group_seeds: GroupSeeds = "derived", idempotency_key: str | None = None) -> Operation[Session]:
    """``n`` independent copies of a session (state and trajectory), all or none; with ``step``, at
    the state after that step (0: the initial state) with the trajectory's first ``step`` steps.
    A step that answers otherwise when replayed is a ``Conflict`` naming it. A fork goes on drawing
    where its parent was; with ``seed`` it draws anew from it (as ``create_session``)."""
    body: dict[str, Any] = {**({"n": n} if n != 1 else {}), **({"step": step} if step is not None else {}),
                            **_seeding(seed, group_seeds)}
    return Operation("POST", f"/v1/sessions/{_seg(session_id)}/fork", Session.from_json,
                     body or None, status=201, idempotency_key=_key(idempotency_key))


def _seeding(seed: int | None, group_seeds: GroupSeeds) -> JSON:
    """The seed fields of a body (left out unset, for a service that predates seeds)."""
    if seed is None:
        return {}
    return {"seed": seed, **({"group_seeds": group_seeds} if group_seeds != "derived" else {})}


def delete_session(session_id: str) -> Operation[None]:
    """End a session and free its state. Raises ``NotFound``."""
    return Operation("DELETE", f"/v1/sessions/{_seg(session_id)}", _none, status=204)


ENDPOINTS = (health, list_environments, get_environment, environment_versions, catalog_manifest, create_environment,
             delete_environment, list_scenarios,
             find_scenarios, get_scenario, create_scenario, delete_scenario, create_session, get_session, tools, call, send_message,
             end_turn, turn, state, trajectory, score, fork, delete_session)
