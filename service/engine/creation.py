"""Making sessions: from a scenario or an ``init_config``, alone or in groups, and as forks of another.

A group (``n`` sessions) shares one initial state, stored once per tenant under its digest, and
is made all or none; each new session counts against the tenant's live sessions before anything
costs sandbox or LLM time. Randomness: every session draws from a stream of its own after its
initial state (``streams``), reproducibly with a seed.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sandbox.errors import SandboxError
from sandbox.worker import randomness
from service.catalog.model import Environment, Scenario
from service.catalog.registry import env_code
from service.catalog.versions import split
from service.engine import failures, past, turns
from service.engine.template_keys import NotUnicode
from service.engine.views import check_step
from service.errors import InvalidRequest, NotFound, QuotaExceeded
from service.stores.store import SessionMeta, Snapshot, digest_of, new_session_id

if TYPE_CHECKING:
    from service.engine.sessions import Sessions

DIGEST_TEXT_BYTES = 64 << 20  # initial states whose digest is kept, by the size of their texts


@dataclass
class Created:
    metas: list[SessionMeta]
    env: Environment
    scenario: Scenario | None

    @property
    def meta(self) -> SessionMeta:
        return self.metas[0]


class Creation:
    """The creation of one engine's sessions (``Sessions.creation``)."""

    def __init__(self, engine: Sessions) -> None:
        self.engine = engine
        # id of an initial state's text -> (the text, its digest): the pool hands the same text object
        # to every session of a template, so its digest is computed once, here, never taken from a worker
        self._digests: OrderedDict[int, tuple[str, str]] = OrderedDict()
        self._digest_bytes = 0

    async def create(self, scenario_id: str | None, env_id: str | None, init_config: dict[str, Any] | None, *,
                     n: int, mode: str, tenant: str, seed: int | None, group_seeds: str,
                     idle_ttl: float | None) -> Created:
        engine = self.engine
        store = engine.store
        if idle_ttl is not None and idle_ttl > store.ttl:
            message = f"at most {store.ttl:g}: this service keeps an idle session no longer"
            # (named as a body that fails validation names its field, so clients read one shape)
            raise InvalidRequest(f"idle_ttl_seconds: {message}", field="idle_ttl_seconds",
                                 errors=[{"field": "idle_ttl_seconds", "message": message}])
        scenario = await engine.registry.scenario(scenario_id, tenant) if scenario_id else None
        # (with a scenario, its environment's latest version, unless ``env_id`` names one of that id)
        if scenario is not None and env_id is not None and split(env_id)[0] != scenario.env_id:
            raise InvalidRequest(f"env_id '{env_id}' is not a version of the scenario's environment "
                                 f"'{scenario.env_id}'", field="env_id")
        env = await engine.registry.environment(str(env_id) if env_id is not None else scenario.env_id
                                                if scenario else "", tenant)
        config = scenario.init_config if scenario else (init_config or {})
        # Keyed once per scenario (its config's text is checked then too); a config from the body
        # at the cost of a pass of ``marshal`` over it (see ``service.engine.template_keys``).
        try:
            template = engine.templates.key(tenant, env.code_hash, scenario.scenario_id if scenario else None,
                                            config)
        except NotUnicode as exc:
            raise InvalidRequest(str(exc), field="init_config") from None
        if mode == "conversation" and scenario is None:
            raise InvalidRequest("conversation mode needs a scenario_id: the simulated user holds its task",
                                 field="mode")
        turns.check_mode(scenario, mode)
        ids = [new_session_id() for _ in range(n)]
        first, streams, seeds = new_streams(n, seed, group_seeds)
        async with self._admitted(tenant, ids, idle_ttl):  # a tenant over its quota costs no sandbox or LLM time
            opening = await engine.conversation.opening(scenario.task) if scenario and mode == "conversation" \
                else None
            # A single session keeps the instance its init made live in the sandbox for its first call.
            state = await self._initial_state(env, config, tenant, ids[0] if n == 1 else None, template,
                                              stream=first, seed=seed)
            now = time.time()
            await engine.stored(engine.registry.publish(env, scenario))
            metas = [SessionMeta(sid, env.env_id, scenario.scenario_id if scenario else None, now, tenant=tenant,
                                 mode=mode, opening=opening, env_registration=env.registration, stream=stream,
                                 seed=own, env_version=env.version,
                                 scenario_version=scenario.version if scenario else "", idle_ttl=idle_ttl)
                     for sid, stream, own in zip(ids, streams, seeds, strict=True)]
            digest = self._digest(state)
            try:
                await engine.stored(failures.within_quota(store.create_group(
                    metas, state, state, [], quota=engine.limits.max_tenant_bytes, initial_digest=digest)))
            except BaseException:
                engine.pool.forget(ids[0])
                raise
        if n == 1:  # its first call too needs no lock and no read
            engine.calls.warm_at(Snapshot(metas[0], "", "", now + metas[0].ttl(store.ttl), initial_digest=digest,
                                          state_digest=digest))
        engine.metrics.sessions.labels("create").inc(n)
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

    async def _initial_state(self, env: Environment, config: dict[str, Any], tenant: str, session: str | None,
                             template: str | None = None, *, stream: str | None = None,
                             seed: int | None = None) -> str:
        engine = self.engine
        try:
            async with engine.sandbox_slot(tenant):
                return await engine.pool.init_state(env_code(env), config, session, template, deltas=True,
                                                    stream=stream, seed=seed)
        except SandboxError as exc:
            raise failures.init_failure(exc) from exc

    @asynccontextmanager
    async def _admitted(self, tenant: str, ids: list[str], idle_ttl: float | None = None) -> AsyncIterator[None]:
        """Count ``ids`` against the tenant's quota of live sessions; uncount them if creation fails."""
        engine = self.engine
        most = engine.limits.max_sessions
        live = await engine.stored(engine.store.admit(tenant, ids, most, idle_ttl))
        if live is not None:
            raise QuotaExceeded(f"this tenant has {live} live sessions and may hold {most}; "
                                "delete finished sessions or wait for idle ones to expire", quota="max_sessions",
                                value=most, retry_after=60)
        try:
            yield
        except BaseException:
            await engine.stored(engine.store.forget(tenant, ids))
            raise

    # -- forks ----------------------------------------------------------------------------------
    async def fork(self, session_id: str, *, n: int, step: int | None, tenant: str, seed: int | None,
                   group_seeds: str) -> Created:
        engine = self.engine
        at_past = step is not None
        # (a fork at a past step needs the initial state and the records, never the current state)
        snap = await engine.snapshot(session_id, tenant=tenant, blobs=at_past, trajectory=at_past, current=False)
        reseeded = None if seed is None else new_streams(n, seed, group_seeds)[1:]
        if step is not None and step != snap.meta.step:
            return await self._fork_at(snap, n, step, tenant, reseeded)
        if reseeded is not None:
            return await self._fork_reseeded(session_id, n, tenant, reseeded)
        env = await engine.environment_of(snap)
        scenario = await engine.scenario_of(snap)
        now = time.time()
        metas = [replace(snap.meta, session_id=new_session_id(), created_at=now, parent_id=session_id)
                 for _ in range(n)]
        async with self._admitted(tenant, [m.session_id for m in metas], snap.meta.idle_ttl):
            if not await engine.stored(failures.within_quota(engine.store.copy(
                    snap.meta, metas, quota=engine.limits.max_tenant_bytes))):
                raise NotFound(f"session '{session_id}' not found (it may have expired)")
        engine.metrics.sessions.labels("fork").inc(n)
        return Created(metas, env, scenario)

    async def _fork_reseeded(self, session_id: str, n: int, tenant: str,
                             reseeded: tuple[list[str], list[int | None]]) -> Created:
        """Forks at the current step with streams of their own: their metas differ from the parent's
        in more than a store's copy writes, so the state is read and stored again."""
        engine = self.engine
        snap = await engine.snapshot(session_id, tenant=tenant, trajectory=True)
        env = await engine.environment_of(snap)
        scenario = await engine.scenario_of(snap)
        now = time.time()
        metas = [replace(snap.meta, session_id=new_session_id(), created_at=now, parent_id=session_id, stream=stream,
                         seed=own) for stream, own in zip(*reseeded, strict=True)]
        async with self._admitted(tenant, [m.session_id for m in metas], snap.meta.idle_ttl):
            await engine.stored(failures.within_quota(engine.store.create_group(
                metas, snap.state, snap.initial, snap.trajectory, quota=engine.limits.max_tenant_bytes,
                initial_digest=snap.initial_digest)))
        engine.metrics.sessions.labels("fork").inc(n)
        return Created(metas, env, scenario)

    async def _fork_at(self, snap: Snapshot, n: int, step: int, tenant: str,
                       reseeded: tuple[list[str], list[int | None]] | None = None) -> Created:
        engine = self.engine
        env = await engine.environment_of(snap)
        scenario = await engine.scenario_of(snap)
        check_step(snap, step)
        records = snap.trajectory[:step]
        # The initial state as the forks' base plus the fields the first steps left; else replayed.
        fields = past.fields_at(records) if snap.initial_digest else None
        state = snap.initial if fields is not None else await engine.views.state_at(snap, step, tenant)
        done = any(json.loads(r).get("done") is True for r in records)
        now = time.time()
        metas = [replace(snap.meta, session_id=new_session_id(), created_at=now, parent_id=snap.meta.session_id,
                         step=step, done=done) for _ in range(n)]
        if reseeded is not None:
            metas = [replace(meta, stream=stream, seed=own) for meta, stream, own in zip(metas, *reseeded, strict=True)]
        async with self._admitted(tenant, [m.session_id for m in metas], snap.meta.idle_ttl):
            await engine.stored(failures.within_quota(engine.store.create_group(
                metas, state, snap.initial, records, quota=engine.limits.max_tenant_bytes,
                initial_digest=snap.initial_digest, delta=fields)))
        engine.metrics.sessions.labels("fork").inc(n)
        return Created(metas, env, scenario)


def new_streams(n: int, seed: int | None, group_seeds: str) -> tuple[str, list[str], list[int | None]]:
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
