"""The session engine: create, call, observe, score and fork sessions.

State lives only in the store; this object holds nothing per session, so any
replica can serve any request and a restart loses nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from sandbox import codec
from sandbox.errors import RequestFailed, SandboxBusy, SandboxError
from sandbox.pool import CallOutcome, WorkerPool
from service.catalog import Environment, Scenario
from service.problems import Conflict, InvalidEnvironment, InvalidRequest, NotFound, SessionBusy, Unavailable
from service.registry import Registry, env_code
from service.store import LockTimeout, SessionMeta, SessionStore, Snapshot, StoreError, new_session_id

# The lock lease outlives the longest call (see WorkerPool.longest_request) with room to commit.
LEASE_SLACK = 15.0
LOAD_FAILURES = frozenset({"syntax_error", "import_error", "load_error", "load_timeout", "missing_class"})
# Echoed argument values and messages are cut here so an error cannot be larger than the request.
MAX_MESSAGE = 1000


@dataclass
class Created:
    meta: SessionMeta
    env: Environment
    scenario: Scenario | None


class Sessions:
    def __init__(self, registry: Registry, store: SessionStore, pool: WorkerPool, lock_wait: float) -> None:
        self.registry = registry
        self.store = store
        self.pool = pool
        self.lock_wait = lock_wait
        self._validators: dict[tuple[str, str], Draft202012Validator] = {}

    async def create(self, scenario_id: str | None, env_id: str | None, init_config: dict[str, Any] | None) -> Created:
        scenario = await self.registry.scenario(scenario_id) if scenario_id else None
        env = await self.registry.environment(scenario.env_id if scenario else str(env_id))
        config = scenario.init_config if scenario else (init_config or {})
        if _unicode_problem(config):
            raise InvalidRequest("init_config contains text that is not valid Unicode (a lone surrogate)",
                                 field="init_config")
        try:
            state = await self.pool.init_state(env_code(env), config)
        except RequestFailed as exc:
            if exc.kind == "sandbox_error":
                raise Unavailable(f"the sandbox failed: {exc.message}") from exc
            if exc.kind in LOAD_FAILURES:
                raise InvalidEnvironment(f"the environment's code failed to load: {exc.message}",
                                         reason=exc.kind) from exc
            raise InvalidEnvironment(f"the environment failed to start from this init_config: {exc.message}",
                                     reason=exc.kind) from exc
        except SandboxError as exc:
            raise Unavailable(exc.message) from exc
        meta = SessionMeta(new_session_id(), env.env_id, scenario.scenario_id if scenario else None, time.time())
        await self._store(self.store.create(meta, state, state, []))
        return Created(meta, env, scenario)

    async def snapshot(self, session_id: str, *, trajectory: bool = False) -> Snapshot:
        snap: Snapshot | None = await self._store(self.store.load(session_id, trajectory=trajectory))
        if snap is None:
            raise NotFound(f"session '{session_id}' not found (it may have expired)")
        return snap

    async def environment_of(self, snap: Snapshot) -> Environment:
        return await self.registry.environment(snap.meta.env_id)

    async def call(self, session_id: str, name: str, raw_arguments: dict[str, Any] | str) -> dict[str, Any]:
        """Apply one tool call exactly once. Tool failures are returned, not raised."""
        lease = self.pool.longest_request + LEASE_SLACK
        try:
            async with self.store.lock(session_id, self.lock_wait, lease):
                snap = await self.snapshot(session_id)
                env = await self.environment_of(snap)
                arguments, outcome = await self._run(env, snap.state, name, raw_arguments)
                record = _step_record(snap.meta.step + 1, name, arguments, outcome)
                committed = await self._store(
                    self.store.commit(session_id, snap.meta.step, outcome.state, json.dumps(record))
                )
        except LockTimeout as exc:
            raise SessionBusy(str(exc)) from exc
        except StoreError as exc:
            raise Unavailable(str(exc)) from exc
        except SandboxBusy as exc:
            raise Unavailable(exc.message) from exc
        if not committed:
            if await self._store(self.store.load(session_id)) is None:
                raise NotFound(f"session '{session_id}' was deleted or expired during the call")
            raise Conflict("the session changed during the call; nothing was applied, retry")
        return record

    async def _run(self, env: Environment, state: str, name: str, raw: dict[str, Any] | str) -> tuple[Any, CallOutcome]:
        if isinstance(raw, str):
            try:
                arguments = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError as exc:
                return raw, _failed("invalid_arguments", f"arguments are not valid JSON: {exc}")
        else:
            arguments = raw
        if not isinstance(arguments, dict):
            return arguments, _failed("invalid_arguments", "arguments must be a JSON object")
        tool = env.tool(name)
        if tool is None:
            names = ", ".join(sorted(env.tool_names))
            return arguments, _failed("unknown_tool", f"unknown tool '{name}'; available tools: {names}")
        problem = self._check_arguments(env, tool, arguments)
        if problem:
            return arguments, _failed("invalid_arguments", f"{name}: {problem}")
        return arguments, await self.pool.call(env_code(env), state, name, arguments)

    def _check_arguments(self, env: Environment, tool: dict[str, Any], arguments: dict[str, Any]) -> str | None:
        key = (env.code_hash, tool["function"]["name"])
        validator = self._validators.get(key)
        if validator is None:
            validator = Draft202012Validator(tool["function"].get("parameters") or {"type": "object"})
            self._validators[key] = validator
        error = best_match(validator.iter_errors(arguments))
        if error is None:
            return _unicode_problem(arguments)
        where = "/".join(str(p) for p in error.absolute_path)
        return _cut(f"argument '{where}': {error.message}" if where else error.message)

    async def state_view(self, session_id: str) -> tuple[int, dict[str, Any]]:
        snap = await self.snapshot(session_id)
        return snap.meta.step, codec.view_encoded(json.loads(snap.state))

    async def trajectory(self, session_id: str) -> list[dict[str, Any]]:
        records = await self._store(self.store.trajectory(session_id))
        if records is None:
            raise NotFound(f"session '{session_id}' not found (it may have expired)")
        return [json.loads(r) for r in records]

    async def score(self, session_id: str) -> dict[str, Any]:
        snap = await self.snapshot(session_id)
        env = await self.environment_of(snap)
        scenario = await self.registry.scenario(snap.meta.scenario_id) if snap.meta.scenario_id else None
        checklist = scenario.checklist if scenario else []
        try:
            results = await self.pool.score(env_code(env), snap.state, snap.initial, [c.check for c in checklist])
        except SandboxError as exc:
            raise Unavailable(f"scoring failed in the sandbox: {exc.message}") from exc
        checks = [{"item": c.item, "passed": r["passed"], "error": r["error"]} for c, r in zip(checklist, results, strict=True)]
        passed = sum(1 for c in checks if c["passed"])
        total = len(checks)
        return {"reward": passed / total if total else None, "passed": passed, "total": total, "checks": checks}

    async def fork(self, session_id: str) -> Created:
        snap = await self.snapshot(session_id, trajectory=True)
        env = await self.environment_of(snap)
        scenario = await self.registry.scenario(snap.meta.scenario_id) if snap.meta.scenario_id else None
        meta = SessionMeta(new_session_id(), snap.meta.env_id, snap.meta.scenario_id, time.time(),
                           step=snap.meta.step, parent_id=session_id)
        await self._store(self.store.create(meta, snap.state, snap.initial, snap.trajectory))
        return Created(meta, env, scenario)

    async def delete(self, session_id: str) -> None:
        if not await self._store(self.store.delete(session_id)):
            raise NotFound(f"session '{session_id}' not found")

    @staticmethod
    async def _store(awaitable: Any) -> Any:
        try:
            return await awaitable
        except StoreError as exc:
            raise Unavailable(str(exc)) from exc


def _cut(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + f"... ({len(text)} characters)"


def _unicode_problem(value: Any) -> str | None:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return "arguments contain text that is not valid Unicode (a lone surrogate)"
    return None


def _failed(kind: str, message: str) -> CallOutcome:
    return CallOutcome(False, None, {"type": kind, "message": message}, None, {"added": [], "removed": [], "changed": []})


def observation(ok: bool, result: Any, error: dict[str, str] | None) -> str:
    """The text an agent framework shows the model for this call."""
    if not ok and error:
        return f"Error ({error['type']}): {error['message']}"
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False)


def _step_record(step: int, name: str, arguments: Any, outcome: CallOutcome) -> dict[str, Any]:
    return {
        "step": step,
        "name": name,
        "arguments": arguments,
        "ok": outcome.ok,
        "result": outcome.result,
        "error": outcome.error,
        "observation": observation(outcome.ok, outcome.result, outcome.error),
        "diff": outcome.diff,
    }
