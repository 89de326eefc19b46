"""Where the service finds environments and scenarios: the loaded catalogs, then the store.

Environments and scenarios created over the API are written to the session
store too, so every replica sharing it can serve sessions of them.
"""

from __future__ import annotations

import json

from sandbox.errors import RequestFailed, SandboxError
from sandbox.pool import EnvCode, WorkerPool
from service.catalog import Catalog, CatalogError, ConflictError, Environment, Scenario, build_environment
from service.problems import Conflict, InvalidEnvironment, InvalidRequest, NotFound, Unavailable
from service.store import SessionStore


def env_code(env: Environment) -> EnvCode:
    return EnvCode(key=env.code_hash, env_id=env.env_id, class_name=env.class_name, code=env.code)


class Registry:
    def __init__(self, catalog: Catalog, store: SessionStore, pool: WorkerPool) -> None:
        self.catalog = catalog
        self.store = store
        self.pool = pool

    async def environment(self, env_id: str) -> Environment:
        """Raises NotFound."""
        env = self.catalog.environments.get(env_id)
        if env is not None:
            return env
        record = await self.store.get_record("environments", env_id)
        if record is None:
            raise NotFound(f"environment '{env_id}' not found")
        env = _env_from_record(record)
        self.catalog.environments[env_id] = env  # immutable once created: safe to cache
        return env

    async def scenario(self, scenario_id: str) -> Scenario:
        """Raises NotFound."""
        scenario = self.catalog.scenarios.get(scenario_id)
        if scenario is not None:
            return scenario
        record = await self.store.get_record("scenarios", scenario_id)
        if record is None:
            raise NotFound(f"scenario '{scenario_id}' not found")
        scenario = Scenario.from_json(json.loads(record))
        self.catalog.scenarios[scenario_id] = scenario
        return scenario

    async def environments(self) -> list[Environment]:
        for env_id, record in (await self.store.all_records("environments")).items():
            if env_id not in self.catalog.environments:
                self.catalog.environments[env_id] = _env_from_record(record)
        return sorted(self.catalog.environments.values(), key=lambda e: e.env_id)

    async def scenarios(self) -> list[Scenario]:
        for scenario_id, record in (await self.store.all_records("scenarios")).items():
            if scenario_id not in self.catalog.scenarios:
                self.catalog.scenarios[scenario_id] = Scenario.from_json(json.loads(record))
        return list(self.catalog.scenarios.values())

    async def add_environment(self, env: Environment) -> Environment:
        """Validate ``env`` in the sandbox and publish it.

        Raises:
            Conflict: the id holds different code.
            InvalidEnvironment: the code fails to load or to instantiate with ``{}``.
        """
        try:
            existing = await self.environment(env.env_id)
        except NotFound:
            existing = None
        if existing is not None:
            if existing.code_hash != env.code_hash:
                raise Conflict(f"environment '{env.env_id}' already exists with different code", field="env_id")
            return existing
        try:
            failure = await self.pool.validate(env_code(env))
        except RequestFailed as exc:
            failure = {"kind": exc.kind, "message": exc.message}
        except SandboxError as exc:
            raise Unavailable(f"the sandbox could not validate the code: {exc.message}") from exc
        if failure is not None:
            raise InvalidEnvironment(f"{failure['kind']}: {failure['message']}", reason=failure["kind"])
        record = json.dumps({**env.manifest(), "code": env.code})
        previous = await self.store.put_record("environments", env.env_id, record)
        if previous is not None:
            winner = _env_from_record(previous)
            if winner.code_hash != env.code_hash:
                raise Conflict(f"environment '{env.env_id}' already exists with different code", field="env_id")
            env = winner
        self.catalog.environments[env.env_id] = env
        return env

    async def add_scenario(self, scenario: Scenario) -> Scenario:
        """Raises NotFound (unknown env), InvalidRequest (a check does not parse), Conflict."""
        await self.environment(scenario.env_id)
        probe = Catalog()
        probe.environments[scenario.env_id] = self.catalog.environments[scenario.env_id]
        try:
            probe.add_scenario(scenario)
            existing = await self._existing_scenario(scenario.scenario_id)
            if existing is not None and existing.to_json() != scenario.to_json():
                raise ConflictError(f"scenario '{scenario.scenario_id}' already exists with different content")
        except ConflictError as exc:
            raise Conflict(exc.message, field="scenario_id") from exc
        except CatalogError as exc:
            raise InvalidRequest(exc.message, field=exc.field) from exc
        if existing is None:
            previous = await self.store.put_record("scenarios", scenario.scenario_id, json.dumps(scenario.to_json()))
            if previous is not None and json.loads(previous) != scenario.to_json():
                raise Conflict(f"scenario '{scenario.scenario_id}' already exists with different content",
                               field="scenario_id")
            self.catalog.scenarios[scenario.scenario_id] = scenario
        return scenario

    async def _existing_scenario(self, scenario_id: str) -> Scenario | None:
        try:
            return await self.scenario(scenario_id)
        except NotFound:
            return None


def _env_from_record(record: str) -> Environment:
    data = json.loads(record)
    return build_environment(
        env_id=data["env_id"],
        class_name=data["class_name"],
        code=data["code"],
        summary=data.get("summary", ""),
        introduction=data.get("introduction", ""),
        rules=data.get("rules", []),
        tool_overrides=data.get("tools"),
    )
