"""The session engine: create, call, observe, score and fork sessions.

State lives only in the store; this object holds nothing per session, so any
replica can serve any request and a restart loses nothing.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from sandbox.errors import RequestFailed, SandboxBusy, SandboxError
from sandbox.fairness import FairGate, NoSlot
from sandbox.pool.calls import CallOutcome, Stored
from sandbox.pool.requests import WorkerPool
from sandbox.state import deltas
from sandbox.worker import randomness
from service.catalog.arguments import ArgumentChecker, ArgumentLimit
from service.catalog.model import Environment, Scenario
from service.catalog.registry import Registry, env_code
from service.catalog.versions import split
from service.engine import idempotency, past, rewind, steps, turns
from service.engine.offload import Offload, ViewError
from service.engine.replays import ReplayBudget, ReplayCache
from service.engine.template_keys import NotUnicode, config_key
from service.engine.user_llm import Exchange, UserSimulator
from service.engine.user_llm import UserLLMFailed as UserEndpointFailed
from service.errors import (
    Conflict,
    ConversationEnded,
    InvalidEnvironment,
    InvalidRequest,
    LimitExceeded,
    NotConversation,
    NotFound,
    QuotaExceeded,
    SessionBusy,
    Unavailable,
    UserLLMFailed,
    UserLLMUnavailable,
)
from service.observability import Metrics
from service.stores.store import (
    BytesQuota,
    Held,
    LocalLocks,
    LockTimeout,
    SessionMeta,
    SessionStore,
    Snapshot,
    StoreError,
    digest_of,
    new_session_id,
)

TEMPLATE_KEYS = 4096  # scenarios whose template key is kept
DIGEST_TEXT_BYTES = 64 << 20  # initial states whose digest is kept, by the size of their texts
# The lock lease outlives the longest call (see WorkerPool.longest_request) with room to commit.
LEASE_SLACK = 15.0
# Sessions whose meta this replica keeps from its own last commit, for calls made without the lock.
WARM_SESSIONS = 65536
LOAD_FAILURES = frozenset({"syntax_error", "import_error", "load_error", "load_timeout", "missing_class"})


@dataclass
class Created:
    metas: list[SessionMeta]
    env: Environment
    scenario: Scenario | None

    @property
    def meta(self) -> SessionMeta:
        return self.metas[0]


@dataclass(frozen=True)
class SessionLimits:
    """Bounds on what one session or tenant may hold or take; each is named in the problem it raises."""

    max_steps: int = 10_000
    max_sessions: int = 10_000  # live sessions (forks included) per tenant
    max_record_bytes: int = 256 * 1024
    score_budget: float = 20.0
    rewind_budget: float = 30.0  # replaying steps to show or fork a past state
    replay_seconds: float = 60.0  # of replay one tenant may use per minute (see ``service.engine.replays``)
    max_tenant_replays: int = 2  # replays one tenant runs at once
    replay_cache_entries: int = 1024  # past states rebuilt by replay, kept
    replay_cache_bytes: int = 64 << 20  # and their size
    tenant_sandbox_share: float = 1.0  # of the sandbox workers one tenant may hold even when nobody waits
    max_tenant_bytes: int = 1 << 30  # what one tenant's sessions and catalog records may store
    sandbox_reserve: int = 0  # sandbox workers kept for tenants that hold none (see FairGate)


@dataclass
class Applied:
    """A committed step record, and whether it answers an earlier request with the same key."""

    record: dict[str, Any]
    replayed: bool = False


class Sessions:
    def __init__(self, registry: Registry, store: SessionStore, pool: WorkerPool, lock_wait: float,
                 user: UserSimulator | None = None, offload: Offload | None = None,
                 limits: SessionLimits | None = None, metrics: Metrics | None = None) -> None:
        self.offload = offload or Offload()
        self.metrics = metrics or Metrics()
        self.limits = limits or SessionLimits()
        self.gate = FairGate(pool.size, self.limits.tenant_sandbox_share, self.limits.sandbox_reserve)
        self.metrics.sandbox_bounds.labels("cap").set(self.gate.cap)
        self.metrics.sandbox_bounds.labels("reserve").set(self.gate.reserve)
        self.metrics.sandbox_reserved.set_function(lambda: self.gate.reserved_grants)
        self.replayed = ReplayCache(self.limits.replay_cache_entries, self.limits.replay_cache_bytes)
        self.replay_budget = ReplayBudget(self.limits.replay_seconds, self.limits.max_tenant_replays,
                                          self.metrics.replay_seconds.inc)
        self.registry = registry
        self.store = store
        self.pool = pool
        self.lock_wait = lock_wait
        self.user = user
        self._checkers: dict[tuple[str, str], ArgumentChecker] = {}
        # (tenant, scenario) -> (its config, the code hash, its template key)
        self._templates: dict[tuple[str, str], tuple[dict[str, Any], str, str]] = {}
        # id of an initial state's text -> (the text, its digest): the pool hands the same text object
        # to every session of a template, so its digest is computed once, here, never taken from a worker
        self._digests: OrderedDict[int, tuple[str, str]] = OrderedDict()
        self._digest_bytes = 0
        # Sessions this replica committed last and whose process the pool calls straight: their
        # meta as that commit left it, so their next call needs no lock and no read (``_unlocked``).
        self._warm: OrderedDict[str, Snapshot] = OrderedDict()
        # One call per session at a time in this replica, whichever way it goes: a call made
        # without the store's lock must not run beside one that read the meta under it.
        self._turns = LocalLocks()
        # Turn-based scenarios (``service.engine.turns``): which turn a session is in, its tools, its end.
        self.turns = turns.Turns(self)

    async def create(self, scenario_id: str | None, env_id: str | None, init_config: dict[str, Any] | None, *,
                     n: int = 1, mode: str = "task", tenant: str = "", seed: int | None = None,
                     group_seeds: str = "derived", idle_ttl: float | None = None) -> Created:
        """Create ``n`` sessions sharing one initial state (all or none); with ``seed``, every draw
        is reproducible (see ``_streams`` for a group's); with ``idle_ttl``, they expire that many
        seconds after their last call instead of after the store's TTL.

        Raises:
            InvalidRequest: ``idle_ttl`` is longer than the store's TTL, the longest a session idles."""
        if idle_ttl is not None and idle_ttl > self.store.ttl:
            message = f"at most {self.store.ttl:g}: this service keeps an idle session no longer"
            # (named as a body that fails validation names its field, so clients read one shape)
            raise InvalidRequest(f"idle_ttl_seconds: {message}", field="idle_ttl_seconds",
                                 errors=[{"field": "idle_ttl_seconds", "message": message}])
        scenario = await self.registry.scenario(scenario_id, tenant) if scenario_id else None
        # (with a scenario, its environment's latest version, unless ``env_id`` names one of that id)
        if scenario is not None and env_id is not None and split(env_id)[0] != scenario.env_id:
            raise InvalidRequest(f"env_id '{env_id}' is not a version of the scenario's environment "
                                 f"'{scenario.env_id}'", field="env_id")
        env = await self.registry.environment(str(env_id) if env_id is not None else scenario.env_id
                                              if scenario else "", tenant)
        config = scenario.init_config if scenario else (init_config or {})
        # Keyed once per scenario (its config's text is checked then too); a config from the body
        # at the cost of a pass of ``marshal`` over it (see ``service.engine.template_keys``).
        try:
            template = self._template_key(tenant, env, scenario.scenario_id if scenario else None, config)
        except NotUnicode as exc:
            raise InvalidRequest(str(exc), field="init_config") from None
        if mode == "conversation" and scenario is None:
            raise InvalidRequest("conversation mode needs a scenario_id: the simulated user holds its task",
                                 field="mode")
        turns.check_mode(scenario, mode)
        ids = [new_session_id() for _ in range(n)]
        first, streams, seeds = _streams(n, seed, group_seeds)
        async with self._admitted(tenant, ids, idle_ttl):  # a tenant over its quota costs no sandbox or LLM time
            opening = await self._user_opening(scenario.task) if scenario and mode == "conversation" else None
            # A single session keeps the instance its init made live in the sandbox for its first call.
            state = await self._initial_state(env, config, tenant, ids[0] if n == 1 else None, template,
                                              stream=first, seed=seed)
            now = time.time()
            await self._store(self.registry.publish(env, scenario))
            metas = [SessionMeta(sid, env.env_id, scenario.scenario_id if scenario else None, now, tenant=tenant,
                                 mode=mode, opening=opening, env_registration=env.registration, stream=stream,
                                 seed=own, env_version=env.version,
                                 scenario_version=scenario.version if scenario else "", idle_ttl=idle_ttl)
                     for sid, stream, own in zip(ids, streams, seeds, strict=True)]
            digest = self._digest(state)
            try:
                await self._store(self._quota(self.store.create_group(
                    metas, state, state, [], quota=self.limits.max_tenant_bytes, initial_digest=digest)))
            except BaseException:
                self.pool.forget(ids[0])
                raise
        if n == 1:  # its first call too needs no lock and no read (see ``_unlocked``)
            self._warm_at(Snapshot(metas[0], "", "", now + metas[0].ttl(self.store.ttl), initial_digest=digest,
                                   state_digest=digest))
        self.metrics.sessions.labels("create").inc(n)
        return Created(metas, env, scenario)

    def _digest(self, state: str) -> str:
        """The content address of an initial state (the store keeps it once per tenant and digest)."""
        known = self._digests.get(id(state))
        if known is not None and known[0] is state:
            self._digests.move_to_end(id(state))
            return known[1]
        digest = digest_of(state)
        self._digests[id(state)] = (state, digest)
        self._digest_bytes += len(state)
        while self._digest_bytes > DIGEST_TEXT_BYTES and len(self._digests) > 1:
            self._digest_bytes -= len(self._digests.popitem(last=False)[1][0])
        return digest

    def _template_key(self, tenant: str, env: Environment, scenario_id: str | None, config: dict[str, Any]) -> str:
        """Names one initial state (same code, same config, same tenant): sandbox workers build it
        once and start each session made from it as a fork of it. A scenario's key is kept while
        its config is the same object, so a large scenario is not keyed again for every session.

        Raises:
            NotUnicode: the config holds a lone surrogate."""
        if scenario_id is not None:
            known = self._templates.get((tenant, scenario_id))
            if known is not None and known[0] is config and known[1] == env.code_hash:
                return known[2]
        key = config_key(tenant, env.code_hash, config)
        if scenario_id is not None:
            self._templates[(tenant, scenario_id)] = (config, env.code_hash, key)
            while len(self._templates) > TEMPLATE_KEYS:
                self._templates.pop(next(iter(self._templates)))
        return key

    async def _initial_state(self, env: Environment, config: dict[str, Any], tenant: str, session: str | None,
                             template: str | None = None, *, stream: str | None = None,
                             seed: int | None = None) -> str:
        try:
            async with self._sandbox_slot(tenant):
                return await self.pool.init_state(env_code(env), config, session, template, deltas=True,
                                                  stream=stream, seed=seed)
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

    @asynccontextmanager
    async def _admitted(self, tenant: str, ids: list[str], idle_ttl: float | None = None) -> AsyncIterator[None]:
        """Count ``ids`` against the tenant's quota of live sessions; uncount them if creation fails."""
        live = await self._store(self.store.admit(tenant, ids, self.limits.max_sessions, idle_ttl))
        if live is not None:
            raise QuotaExceeded(f"this tenant has {live} live sessions and may hold {self.limits.max_sessions}; "
                                "delete finished sessions or wait for idle ones to expire", quota="max_sessions",
                                value=self.limits.max_sessions, retry_after=60)
        try:
            yield
        except BaseException:
            await self._store(self.store.forget(tenant, ids))
            raise


    async def _quota(self, write: Any) -> Any:
        """A store write that counts against the tenant's stored-bytes quota; refused whole past it."""
        try:
            return await write
        except BytesQuota as exc:
            raise QuotaExceeded(f"{exc}; nothing was stored. Delete sessions (or environments and scenarios) this "
                                "tenant no longer needs, or wait for idle sessions to expire",
                                quota="max_tenant_bytes", value=exc.quota, used=exc.used, needed=exc.needed,
                                retry_after=60) from None

    def _simulator(self) -> UserSimulator:
        if self.user is None:
            raise UserLLMUnavailable("conversation mode needs a simulated user: set ENVFOUNDRY_USER_LLM_BASE_URL "
                                     "(and ENVFOUNDRY_USER_LLM_MODEL, ENVFOUNDRY_USER_LLM_API_KEY) on the service")
        return self.user

    async def _user_opening(self, task: str) -> str:
        try:
            return await self._simulator().opening(task)
        except UserEndpointFailed as exc:
            raise UserLLMFailed(f"{exc}; nothing was created") from exc

    async def snapshot(self, session_id: str, *, trajectory: bool = False, tenant: str = "",
                       blobs: bool = True, current: bool = True) -> Snapshot:
        snap: Snapshot | None = await self._store(self.store.load(session_id, trajectory=trajectory, blobs=blobs,
                                                                  current=current))
        visible = self._visible(snap, session_id, tenant)
        await self.environment_of(visible)  # a session whose environment was deleted is gone
        return visible

    @staticmethod
    def _visible(snap: Snapshot | None, session_id: str, tenant: str) -> Snapshot:
        # Another tenant's session is reported exactly like a missing one.
        if snap is None or snap.meta.tenant != tenant:
            raise NotFound(f"session '{session_id}' not found (it may have expired)")
        return snap

    async def live(self, offset: int, limit: int, *, tenant: str = "") -> tuple[list[Snapshot], int]:
        """A page of the tenant's live sessions (those that expired or were deleted meanwhile are left out)."""
        ids, total = await self._store(self.store.live(tenant, offset, limit))
        # Meta only, read at once: a page of an RL batch's sessions may hold gigabytes of state.
        snaps = await asyncio.gather(*(self._store(self.store.load(sid, blobs=False)) for sid in ids))
        kept = []
        for snap in snaps:
            if snap is None or snap.meta.tenant != tenant:
                continue
            try:
                await self.environment_of(snap)
            except NotFound:  # its environment was deleted: it is gone now, and no longer counted
                total -= 1
                continue
            kept.append(snap)
        return kept, total

    async def environment_of(self, snap: Snapshot) -> Environment:
        """The environment the session was made from.

        Raises:
            NotFound: that registration of the environment was deleted (the id may have been added
                again since, with other code or the same). The session is removed then, so every
                later request, listings included, finds it gone.
        """
        meta = snap.meta
        try:
            env: Environment | None = await self.registry.environment(meta.env_id, meta.tenant)
        except NotFound:
            env = None
        if env is not None and env.registration == meta.env_registration and meta.env_version in ("", env.version):
            return env
        if meta.env_version:  # the version it started on, while that registration of it exists
            env = await self._store(self.registry.pinned_environment(meta.env_id, meta.env_version,
                                                                     meta.env_registration, meta.tenant))
            if env is not None:
                return env
        session_id = snap.meta.session_id
        self.pool.end_session(session_id)
        self._warm.pop(session_id, None)
        if await self._store(self.store.delete(session_id)):
            await self._store(self.store.forget(snap.meta.tenant, [session_id]))
        raise NotFound(f"session '{session_id}' not found: its environment '{snap.meta.env_id}' was deleted")

    async def _template_scenario(self, snap: Snapshot) -> Scenario | None:
        """The scenario whose initial state a session's state is kept against, if it is."""
        if not snap.state_digest or snap.state_digest != snap.initial_digest:
            return None
        try:
            return await self.scenario_of(snap)
        except NotFound:
            return None

    async def scenario_of(self, snap: Snapshot) -> Scenario | None:
        """The version of its scenario the session started on (its task, initial state and checks)."""
        meta = snap.meta
        if meta.scenario_id is None:
            return None
        try:
            scenario = await self.registry.scenario(meta.scenario_id, meta.tenant)
        except NotFound:
            scenario = None
        if scenario is not None and meta.scenario_version in ("", scenario.version):
            return scenario
        pinned: Scenario | None = await self._store(self.registry.pinned_scenario(
            meta.scenario_id, meta.scenario_version, meta.tenant))
        if pinned is not None:
            return pinned
        raise NotFound(f"the scenario '{meta.scenario_id}' of session '{meta.session_id}' was deleted")

    async def call(self, session_id: str, name: str, raw_arguments: dict[str, Any] | str, *,
                   key: str | None = None, tenant: str = "") -> Applied:
        """Apply one tool call exactly once. Tool failures are returned, not raised.

        With an idempotency ``key``, a retry of the same call (on any replica, after any crash)
        returns the step the first attempt committed instead of applying it again.
        """
        print_ = idempotency.fingerprint("call", {"name": name, "arguments": raw_arguments}) if key else ""
        try:
            async with self._turns.hold(session_id, self.lock_wait):
                warm = self._warm.get(session_id)
                if warm is not None and warm.meta.tenant == tenant and self.pool.lends(session_id, warm.meta.step):
                    # No lock and no read: one round trip to the store, the commit, which refuses if
                    # the session moved on, another caller holds its lock, or ``key`` was used.
                    applied = await self._step(warm, name, raw_arguments, key, print_, None)
                    if applied is not None:
                        return applied
                return await self._locked(session_id, name, raw_arguments, key, print_, tenant)
        except LockTimeout as exc:
            raise SessionBusy(str(exc)) from exc
        except StoreError as exc:
            raise Unavailable(str(exc)) from exc
        except SandboxBusy as exc:
            raise Unavailable(exc.message) from exc

    async def _locked(self, session_id: str, name: str, raw_arguments: dict[str, Any] | str, key: str | None,
                      print_: str, tenant: str) -> Applied:
        """A call under the store's lock on the session, which ``begin`` takes with the meta."""
        lease = self.pool.longest_request + LEASE_SLACK
        # One round trip takes the lock and reads the meta; the state is read only if no sandbox
        # worker holds the session live at this step; the commit releases the lock.
        async with self.store.begin(session_id, self.lock_wait, lease) as held:
            snap = self._visible(held.snap, session_id, tenant)
            replay = await self._replay(session_id, key, print_)
            if replay is not None:
                return replay
            applied = await self._step(snap, name, raw_arguments, key, print_, held)
        assert applied is not None  # (under the lock a refused commit raises)
        return applied

    async def _step(self, snap: Snapshot, name: str, raw_arguments: dict[str, Any] | str, key: str | None,
                    print_: str, held: Held | None) -> Applied | None:
        """Run the call on ``snap``'s session and commit its step: under the store's lock (``held``),
        or without it, on a session this replica committed last and whose process the pool calls
        straight. None when a commit without the lock was refused: nothing is applied, and the
        caller goes the usual way (the process ran the call, so it is dropped, and the call runs
        again from the stored state)."""
        session_id = snap.meta.session_id
        self._check_steps(snap)
        env = await self.environment_of(snap)
        try:
            async with self._sandbox_slot(snap.meta.tenant):
                arguments, outcome = await self._run(env, snap, name, raw_arguments)
            record = steps.call_step(snap.meta.step + 1, name, arguments, outcome)
            digest = await self._commit(snap, outcome.state, record, key=key, print_=print_, held=held,
                                        delta=outcome.delta, rebase=outcome.rebase, unlocked=held is None)
        except BaseException:
            self._drop_live(session_id)
            raise
        if digest is None:
            self._drop_live(session_id)
            return None
        self._keep_warm(snap, digest)
        self.metrics.tool_calls.labels("ok" if record["ok"] else record["error"]["type"]).inc()
        return Applied(record)

    def _drop_live(self, session_id: str) -> None:
        """The session's live instance may hold a step that was not committed: never use it again."""
        self.pool.forget(session_id)
        self._warm.pop(session_id, None)

    def _keep_warm(self, snap: Snapshot, digest: str) -> None:
        """Keep the meta the commit just made of ``snap``, while the pool calls the session straight."""
        self._warm_at(replace(snap, meta=replace(snap.meta, step=snap.meta.step + 1), state_digest=digest))

    def _warm_at(self, snap: Snapshot) -> None:
        session_id = snap.meta.session_id
        self._warm.pop(session_id, None)
        if not self.pool.lends(session_id, snap.meta.step):
            return
        self._warm[session_id] = snap
        while len(self._warm) > WARM_SESSIONS:
            self._warm.popitem(last=False)

    async def message(self, session_id: str, content: str, *, key: str | None = None, tenant: str = "") -> Applied:
        """Send the agent's message to the simulated user; the exchange becomes a step."""
        self._warm.pop(session_id, None)
        print_ = idempotency.fingerprint("message", {"content": content})
        lease = self.user_timeout + LEASE_SLACK
        try:
            async with self.store.lock(session_id, self.lock_wait, lease):
                snap = await self.snapshot(session_id, trajectory=True, tenant=tenant)
                if snap.meta.mode != "conversation":
                    raise NotConversation(f"session '{session_id}' is in task mode; create it with "
                                          "mode 'conversation' to talk to a simulated user")
                replay = await self._replay(session_id, key, print_)
                if replay is not None:
                    return replay
                if snap.meta.done:
                    raise ConversationEnded("the simulated user has ended this conversation; score the session")
                self._check_steps(snap)
                scenario = await self.scenario_of(snap)
                assert scenario is not None  # conversation sessions are made from scenarios only
                exchanges = [Exchange(r["content"], r["reply"]) for r in map(json.loads, snap.trajectory)
                             if r.get("kind") == "message"]
                try:
                    reply = await self._simulator().reply(scenario.task, snap.meta.opening or "", exchanges, content)
                except UserEndpointFailed as exc:
                    raise UserLLMFailed(f"{exc}; the session is unchanged, retry the message") from exc
                record = steps.message_step(snap.meta.step + 1, content, reply.text, reply.done)
                await self._commit(snap, None, record, key=key, print_=print_, done=reply.done)
        except LockTimeout as exc:
            raise SessionBusy(str(exc)) from exc
        except StoreError as exc:
            raise Unavailable(str(exc)) from exc
        return Applied(record)

    def _check_steps(self, snap: Snapshot) -> None:
        if snap.meta.step >= self.limits.max_steps:
            raise LimitExceeded(f"the session has reached {self.limits.max_steps} steps, its limit; fork or start a "
                                "new session", limit="max_steps", value=self.limits.max_steps)

    @asynccontextmanager
    async def _sandbox_slot(self, tenant: str) -> AsyncIterator[None]:
        """Hold a sandbox worker, granted fairly between tenants (see ``FairGate``)."""
        started = time.perf_counter()
        wait = self.pool.acquire_timeout
        try:
            async with self.gate.slot(tenant, wait):
                self.metrics.sandbox_wait.observe(time.perf_counter() - started)
                yield
        except NoSlot:
            raise SandboxBusy(f"no sandbox worker became free within {wait:g} s") from None

    @property
    def user_timeout(self) -> float:
        return self.user.timeout if self.user else 0.0

    async def _replay(self, session_id: str, key: str | None, print_: str) -> Applied | None:
        if key is None:
            return None
        prior = await self._store(self.store.idempotent(session_id, key))
        if prior is None:
            return None
        stored = json.loads(prior)
        idempotency.check_same(stored["fingerprint"], print_, key)
        page = await self._store(self.store.trajectory_page(session_id, stored["step"] - 1, 1))
        if not page or not page[0]:
            raise NotFound(f"session '{session_id}' no longer holds the step of this Idempotency-Key")
        return Applied(steps.public(json.loads(page[0][0])), replayed=True)

    async def _commit(self, snap: Snapshot, state: str | None, record: dict[str, Any], *, key: str | None,
                      print_: str, done: bool = False, held: Held | None = None,
                      delta: dict[str, Any] | None = None, rebase: bool = False, unlocked: bool = False) -> str | None:
        """Commit a step; a changed tree state comes as the ``delta`` of its parts, or as a whole
        state to ``rebase`` on (stored as a content-addressed base, see ``sandbox.state.deltas``). The
        digest of the state's base after the step ("" when it is the session's own text); None
        when an ``unlocked`` commit was refused (see ``SessionStore.commit``)."""
        session_id = snap.meta.session_id
        remembered = (key, json.dumps({"fingerprint": print_, "step": record["step"]})) if key else None
        # (hashlib lets go of the GIL: a large state is hashed on a thread beside the event loop)
        digest = await asyncio.to_thread(digest_of, state) if rebase and state is not None else ""
        stored = steps.encoded(record, self.limits.max_record_bytes)
        committed = await self._store(self._quota(self.store.commit(
            session_id, snap.meta.step, state, stored, done=done, idempotency=remembered, tenant=snap.meta.tenant,
            held=held, quota=self.limits.max_tenant_bytes, delta=delta, rebase=digest, unlocked=unlocked)))
        if not committed and unlocked:
            return None
        if not committed:
            if await self._store(self.store.load(session_id)) is None:
                raise NotFound(f"session '{session_id}' was deleted or expired during the call")
            raise Conflict("the session changed during the call; nothing was applied, retry")
        steps.public(record)
        return digest if rebase else "" if state is not None else snap.state_digest

    async def _run(self, env: Environment, snap: Snapshot, name: str,
                   raw: dict[str, Any] | str) -> tuple[Any, CallOutcome]:
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
        withheld = await self.turns.unavailable(snap, env, name)  # a tool that arrives in a later turn
        if withheld is not None:
            return arguments, _failed("unknown_tool", withheld)
        problem = self._check_arguments(env, tool, arguments)
        if problem:
            return arguments, _failed("invalid_arguments", f"{name}: {problem}")
        session_id = snap.meta.session_id

        async def stored_state() -> Stored:
            found: tuple[str, dict[str, str] | None] | None = await self._store(self.store.stored(session_id))
            if found is None:
                raise NotFound(f"session '{session_id}' was deleted or expired during the call")
            scenario = await self._template_scenario(snap)
            if scenario is None or found[1] is None:
                return Stored(*found)
            # Its base is the scenario's initial state: a worker may start it from that template.
            template = self._template_key(snap.meta.tenant, env, scenario.scenario_id, scenario.init_config)
            return Stored(*found, template=template, init_config=scenario.init_config, base=snap.state_digest)

        return arguments, await self.pool.session_call(env_code(env), session_id, snap.meta.step, stored_state,
                                                       name, arguments, deltas=True, **_randomness(snap.meta))

    def _check_arguments(self, env: Environment, tool: dict[str, Any], arguments: dict[str, Any]) -> str | None:
        """Raises LimitExceeded: arguments over a bound (nothing is applied)."""
        key = (env.code_hash, tool["function"]["name"])
        checker = self._checkers.get(key)
        if checker is None:
            checker = ArgumentChecker(tool["function"].get("parameters") or {"type": "object"})
            self._checkers[key] = checker
        try:
            problem = checker.problem(arguments)
        except ArgumentLimit as exc:
            raise LimitExceeded(str(exc), field="arguments", limit=exc.limit, value=exc.value) from exc
        return problem or _unicode_problem(arguments)

    async def state_view(self, session_id: str, *, step: int | None = None, tenant: str = "") -> tuple[int, str]:
        """The step and the state's JSON view as JSON text (built off the event loop when large);
        with ``step``, the state after that step (0: the initial state)."""
        snap = await self.snapshot(session_id, tenant=tenant, trajectory=step is not None)
        state = snap.state
        if step is not None and step != snap.meta.step:
            self._check_step(snap, step)
            fields = past.fields_at(snap.trajectory[:step]) if snap.initial_digest else None
            if fields is None:
                state = await self._state_at(snap, step, tenant)
            else:
                state = await asyncio.to_thread(_composed, snap.initial, fields)
        try:
            return snap.meta.step if step is None else step, await self.offload.state_view(state)
        except ViewError as exc:
            raise LimitExceeded(f"{exc}; read the state through the tools instead", limit="state_view") from exc

    async def trajectory(self, session_id: str, offset: int = 0, limit: int = 1000, *,
                         tenant: str = "") -> tuple[list[dict[str, Any]], int]:
        await self.snapshot(session_id, tenant=tenant)
        page = await self._store(self.store.trajectory_page(session_id, offset, limit))
        if page is None:
            raise NotFound(f"session '{session_id}' not found (it may have expired)")
        records, total = page
        return [steps.public(json.loads(r)) for r in records], total

    async def score(self, session_id: str, *, tenant: str = "", against: str | None = None) -> dict[str, Any]:
        """The session's checks on its current state; ``against`` scores it with the checks of another
        version of its scenario instead (``scenario_id`` for the latest, ``scenario_id@<version>``)."""
        snap = await self.snapshot(session_id, tenant=tenant)
        env = await self.environment_of(snap)
        scenario = await self.scenario_of(snap) if against is None else await self._other_version(snap, against)
        if scenario is not None and scenario.turns:  # (an ended turn keeps the results its checks had then)
            return {**await self.turns.score(session_id, scenario, tenant), "env_version": env.version,
                    "scenario_version": scenario.version}
        checklist = scenario.checklist if scenario else []
        budget = self.limits.score_budget
        try:
            async with self._sandbox_slot(tenant):
                results = await asyncio.wait_for(
                    self.pool.score(env_code(env), snap.state, snap.initial, [c.check for c in checklist]), budget)
        except TimeoutError:
            raise LimitExceeded(f"the checks took longer than the score budget of {budget:g} s", limit="score_budget",
                                value=budget) from None
        except SandboxError as exc:
            raise Unavailable(f"scoring failed in the sandbox: {exc.message}") from exc
        checks = [{"item": c.item, "passed": r["passed"], "error": r["error"]} for c, r in zip(checklist, results, strict=True)]
        passed = sum(1 for c in checks if c["passed"])
        total = len(checks)
        return {"reward": passed / total if total else None, "passed": passed, "total": total, "checks": checks,
                "env_version": env.version, "scenario_version": scenario.version if scenario else None}

    async def _other_version(self, snap: Snapshot, reference: str) -> Scenario:
        """A version of the session's own scenario (raises InvalidRequest for any other scenario)."""
        if snap.meta.scenario_id is None or split(reference)[0] != snap.meta.scenario_id:
            raise InvalidRequest(f"a session is scored against a version of its own scenario "
                                 f"('{snap.meta.scenario_id}'), not '{reference}'", field="scenario")
        scenario: Scenario = await self.registry.scenario(reference, snap.meta.tenant)
        return scenario

    async def fork(self, session_id: str, *, n: int = 1, step: int | None = None, tenant: str = "",
                   seed: int | None = None, group_seeds: str = "derived") -> Created:
        """``n`` independent copies of the session at its current step, or at ``step`` (0: the
        initial state) with the trajectory's first ``step`` steps (all or none). A fork goes on
        drawing where its parent was; with ``seed`` it draws anew from that seed."""
        past = step is not None
        # (a fork at a past step needs the initial state and the records, never the current state)
        snap = await self.snapshot(session_id, tenant=tenant, blobs=past, trajectory=past, current=False)
        reseeded = None if seed is None else _streams(n, seed, group_seeds)[1:]
        if step is not None and step != snap.meta.step:
            return await self._fork_at(snap, n, step, tenant, reseeded)
        if reseeded is not None:
            return await self._fork_reseeded(session_id, n, tenant, reseeded)
        env = await self.environment_of(snap)
        scenario = await self.scenario_of(snap)
        now = time.time()
        metas = [replace(snap.meta, session_id=new_session_id(), created_at=now, parent_id=session_id)
                 for _ in range(n)]
        async with self._admitted(tenant, [m.session_id for m in metas], snap.meta.idle_ttl):
            if not await self._store(self._quota(self.store.copy(snap.meta, metas,
                                                                 quota=self.limits.max_tenant_bytes))):
                raise NotFound(f"session '{session_id}' not found (it may have expired)")
        self.metrics.sessions.labels("fork").inc(n)
        return Created(metas, env, scenario)

    async def _fork_reseeded(self, session_id: str, n: int, tenant: str,
                             reseeded: tuple[list[str], list[int | None]]) -> Created:
        """Forks at the current step with streams of their own: their metas differ from the parent's
        in more than a store's copy writes, so the state is read and stored again."""
        snap = await self.snapshot(session_id, tenant=tenant, trajectory=True)
        env = await self.environment_of(snap)
        scenario = await self.scenario_of(snap)
        now = time.time()
        metas = [replace(snap.meta, session_id=new_session_id(), created_at=now, parent_id=session_id, stream=stream,
                         seed=own) for stream, own in zip(*reseeded, strict=True)]
        async with self._admitted(tenant, [m.session_id for m in metas], snap.meta.idle_ttl):
            await self._store(self._quota(self.store.create_group(metas, snap.state, snap.initial, snap.trajectory,
                                                                  quota=self.limits.max_tenant_bytes,
                                                                  initial_digest=snap.initial_digest)))
        self.metrics.sessions.labels("fork").inc(n)
        return Created(metas, env, scenario)

    async def _fork_at(self, snap: Snapshot, n: int, step: int, tenant: str,
                       reseeded: tuple[list[str], list[int | None]] | None = None) -> Created:
        env = await self.environment_of(snap)
        scenario = await self.scenario_of(snap)
        self._check_step(snap, step)
        records = snap.trajectory[:step]
        # The initial state as the forks' base plus the fields the first steps left; else replayed.
        fields = past.fields_at(records) if snap.initial_digest else None
        state = snap.initial if fields is not None else await self._state_at(snap, step, tenant)
        done = any(json.loads(r).get("done") is True for r in records)
        now = time.time()
        metas = [replace(snap.meta, session_id=new_session_id(), created_at=now, parent_id=snap.meta.session_id,
                         step=step, done=done) for _ in range(n)]
        if reseeded is not None:
            metas = [replace(meta, stream=stream, seed=own) for meta, stream, own in zip(metas, *reseeded, strict=True)]
        async with self._admitted(tenant, [m.session_id for m in metas], snap.meta.idle_ttl):
            await self._store(self._quota(self.store.create_group(metas, state, snap.initial, records,
                                                                  quota=self.limits.max_tenant_bytes,
                                                                  initial_digest=snap.initial_digest, delta=fields)))
        self.metrics.sessions.labels("fork").inc(n)
        return Created(metas, env, scenario)

    @staticmethod
    def _check_step(snap: Snapshot, step: int) -> None:
        if not 0 <= step <= snap.meta.step:
            raise InvalidRequest(f"step {step} is not a step of this session: it is at step {snap.meta.step} "
                                 "(0 is the initial state)", field="step")

    async def _state_at(self, snap: Snapshot, step: int, tenant: str) -> str:
        """The state after ``step``, replayed from the initial state (see ``service.engine.rewind``), or as
        rebuilt before; the replay's time is the tenant's (see ``service.engine.replays``)."""
        self._check_step(snap, step)
        env = await self.environment_of(snap)
        code = env_code(env)
        key = (tenant, snap.meta.session_id, step, code.key)
        kept = self.replayed.get(key)
        if kept is not None:
            self.metrics.replays.labels("cached").inc()
            return kept
        budget = self.limits.rewind_budget
        outcome = "failed"
        try:
            async with self.replay_budget.turn(tenant) as turn, self._sandbox_slot(tenant):
                turn.start()  # (waiting for a worker is not charged)
                state = await rewind.state_at(self.pool, code, snap.initial, snap.trajectory[:step], budget,
                                              **_randomness(snap.meta))
            outcome = "replayed"
        except QuotaExceeded:
            outcome = "refused"
            raise
        except rewind.NotReplayable as exc:
            raise Conflict(f"the state after step {step} cannot be rebuilt: {exc}", field="step") from exc
        except rewind.SandboxFailed as exc:
            raise Unavailable(f"{exc}; the steps are as recorded, retry") from exc
        except rewind.RewindBudget as exc:
            raise LimitExceeded(f"{exc}: fork at a later step, or raise the budget", limit="rewind_budget",
                                value=budget) from exc
        except SandboxError as exc:
            raise Unavailable(f"the sandbox could not replay the steps: {exc.message}") from exc
        finally:
            self.metrics.replays.labels(outcome).inc()
        self.replayed.put(key, state)
        return state

    async def delete(self, session_id: str, *, tenant: str = "") -> None:
        await self.snapshot(session_id, tenant=tenant)
        self._warm.pop(session_id, None)
        self.pool.end_session(session_id)
        if not await self._store(self.store.delete(session_id)):
            raise NotFound(f"session '{session_id}' not found")
        await self._store(self.store.forget(tenant, [session_id]))
        self.metrics.sessions_deleted.inc()

    async def _store(self, awaitable: Any) -> Any:
        started = time.perf_counter()
        try:
            return await awaitable
        except StoreError as exc:
            self.metrics.store_errors.inc()
            raise Unavailable(str(exc)) from exc
        finally:
            self.metrics.store_latency.observe(time.perf_counter() - started)


def _streams(n: int, seed: int | None, group_seeds: str) -> tuple[str, list[str], list[int | None]]:
    """The stream an init draws from, and each new session's stream and seed (see
    ``sandbox.worker.randomness``). One session goes on from its init's stream. Members of a group share
    the initial state but draw for themselves after it: each from a stream of its own (seeded, with
    ``seed``, from a seed derived from it and its index), or, seeded with ``group_seeds`` "same",
    all from the init's."""
    first = _new_stream()
    if n == 1 or seed is not None and group_seeds == "same":
        return first, [first] * n, [seed] * n
    seeds = [None if seed is None else randomness.derived(seed, index) for index in range(n)]
    return first, [_new_stream() for _ in range(n)], seeds


def _new_stream() -> str:
    return secrets.token_hex(8)


def _randomness(meta: SessionMeta) -> dict[str, Any]:
    """What the sandbox needs to rebuild a session's randomness (a session made before streams: none)."""
    return {"stream": meta.stream or None, "seed": meta.seed}


def _unicode_problem(value: Any) -> str | None:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return "arguments contain text that is not valid Unicode (a lone surrogate)"
    return None


def _failed(kind: str, message: str) -> CallOutcome:
    return CallOutcome(False, None, {"type": kind, "message": message}, None, {"added": [], "removed": [], "changed": []})


def _composed(initial: str, fields: dict[str, str]) -> str:
    return deltas.compose(deltas.Base(initial), fields) if fields else initial
