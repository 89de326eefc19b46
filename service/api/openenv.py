"""OpenEnv's protocol over the session engine: episodes, steps, rewards and its JSON-RPC methods.

OpenEnv (the protocol TRL, SkyRL, torchforge and NeMo Gym's OpenEnv adapter speak) sees an
environment at a base URL, ``/openenv/{env_id}``. Its episode is an envfoundry session: its
``episode_id`` is the session id, so the episode lives in the store like any session (REST and
MCP reach it too, any replica continues it, a restart loses nothing), and every operation goes
through ``Sessions`` (keys, tenants, quotas, idempotency, metrics as on REST).

This module is transport-neutral: ``service/api/openenv_routes.py`` carries it over HTTP and the
WebSocket. Service errors stay ``ServiceError``s here; each transport renders them once
(``service.api.problems.openenv_code`` gives OpenEnv's code for one).

Mapping onto OpenEnv's shapes:

- ``reset`` takes ``scenario_id`` or ``seed`` (the scenario at ``seed`` modulo the number of the
  environment's scenarios, in id order; neither means seed 0; a seed given also seeds the
  episode's randomness, as ``POST /v1/sessions`` does), ``mode`` (``task`` or
  ``conversation``), ``idle_ttl_seconds`` (the episode expires that long after its last step, as
  on ``POST /v1/sessions``), or ``episode_id`` to continue an episode where it is.
- ``step`` takes ``{"type": "call_tool", "tool_name", "arguments"}``, ``{"type": "list_tools"}``
  or, in conversation mode, ``{"type": "send_message", "content"}``. Its ``reward`` is the
  session's score at that step; ``done`` is true once the simulated user ended the conversation
  (a task-mode episode ends when the agent stops).
- A failed tool call is an observation (``error`` in OpenEnv's ``ToolError`` shape), never a
  protocol error, as on REST.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sandbox.wire.answers import ToolError
from service.api import calls
from service.api.schemas import MAX_SEED
from service.catalog.model import Environment, Scenario
from service.catalog.scenario_index import ScenarioQuery
from service.catalog.versions import split
from service.engine import turns
from service.engine.calls import Applied
from service.engine.sessions import Sessions
from service.errors import InvalidRequest, NotFound, QuotaExceeded, ServiceError
from service.stores.store import Snapshot

# OpenEnv's ToolError.error_type for each of our tool error types.
TOOL_ERROR_TYPES = {ToolError.UNKNOWN_TOOL: "tool_not_found", ToolError.INVALID_ARGUMENTS: "invalid_args",
                    ToolError.TIMEOUT: "timeout", ToolError.TOOL_EXCEPTION: "execution_error",
                    ToolError.RESOURCE_LIMIT: "execution_error", ToolError.SANDBOX_ERROR: "execution_error"}
RESET_FIELDS = frozenset({"scenario_id", "seed", "mode", "episode_id", "init_config", "idle_ttl_seconds"})
MODES = ("task", "conversation")
def mcp_tools(env: Environment, tools: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The environment's tools (or ``tools``, those of a turn) in MCP's shape (name, description, inputSchema)."""
    return [{"name": t["function"]["name"], "description": t["function"].get("description") or "",
             "inputSchema": t["function"].get("parameters") or {"type": "object", "properties": {}}}
            for t in (env.tools if tools is None else tools)]


def _idle_ttl(value: Any) -> float | None:
    """Raises InvalidRequest: not a number of seconds, 1 or more (the longest is the engine's to check)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 1:
        raise InvalidRequest("idle_ttl_seconds must be a number of seconds, 1 or more", field="idle_ttl_seconds")
    return float(value)


@dataclass
class Opened:
    """An episode a reset opened or continued, and the reset's answer."""

    session_id: str
    payload: dict[str, Any]


class Episodes:
    """OpenEnv's operations on one environment, for one tenant."""

    def __init__(self, engine: Sessions, env_id: str, tenant: str) -> None:
        self.engine = engine
        self.env_id = env_id  # may name one version: ``env_id@<digest prefix or label>``
        self.name = split(env_id)[0]
        self.tenant = tenant

    async def environment(self) -> Environment:
        """Raises NotFound: no such environment for this tenant."""
        return await self.engine.registry.environment(self.env_id, self.tenant)

    async def scenarios(self) -> Sequence[Scenario]:
        return await self.engine.registry.select(ScenarioQuery(env=self.name), self.tenant)

    async def episode(self, episode_id: str) -> Snapshot:
        """The episode's session, which must be of this environment.

        Raises:
            NotFound: no such episode for this tenant.
            InvalidRequest: the episode is another environment's.
        """
        snap = await self.engine.snapshot(episode_id, tenant=self.tenant, blobs=False)
        if snap.meta.env_id != self.name:
            raise InvalidRequest(f"episode '{episode_id}' is of environment '{snap.meta.env_id}', not "
                                 f"'{self.env_id}'; use that environment's base URL", field="episode_id")
        return snap

    # -- reset --------------------------------------------------------------------------------
    async def reset(self, data: dict[str, Any], current: str | None = None, owned: bool = False) -> Opened:
        """Open an episode as ``data`` asks, or continue one.

        ``current`` is the episode the caller holds (a WebSocket's): when it is still at step 0 of
        the scenario and mode asked for, it is that fresh episode already and is kept. An ``owned``
        one the caller replaces stays until the new one exists, except when the tenant's quota has
        no room for both: then it is ended first, as replacing it asks.

        Raises:
            InvalidRequest: an unknown field, a bad seed or mode, a scenario of another environment.
            NotFound: an unknown environment, scenario or episode.
            QuotaExceeded: the tenant holds as many sessions as it may.
        """
        unknown = sorted(set(data) - RESET_FIELDS)
        if unknown:
            raise InvalidRequest(f"reset takes {', '.join(sorted(RESET_FIELDS))}; not '{unknown[0]}'",
                                 field=unknown[0])
        episode_id = data.get("episode_id")
        if episode_id is not None:
            if not isinstance(episode_id, str) or set(data) - {"episode_id"}:
                raise InvalidRequest("episode_id continues an episode as it is: send it alone, as a string",
                                     field="episode_id")
            return Opened(episode_id, await self._continued(await self.episode(episode_id)))
        mode = data.get("mode", "task")
        if mode not in MODES:
            raise InvalidRequest("mode must be 'task' or 'conversation'", field="mode")
        env = await self.environment()
        scenario, seed = await self._chosen(data)
        # As gymnasium's reset(seed=...) does, a seed the caller gave also makes the episode's draws
        # reproducible (the session's seed); without one, its draws are its own.
        drawn = data.get("seed")
        idle = _idle_ttl(data.get("idle_ttl_seconds"))
        if current is not None:
            kept = await self._fresh(current, scenario, mode, drawn, idle)
            if kept is not None:
                return Opened(current, await self._continued(kept))
        init_config = data.get("init_config")
        if init_config is not None and (scenario is not None or not isinstance(init_config, dict)):
            raise InvalidRequest("init_config (an object) starts an environment without scenarios; a scenario "
                                 "brings its own", field="init_config")
        scenario_id = scenario.scenario_id if scenario else None
        try:
            created = await self.engine.create(scenario_id, self.env_id, init_config, mode=mode, tenant=self.tenant,
                                               seed=drawn, idle_ttl=idle)
        except QuotaExceeded:
            if current is None or not owned:
                raise
            await self.end(current)
            created = await self.engine.create(scenario_id, self.env_id, init_config, mode=mode, tenant=self.tenant,
                                               seed=drawn, idle_ttl=idle)
        meta = created.meta
        observation = self._opening(env, scenario, meta.session_id, mode, meta.opening, step=0, turn=0)
        observation["seed"] = seed
        return Opened(meta.session_id, {"observation": observation, "reward": None, "done": False})

    async def _chosen(self, data: dict[str, Any]) -> tuple[Scenario | None, int | None]:
        scenario_id, seed = data.get("scenario_id"), data.get("seed")
        if scenario_id is not None and seed is not None:
            raise InvalidRequest("give scenario_id or seed, not both", field="seed")
        if scenario_id is not None:
            if not isinstance(scenario_id, str):
                raise InvalidRequest("scenario_id must be a string", field="scenario_id")
            scenario = await self.engine.registry.scenario(scenario_id, self.tenant)
            if scenario.env_id != self.name:
                raise InvalidRequest(f"scenario '{scenario_id}' is of environment '{scenario.env_id}', not "
                                     f"'{self.env_id}'", field="scenario_id")
            return scenario, None
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED):
            raise InvalidRequest(f"seed must be an integer from 0 to {MAX_SEED}", field="seed")
        scenarios = await self.scenarios()
        if not scenarios:
            return None, None
        seed = seed or 0
        return scenarios[seed % len(scenarios)], seed

    async def _fresh(self, current: str, scenario: Scenario | None, mode: str,
                     seed: int | None, idle_ttl: float | None) -> Snapshot | None:
        try:
            snap = await self.episode(current)
        except ServiceError:
            return None
        meta = snap.meta
        same = scenario is not None and meta.scenario_id == scenario.scenario_id and meta.mode == mode \
            and meta.seed == seed and meta.idle_ttl == idle_ttl
        return snap if same and meta.step == 0 else None

    async def _continued(self, snap: Snapshot) -> dict[str, Any]:
        env = await self.engine.environment_of(snap)
        scenario = await self.engine.scenario_of(snap)
        meta = snap.meta
        turn = await self.engine.turns.ended(snap) if scenario is not None and scenario.turns else 0
        observation = self._opening(env, scenario, meta.session_id, meta.mode, meta.opening, step=meta.step,
                                    turn=turn)
        reward = (await self.engine.score(meta.session_id, tenant=self.tenant))["reward"] if meta.step else None
        return {"observation": observation, "reward": reward, "done": meta.done}

    @staticmethod
    def _opening(env: Environment, scenario: Scenario | None, episode_id: str, mode: str, opening: str | None,
                 step: int, turn: int = 0) -> dict[str, Any]:
        conversation = mode == "conversation"
        observation = {"episode_id": episode_id, "env_id": env.env_id,
                       "scenario_id": scenario.scenario_id if scenario else None, "mode": mode, "step": step,
                       "task": scenario.task if scenario and not conversation else None, "user_message": opening,
                       "introduction": env.introduction, "rules": env.rules, "tool_schemas": env.tools}
        if scenario is not None and scenario.turns:  # a turn-based episode: the turn it is in, and its tools
            view = turns.view_at(env, scenario, turn)
            observation.update(user_message=view["user_message"], tool_schemas=view["tools"], turn=view["turn"],
                               turns=view["turns"])
        return observation

    # -- step and state -----------------------------------------------------------------------
    async def step(self, episode_id: str, action: Any, key: str | None = None) -> dict[str, Any]:
        """Apply one action; the reward is the session's score after it.

        Raises:
            InvalidRequest: the action is not one of the three kinds, or misses a field.
            NotFound, SessionBusy, LimitExceeded, ...: as ``Sessions.call`` and ``Sessions.message``.
        """
        if not isinstance(action, dict):
            raise InvalidRequest("the action must be an object", field="action")
        kind = action.get("type", "call_tool")
        snap = await self.episode(episode_id)
        if kind == "list_tools":
            env = await self.engine.environment_of(snap)
            return {"observation": {"tools": mcp_tools(env, await self.engine.turns.tools(snap, env))},
                    "reward": None, "done": snap.meta.done}
        if kind == "end_turn":
            content = action.get("content")
            if content is not None and not isinstance(content, str):
                raise InvalidRequest("end_turn's content must be a string", field="action.content")
            answer, replayed = await self.engine.turns.end(episode_id, content, key=key, tenant=self.tenant)
            return {"observation": {**answer, "replayed": replayed}, "reward": await self.reward(episode_id),
                    "done": answer["done"]}
        if kind == "call_tool":
            return await self._call(episode_id, action, key, snap.meta.done)
        if kind == "send_message":
            content = action.get("content")
            if not isinstance(content, str) or not content:
                raise InvalidRequest("send_message needs content, a non-empty string", field="action.content")
            applied = await self.engine.message(episode_id, content, key=key, tenant=self.tenant)
            record = applied.record
            return {"observation": {"step": record["step"], "reply": record["reply"]},
                    "reward": await self.reward(episode_id), "done": record["done"]}
        raise InvalidRequest("action.type must be 'call_tool', 'list_tools', 'send_message' or 'end_turn'",
                             field="action.type")

    async def _call(self, episode_id: str, action: dict[str, Any], key: str | None, done: bool) -> dict[str, Any]:
        name = action.get("tool_name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("call_tool needs tool_name, a non-empty string", field="action.tool_name")
        arguments = action.get("arguments", {})
        if not isinstance(arguments, dict | str):
            raise InvalidRequest("action.arguments must be an object (or its JSON text)", field="action.arguments")
        applied = await calls.run(self.engine, calls.CallRequest(episode_id, name, arguments, key, self.tenant))
        return {"observation": call_observation(applied), "reward": await self.reward(episode_id), "done": done}

    async def reward(self, episode_id: str) -> float | None:
        """The episode's score now (None: its scenario has no checks)."""
        reward: float | None = (await self.engine.score(episode_id, tenant=self.tenant))["reward"]
        return reward

    async def step_fresh(self, action: Any) -> dict[str, Any]:
        """Step an episode made for this one action, then end it: OpenEnv's HTTP ``/step`` without
        an episode (its servers build a throwaway environment per request, step it, close it). The
        fresh episode is the one a reset without arguments opens (seed 0), so the answer is what
        that action does first thing in it; nothing of it stays.

        Raises:
            as ``reset`` and ``step``.
        """
        opened = await self.reset({})
        try:
            return await self.step(opened.session_id, action)
        finally:
            await self.end(opened.session_id)

    async def state(self, episode_id: str) -> dict[str, Any]:
        """OpenEnv's State (episode_id, step_count) with the session's state view under ``state``."""
        snap = await self.episode(episode_id)
        step, view = await self.engine.state_view(episode_id, tenant=self.tenant)
        meta = snap.meta
        return {"episode_id": episode_id, "step_count": step, "env_id": meta.env_id, "scenario_id": meta.scenario_id,
                "mode": meta.mode, "done": meta.done, "state": json.loads(view)}

    async def close(self, episode_id: str) -> None:
        """Raises NotFound: no such episode."""
        await self.episode(episode_id)
        await self.engine.delete(episode_id, tenant=self.tenant)

    async def end(self, episode_id: str) -> None:
        """Close an episode that may already be gone (deleted elsewhere, or expired)."""
        try:
            await self.close(episode_id)
        except NotFound:
            pass


def call_observation(applied: Applied) -> dict[str, Any]:
    """A call record as OpenEnv's CallToolObservation fields, plus the record's own."""
    record = applied.record
    error = record["error"]
    return {"tool_name": record["name"], "result": record["result"],
            "error": {"error_type": TOOL_ERROR_TYPES.get(error["type"], "execution_error"),
                      "message": error["message"]} if error else None,
            "ok": record["ok"], "step": record["step"], "text": record["observation"],
            "error_kind": error["type"] if error else None, "replayed": applied.replayed}
