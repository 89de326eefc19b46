"""Where the service finds environments and scenarios: the loaded catalogs, then the store.

Loaded catalogs are read-only and visible to every tenant. Environments and
scenarios created over the API belong to the tenant that added them: they are
written to the store under that tenant (so every replica sharing it serves
them), and other tenants get 404. A record is read from the store on every use
(one hash lookup), so a deletion is seen at once by every replica; what it
parses to is cached by the record's content, so a replica never re-analyses code.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import secrets
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sandbox.errors import RequestFailed, SandboxError
from sandbox.pool import EnvCode, WorkerPool
from service.catalog import Catalog, CatalogError, ConflictError, Environment, Scenario, build_environment
from service.problems import (
    Conflict,
    Forbidden,
    InvalidEnvironment,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    Unavailable,
)
from service.requirements import SETTING, AllowList, Packages
from service.scenario_index import Page, ScenarioIndex, ScenarioQuery, page
from service.store import BytesQuota, RecordLimit, SessionStore, stored_bytes

PARSED_CACHE = 512


def env_code(env: Environment) -> EnvCode:
    """What a worker runs; environments with the same code but other layers get hosts of their own."""
    key = env.code_hash
    if env.layers:
        key = hashlib.sha256("\0".join((key, *env.layers)).encode()).hexdigest()
    return EnvCode(key=key, env_id=env.env_id, class_name=env.class_name, code=env.code, layers=env.layers)


def invalid_packages(exc: CatalogError) -> InvalidEnvironment:
    """An environment's requirements or imports refused: 422 naming the field, and the setting."""
    extra = {"setting": SETTING} if exc.reason in ("requirement_not_allowed", "undeclared_import") else {}
    return InvalidEnvironment(f"{exc.reason}: {exc.message}", reason=exc.reason, field=exc.field or "requirements",
                              **extra)


class Registry:
    def __init__(self, catalog: Catalog, store: SessionStore, pool: WorkerPool, *,
                 max_environments: int = 100, max_scenarios: int = 10_000, max_tenant_bytes: int = 1 << 30,
                 packages: Packages | None = None) -> None:
        self.catalog = catalog
        self.packages = packages or Packages(AllowList([]), None)
        self.store = store
        self.pool = pool
        self.max_environments = max_environments
        self.max_scenarios = max_scenarios
        self.max_tenant_bytes = max_tenant_bytes
        self._parsed: OrderedDict[str, Any] = OrderedDict()  # record digest -> Environment | Scenario
        self._index: ScenarioIndex | None = None
        self._indexed_version = -1

    async def environment(self, env_id: str, tenant: str = "") -> Environment:
        """Raises NotFound."""
        env = self.catalog.environments.get(env_id)
        if env is not None:
            return env
        record = await self.store.get_record("environments", env_id, tenant=tenant)
        if record is None:
            raise NotFound(f"environment '{env_id}' not found")
        env = self._environment_from(record)
        if env.requirements:  # (the layer is found in memory after the first use on this replica)
            try:
                env = await self.packages.attach(env)
            except CatalogError as exc:
                raise invalid_packages(exc) from exc
        return env

    async def scenario(self, scenario_id: str, tenant: str = "") -> Scenario:
        """Raises NotFound."""
        scenario = self.catalog.scenarios.get(scenario_id)
        if scenario is not None:
            return scenario
        record = await self.store.get_record("scenarios", scenario_id, tenant=tenant)
        if record is None:
            raise NotFound(f"scenario '{scenario_id}' not found")
        return self._scenario_from(record)

    async def environments(self, tenant: str = "") -> list[Environment]:
        envs = dict(self.catalog.environments)
        for env_id, record in (await self.store.all_records("environments", tenant=tenant)).items():
            envs.setdefault(env_id, self._environment_from(record))
        return sorted(envs.values(), key=lambda e: e.env_id)

    def index(self) -> ScenarioIndex:
        """The loaded catalog's scenario index, built once (again only if the catalog changed)."""
        if self._index is None or self._indexed_version != self.catalog.version:
            self._index = ScenarioIndex(self.catalog.scenarios.values())
            self._indexed_version = self.catalog.version
        return self._index

    async def added_scenarios(self, tenant: str = "") -> list[Scenario]:
        """The scenarios ``tenant`` added over the API, by id (read from the store: every replica's additions)."""
        records = await self.store.all_records("scenarios", tenant=tenant)
        added = (self._scenario_from(r) for key, r in records.items() if key not in self.catalog.scenarios)
        return sorted(added, key=lambda s: s.scenario_id)

    async def matching(self, query: ScenarioQuery, tenant: str = "") -> tuple[Sequence[Scenario], list[Scenario]]:
        """What ``query`` selects, by id: from the loaded catalogs (indexed) and from what ``tenant`` added.

        Raises NotFound when ``query.env`` is not an environment the tenant sees.
        """
        if query.env is not None:
            await self.environment(query.env, tenant)
        added = [s for s in await self.added_scenarios(tenant) if query.matches(s)]
        return self.index().matching(query), added

    async def select(self, query: ScenarioQuery, tenant: str = "") -> Sequence[Scenario]:
        """Every scenario ``query`` selects for ``tenant``, by id. Raises NotFound as ``matching``."""
        loaded, added = await self.matching(query, tenant)
        return list(heapq.merge(loaded, added, key=lambda s: s.scenario_id)) if added else loaded

    async def scenario_page(self, query: ScenarioQuery, after: str | None, limit: int, tenant: str = "") -> Page:
        """The first ``limit`` scenarios ``query`` selects for ``tenant`` after the id ``after``. Raises NotFound."""
        loaded, added = await self.matching(query, tenant)
        return page(loaded, added, after, limit)

    async def scenario_counts(self, tenant: str = "") -> dict[str, int]:
        """Scenarios per environment id, as ``tenant`` sees them."""
        index = self.index()
        counts = {env_id: index.count(env_id) for env_id in self.catalog.environments}
        for scenario in await self.added_scenarios(tenant):
            counts[scenario.env_id] = counts.get(scenario.env_id, 0) + 1
        return counts

    async def add_environment(self, env: Environment, tenant: str = "") -> Environment:
        """Validate ``env`` in the sandbox and publish it for ``tenant``.

        Raises:
            Conflict: the id holds different code (or belongs to a loaded catalog).
            InvalidEnvironment: the code fails to load or to instantiate with ``{}``.
            QuotaExceeded: the tenant holds as many environments as it may.
        """
        existing: Environment | None = await self._existing(self.environment, env.env_id, tenant)
        if existing is not None:
            if existing.code_hash != env.code_hash:
                raise Conflict(f"environment '{env.env_id}' already exists with different code", field="env_id")
            return existing
        # The record is a little larger than the code: a tenant at its quota spends no sandbox time.
        await self._check_room(stored_bytes(env.code), tenant)
        try:
            env = await self.packages.attach(env)  # before the sandbox: a refused import never loads
        except CatalogError as exc:
            raise invalid_packages(exc) from exc
        try:
            failure = await self.pool.validate(env_code(env))
        except RequestFailed as exc:
            failure = {"kind": exc.kind, "message": exc.message}
        except SandboxError as exc:
            raise Unavailable(f"the sandbox could not validate the code: {exc.message}") from exc
        if failure is not None:
            raise InvalidEnvironment(f"{failure['kind']}: {failure['message']}", reason=failure["kind"])
        # The analysed tools travel with the record: replicas never parse the code again.
        env = replace(env, registration=secrets.token_hex(8))
        record = json.dumps({**env.manifest(), "code": env.code, "analysed_tools": env.tools,
                             "analysed_imports": env.imports, "registration": env.registration})
        previous = await self._put("environments", env.env_id, record, tenant, self.max_environments)
        if previous is not None:
            winner = self._environment_from(previous)
            if winner.code_hash != env.code_hash:
                raise Conflict(f"environment '{env.env_id}' already exists with different code", field="env_id")
            return winner
        return env

    async def add_scenario(self, scenario: Scenario, tenant: str = "") -> Scenario:
        """Raises NotFound (unknown env), InvalidRequest (a check does not parse), Conflict, QuotaExceeded."""
        probe = Catalog()
        probe.environments[scenario.env_id] = await self.environment(scenario.env_id, tenant)
        try:
            probe.add_scenario(scenario)
            existing = await self._existing(self.scenario, scenario.scenario_id, tenant)
            if existing is not None and existing.to_json() != scenario.to_json():
                raise ConflictError(f"scenario '{scenario.scenario_id}' already exists with different content")
        except ConflictError as exc:
            raise Conflict(exc.message, field="scenario_id") from exc
        except CatalogError as exc:
            raise InvalidRequest(exc.message, field=exc.field) from exc
        if existing is None:
            previous = await self._put("scenarios", scenario.scenario_id, json.dumps(scenario.to_json()), tenant,
                                       self.max_scenarios)
            if previous is not None and json.loads(previous) != scenario.to_json():
                raise Conflict(f"scenario '{scenario.scenario_id}' already exists with different content",
                               field="scenario_id")
        return scenario

    async def delete(self, kind: str, key: str, tenant: str = "") -> None:
        """Remove an environment or scenario the tenant added.

        Raises:
            Forbidden: it belongs to a loaded catalog (read-only to everyone).
            NotFound: the tenant holds no such record.
        """
        loaded = self.catalog.environments if kind == "environments" else self.catalog.scenarios
        if key in loaded:
            raise Forbidden(f"'{key}' belongs to a catalog loaded from disk; those are read-only")
        env = await self._existing(self.environment, key, tenant) if kind == "environments" else None
        if not await self.store.delete_record(kind, key, tenant=tenant):
            raise NotFound(f"{kind[:-1]} '{key}' not found")
        if env is not None and not self._in_use(env_code(env).key):
            self.pool.unload(env_code(env).key)  # its sessions' live processes end with its hosts

    def _in_use(self, code_key: str) -> bool:
        """Whether a catalog environment runs the same code (hosts are shared by code hash)."""
        return any(env_code(env).key == code_key for env in self.catalog.environments.values())

    async def _put(self, kind: str, key: str, record: str, tenant: str, limit: int) -> str | None:
        try:
            return await self.store.put_record(kind, key, record, tenant=tenant, limit=limit,
                                               quota=self.max_tenant_bytes)
        except RecordLimit as exc:
            raise QuotaExceeded(f"this tenant holds {limit} {kind}, its quota; delete some to add more",
                                quota=f"max_{kind}", value=limit, retry_after=3600) from exc
        except BytesQuota as exc:
            raise self._over(exc.used, exc.needed) from None

    async def _check_room(self, needed: int, tenant: str) -> None:
        used = await self.store.usage(tenant)
        if used + needed > self.max_tenant_bytes:
            raise self._over(used, needed)

    def _over(self, used: int, needed: int) -> QuotaExceeded:
        return QuotaExceeded(f"the tenant stores {used} bytes; {needed} more would pass its quota of "
                             f"{self.max_tenant_bytes}; nothing was stored", quota="max_tenant_bytes",
                             value=self.max_tenant_bytes, used=used, needed=needed, retry_after=60)

    @staticmethod
    async def _existing(lookup: Any, key: str, tenant: str) -> Any:
        try:
            return await lookup(key, tenant)
        except NotFound:
            return None

    def _cached(self, record: str, build: Any) -> Any:
        digest = hashlib.sha256(record.encode("utf-8", "surrogatepass")).hexdigest()
        parsed = self._parsed.get(digest)
        if parsed is None:
            parsed = build(json.loads(record))
            self._parsed[digest] = parsed
            if len(self._parsed) > PARSED_CACHE:
                self._parsed.popitem(last=False)
        else:
            self._parsed.move_to_end(digest)
        return parsed

    def _environment_from(self, record: str) -> Environment:
        env: Environment = self._cached(record, _env_from_record)
        return env

    def _scenario_from(self, record: str) -> Scenario:
        scenario: Scenario = self._cached(record, Scenario.from_json)
        return scenario


def _env_from_record(data: dict[str, Any]) -> Environment:
    if "analysed_tools" not in data:  # written before records carried their analysis
        built = build_environment(env_id=data["env_id"], class_name=data["class_name"], code=data["code"],
                                  summary=data.get("summary", ""), introduction=data.get("introduction", ""),
                                  rules=data.get("rules", []), tool_overrides=data.get("tools"),
                                  requirements=data.get("requirements"), check_state=False)
        return replace(built, registration=data.get("registration", ""))
    return Environment(
        env_id=data["env_id"],
        class_name=data["class_name"],
        code=data["code"],
        summary=data.get("summary", ""),
        introduction=data.get("introduction", ""),
        rules=list(data.get("rules", [])),
        tool_overrides=data.get("tools") or {},
        tools=data["analysed_tools"],
        provenance=data.get("provenance"),
        registration=data.get("registration", ""),  # records written before registrations had none
        requirements=list(data.get("requirements") or []),
        imports=list(data.get("analysed_imports") or []),
    )
