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
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypeVar

from cachetools import LRUCache

from sandbox.errors import RequestFailed, SandboxError
from sandbox.pool.calls import EnvCode
from sandbox.pool.requests import WorkerPool
from service.catalog.admission import build_environment
from service.catalog.collection import Catalog
from service.catalog.model import CatalogError, ConflictError, Environment, Scenario
from service.catalog.requirements import SETTING, AllowList, Packages
from service.catalog.scenario_index import Page, ScenarioIndex, ScenarioQuery, page
from service.catalog.versions import chosen, key, split, tool_changes
from service.errors import Conflict, Forbidden, InvalidEnvironment, InvalidRequest, NotFound, QuotaExceeded, Unavailable
from service.stores.store import BytesQuota, RecordLimit, SessionStore, stored_bytes

PARSED_CACHE = 512
T = TypeVar("T")
# Every version of an id is a record of its own, in a kind of its own (so they count against the
# tenant's bytes, not its number of environments or scenarios).
VERSIONS = {"environments": "environment_versions", "scenarios": "scenario_versions"}
SHARED = ""  # the tenant whose records hold the loaded catalogs' versions: every tenant sees those


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
        self._parsed: LRUCache[str, Any] = LRUCache(maxsize=PARSED_CACHE)  # record digest -> Environment | Scenario
        self._index: ScenarioIndex | None = None
        self._indexed_version = -1
        self._published: set[str] = set()  # catalog versions this process has stored (see ``publish``)

    async def environment(self, env_id: str, tenant: str = "") -> Environment:
        """The latest version of ``env_id``, or the one ``env_id@<digest prefix or label>`` names.

        Raises NotFound (InvalidRequest for an ambiguous prefix)."""
        name, selector = split(env_id)
        if selector is not None:
            return await self._attached(chosen("environment", name, selector,
                                               await self.environment_versions(name, tenant)))
        env = self.catalog.environments.get(env_id)
        if env is not None:
            return env
        record = await self.store.get_record("environments", env_id, tenant=tenant)
        if record is None:
            raise NotFound(f"environment '{env_id}' not found")
        return await self._attached(self._environment_from(record))

    async def _attached(self, env: Environment) -> Environment:
        if env.requirements and not env.layers:  # (the layer is found in memory after the first use here)
            try:
                env = await self.packages.attach(env)
            except CatalogError as exc:
                raise invalid_packages(exc) from exc
        return env

    async def scenario(self, scenario_id: str, tenant: str = "") -> Scenario:
        """The latest version of ``scenario_id``, or the one ``scenario_id@<prefix or label>`` names.

        Raises NotFound."""
        name, selector = split(scenario_id)
        if selector is not None:
            return chosen("scenario", name, selector, await self.scenario_versions(name, tenant))
        scenario = self.catalog.scenarios.get(scenario_id)
        if scenario is not None:
            return scenario
        record = await self.store.get_record("scenarios", scenario_id, tenant=tenant)
        if record is None:
            raise NotFound(f"scenario '{scenario_id}' not found")
        return self._scenario_from(record)

    # -- versions -------------------------------------------------------------------------------
    async def environment_versions(self, env_id: str, tenant: str = "") -> list[Environment]:
        """Every version of ``env_id`` this tenant sees, oldest first (a loaded catalog's current
        one last among those of its own)."""
        found = {env.version: env for env in map(self._environment_from, await self._versions("environments",
                                                                                                env_id, tenant))}
        current = self.catalog.environments.get(env_id)
        if current is not None:
            found.pop(current.version, None)
            found[current.version] = current
        return list(found.values())

    async def scenario_versions(self, scenario_id: str, tenant: str = "") -> list[Scenario]:
        found = {s.version: s for s in map(self._scenario_from, await self._versions("scenarios", scenario_id, tenant))}
        current = self.catalog.scenarios.get(scenario_id)
        if current is not None:
            found.pop(current.version, None)
            found[current.version] = current
        return list(found.values())

    async def _versions(self, kind: str, name: str, tenant: str) -> list[str]:
        records: dict[str, str] = {}
        for owner in dict.fromkeys((SHARED, tenant)):
            every = await self.store.all_records(VERSIONS[kind], tenant=owner)
            records.update((k, v) for k, v in every.items() if split(k)[0] == name)
        return sorted(records.values(), key=lambda r: float(json.loads(r).get("added_at") or 0))

    async def pinned_environment(self, env_id: str, version: str, registration: str, tenant: str) -> Environment | None:
        """The version of ``env_id`` a session started on, if that registration of it still exists."""
        for owner in dict.fromkeys((tenant, SHARED)):
            record = await self.store.get_record(VERSIONS["environments"], key(env_id, version), tenant=owner)
            if record is not None:
                env = self._environment_from(record)
                if env.registration == registration:
                    return await self._attached(env)
        return None

    async def pinned_scenario(self, scenario_id: str, version: str, tenant: str) -> Scenario | None:
        for owner in dict.fromkeys((tenant, SHARED)):
            record = await self.store.get_record(VERSIONS["scenarios"], key(scenario_id, version), tenant=owner)
            if record is not None:
                return self._scenario_from(record)
        return None

    async def publish(self, env: Environment, scenario: Scenario | None) -> None:
        """Keep the loaded catalog's versions a session starts on, so that it goes on with them
        after a restart serves changed files under the same ids (once per version and process)."""
        if self.catalog.environments.get(env.env_id) is env and env.version not in self._published:
            await self.store.put_record(VERSIONS["environments"], key(env.env_id, env.version),
                                        _env_record(env), tenant=SHARED)
            self._published.add(env.version)
        if scenario is not None and self.catalog.scenarios.get(scenario.scenario_id) is scenario \
                and scenario.version not in self._published:
            await self.store.put_record(VERSIONS["scenarios"], key(scenario.scenario_id, scenario.version),
                                        json.dumps(scenario.to_json()), tenant=SHARED)
            self._published.add(scenario.version)

    async def version_list(self, env_id: str, tenant: str = "") -> list[dict[str, Any]]:
        """``env_id``'s versions, oldest first, each with what changed in its tools from the one before."""
        latest = await self.environment(env_id, tenant)
        listed, before = [], None
        for env in await self.environment_versions(env_id, tenant):
            listed.append({"version": env.version, "label": env.label or None, "added_at": env.added_at or None,
                           "latest": env.version == latest.version, "tools": sorted(env.tool_names),
                           "changes": tool_changes(before.tools if before else [], env.tools)})
            before = env
        return listed

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

    async def add_environment(self, env: Environment, tenant: str = "", label: str | None = None) -> Environment:
        """Validate ``env`` in the sandbox and publish it for ``tenant`` as the latest version of its
        id (other code under an existing id is a new version; the same code is the version it was).

        Raises:
            Conflict: the id belongs to a loaded catalog, or ``label`` names another version.
            InvalidEnvironment: the code fails to load or to instantiate with ``{}``.
            QuotaExceeded: the tenant holds as many environments as it may.
        """
        loaded = self.catalog.environments.get(env.env_id)
        if loaded is not None:
            if loaded.version != env.version:
                raise Conflict(f"environment '{env.env_id}' belongs to a catalog loaded from disk, with other code; "
                               "a new version of it goes in that catalog's folder", field="env_id")
            return loaded
        versions = await self.environment_versions(env.env_id, tenant)
        same = next((v for v in versions if v.version == env.version), None)
        if label and any(v.label == label and v.version != env.version for v in versions):
            raise Conflict(f"environment '{env.env_id}' already has a version labelled '{label}'", field="label")
        if same is not None:  # a version it had: the latest again (with the label given, if any)
            if label and same.label != label:
                same = replace(same, label=label)
                try:
                    await self.store.set_record(VERSIONS["environments"], key(same.env_id, same.version),
                                                _env_record(same), tenant=tenant, quota=self.max_tenant_bytes)
                except BytesQuota as exc:
                    raise self._over(exc.used, exc.needed) from None
            return await self._made_latest("environments", env.env_id, same, _env_record(same), tenant)
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
        env = replace(env, registration=secrets.token_hex(8), label=label or "", added_at=time.time())
        record = _env_record(env)
        await self._put(VERSIONS["environments"], key(env.env_id, env.version), record, tenant, None)
        return await self._made_latest("environments", env.env_id, env, record, tenant)

    async def _made_latest(self, kind: str, name: str, made: T, record: str, tenant: str) -> T:
        """Make ``record`` (a version of ``name``) the one its bare id names."""
        limit = self.max_environments if kind == "environments" else self.max_scenarios
        previous = await self._put(kind, name, record, tenant, limit)  # (a new id counts against the limit)
        if previous is not None and previous != record:
            try:
                await self.store.set_record(kind, name, record, tenant=tenant, quota=self.max_tenant_bytes)
            except BytesQuota as exc:
                raise self._over(exc.used, exc.needed) from None
        return made

    async def add_scenario(self, scenario: Scenario, tenant: str = "", label: str | None = None) -> Scenario:
        """Publish ``scenario`` as the latest version of its id (other content under an existing id
        is a new version).

        Raises NotFound (unknown env), InvalidRequest (a check does not parse), Conflict, QuotaExceeded."""
        probe = Catalog()
        probe.environments[scenario.env_id] = await self.environment(scenario.env_id, tenant)
        loaded = self.catalog.scenarios.get(scenario.scenario_id)
        if loaded is not None and loaded.version != scenario.version:
            raise Conflict(f"scenario '{scenario.scenario_id}' belongs to a catalog loaded from disk, with other "
                           "content", field="scenario_id")
        try:
            probe.add_scenario(scenario)
        except ConflictError as exc:
            raise Conflict(exc.message, field="scenario_id") from exc
        except CatalogError as exc:
            raise InvalidRequest(exc.message, field=exc.field) from exc
        if loaded is not None:
            return loaded
        versions = await self.scenario_versions(scenario.scenario_id, tenant)
        if label and any(v.label == label and v.version != scenario.version for v in versions):
            raise Conflict(f"scenario '{scenario.scenario_id}' already has a version labelled '{label}'",
                           field="label")
        same = next((v for v in versions if v.version == scenario.version), None)
        if same is None or same.to_json() != scenario.to_json() or (label and same.label != label):
            # a new version, or new labels (split, tags, its name) on one: those are not its content
            same = replace(scenario, label=label or (same.label if same else ""),
                           added_at=same.added_at if same else time.time())
            try:
                await self.store.set_record(VERSIONS["scenarios"], key(same.scenario_id, same.version),
                                            _scenario_record(same), tenant=tenant, quota=self.max_tenant_bytes)
            except BytesQuota as exc:
                raise self._over(exc.used, exc.needed) from None
        latest: Scenario | None = await self._existing(self.scenario, scenario.scenario_id, tenant)
        if latest is not None and latest.to_json() == same.to_json() and latest.label == same.label:
            return latest
        return await self._made_latest("scenarios", scenario.scenario_id, same, _scenario_record(same), tenant)

    async def delete(self, kind: str, name: str, tenant: str = "") -> None:
        """Remove an environment or scenario the tenant added, with every version of it.

        Raises:
            Forbidden: it belongs to a loaded catalog (read-only to everyone).
            NotFound: the tenant holds no such record.
        """
        loaded = self.catalog.environments if kind == "environments" else self.catalog.scenarios
        if name in loaded:
            raise Forbidden(f"'{name}' belongs to a catalog loaded from disk; those are read-only")
        envs = await self.environment_versions(name, tenant) if kind == "environments" else []
        if not await self.store.delete_record(kind, name, tenant=tenant):
            raise NotFound(f"{kind[:-1]} '{name}' not found")
        for version in [k for k in await self.store.all_records(VERSIONS[kind], tenant=tenant) if split(k)[0] == name]:
            await self.store.delete_record(VERSIONS[kind], version, tenant=tenant)  # every version goes with the id
        for env in envs:
            if not self._in_use(env_code(env).key):
                self.pool.unload(env_code(env).key)  # its sessions' live processes end with its hosts

    def _in_use(self, code_key: str) -> bool:
        """Whether a catalog environment runs the same code (hosts are shared by code hash)."""
        return any(env_code(env).key == code_key for env in self.catalog.environments.values())

    async def _put(self, kind: str, key: str, record: str, tenant: str, limit: int | None) -> str | None:
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
        return parsed

    def _environment_from(self, record: str) -> Environment:
        env: Environment = self._cached(record, _env_from_record)
        return env

    def _scenario_from(self, record: str) -> Scenario:
        scenario: Scenario = self._cached(record, _scenario_from_record)
        return scenario


def _env_record(env: Environment) -> str:
    return json.dumps({**env.manifest(), "code": env.code, "analysed_tools": env.tools,
                       "analysed_imports": env.imports, "registration": env.registration,
                       **({"label": env.label} if env.label else {}),
                       **({"added_at": env.added_at} if env.added_at else {})})


def _scenario_record(scenario: Scenario) -> str:
    return json.dumps({**scenario.to_json(), **({"label": scenario.label} if scenario.label else {}),
                       **({"added_at": scenario.added_at} if scenario.added_at else {})})


def _scenario_from_record(data: dict[str, Any]) -> Scenario:
    scenario = Scenario.from_json(data)
    if data.get("label") or data.get("added_at"):
        scenario = replace(scenario, label=str(data.get("label") or ""), added_at=float(data.get("added_at") or 0))
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
        label=str(data.get("label") or ""),
        added_at=float(data.get("added_at") or 0),
    )
