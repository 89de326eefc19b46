"""The session engine: create, call, observe, score and fork sessions.

State lives only in the store; this object holds nothing per session, so any
replica can serve any request and a restart loses nothing.

``Sessions`` is the one entry point of the transports (REST, MCP, OpenEnv); it hands each
request to the part that serves it:

    lookup        finding a session and what it was made from   ``service.engine.lookup``
    creation      new sessions, groups of them, forks           ``service.engine.creation``
    calls         tool calls, and the commit of every step      ``service.engine.calls``
    conversation  messages to a simulated user                  ``service.engine.conversation``
    turns         turn-based scenarios                          ``service.engine.turns``
    views         a session's state, trajectory and score       ``service.engine.views``

The lower layers' errors become the service's in ``service.engine.failures``. Reads read: a GET
never deletes or writes, and a session whose environment was deleted is removed by the next
write to it (``writing``) or by the store's TTL.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from sandbox.errors import SandboxBusy
from sandbox.fairness import FairGate, NoSlot
from sandbox.pool.requests import WorkerPool
from service.catalog.model import Environment, Scenario
from service.catalog.registry import Registry
from service.engine import turns
from service.engine.calls import Applied, Calls
from service.engine.conversation import Conversation
from service.engine.creation import Created, Creation
from service.engine.failures import EnvironmentGone
from service.engine.lookup import Lookup
from service.engine.offload import Offload
from service.engine.template_keys import TemplateKeys
from service.engine.user_llm import UserSimulator
from service.engine.views import Views
from service.errors import NotFound, Unavailable
from service.observability import Metrics
from service.stores.store import SessionMeta, SessionStore, Snapshot, StoreError

T = TypeVar("T")


@dataclass(frozen=True)
class SessionLimits:
    """Bounds on what one session or tenant may hold or take; each is named in the problem it raises.

    The defaults here are the settings' (``service.server.settings`` refers to them, not copies)."""

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
    sandbox_reserve: int = 1  # sandbox workers kept for tenants that hold none (see FairGate); 0 without keys


class Sessions:
    """The session engine. Every method serves one request for ``tenant``, whose sessions alone it
    sees: another tenant's session is reported exactly like a missing one."""

    def __init__(self, registry: Registry, store: SessionStore, pool: WorkerPool, lock_wait: float,
                 user: UserSimulator | None = None, offload: Offload | None = None, *,
                 limits: SessionLimits, metrics: Metrics | None = None) -> None:
        self.offload = offload or Offload()
        self.metrics = metrics or Metrics()
        self.limits = limits
        self.gate = FairGate(pool.size, self.limits.tenant_sandbox_share, self.limits.sandbox_reserve)
        self.metrics.sandbox_bounds.labels("cap").set(self.gate.cap)
        self.metrics.sandbox_bounds.labels("reserve").set(self.gate.reserve)
        self.metrics.sandbox_reserved.set_function(lambda: self.gate.reserved_grants)
        self.registry = registry
        self.store = store
        self.pool = pool
        self.lock_wait = lock_wait
        self.templates = TemplateKeys()
        self.lookup = Lookup(self)
        self.creation = Creation(self)
        self.calls = Calls(self)
        self.conversation = Conversation(self, user)
        self.views = Views(self)
        # Turn-based scenarios (``service.engine.turns``): which turn a session is in, its tools, its end.
        self.turns = turns.Turns(self)

    # -- sessions come and go ---------------------------------------------------------------------
    async def create(self, scenario_id: str | None, env_id: str | None, init_config: dict[str, Any] | None, *,
                     n: int = 1, mode: str = "task", tenant: str = "", seed: int | None = None,
                     group_seeds: str = "derived", idle_ttl: float | None = None) -> Created:
        """Create ``n`` sessions sharing one initial state (all or none); with ``seed``, every draw
        is reproducible (see ``creation.new_streams`` for a group's); with ``idle_ttl``, they expire
        that many seconds after their last call instead of after the store's TTL.

        Raises:
            InvalidRequest: ``idle_ttl`` is longer than the store's TTL, the longest a session idles."""
        return await self.creation.create(scenario_id, env_id, init_config, n=n, mode=mode, tenant=tenant, seed=seed,
                                          group_seeds=group_seeds, idle_ttl=idle_ttl)

    async def fork(self, session_id: str, *, n: int = 1, step: int | None = None, tenant: str = "",
                   seed: int | None = None, group_seeds: str = "derived") -> Created:
        """``n`` independent copies of the session at its current step, or at ``step`` (0: the
        initial state) with the trajectory's first ``step`` steps (all or none). A fork goes on
        drawing where its parent was; with ``seed`` it draws anew from that seed."""
        return await self.creation.fork(session_id, n=n, step=step, tenant=tenant, seed=seed, group_seeds=group_seeds)

    async def delete(self, session_id: str, *, tenant: str = "") -> None:
        async with self.writing():
            snap = await self.snapshot(session_id, tenant=tenant)
        if not await self.remove(snap.meta):
            raise NotFound(f"session '{session_id}' not found")
        self.metrics.sessions_deleted.inc()

    # -- steps ------------------------------------------------------------------------------------
    async def call(self, session_id: str, name: str, raw_arguments: dict[str, Any] | str, *,
                   key: str | None = None, tenant: str = "") -> Applied:
        """Apply one tool call exactly once. Tool failures are returned, not raised.

        With an idempotency ``key``, a retry of the same call (on any replica, after any crash)
        returns the step the first attempt committed instead of applying it again.
        """
        async with self.writing():
            return await self.calls.call(session_id, name, raw_arguments, key=key, tenant=tenant)

    async def message(self, session_id: str, content: str, *, key: str | None = None, tenant: str = "") -> Applied:
        """Send the agent's message to the simulated user; the exchange becomes a step."""
        async with self.writing():
            return await self.conversation.message(session_id, content, key=key, tenant=tenant)

    # -- reads ------------------------------------------------------------------------------------
    async def snapshot(self, session_id: str, *, trajectory: bool = False, tenant: str = "",
                       blobs: bool = True, current: bool = True) -> Snapshot:
        """The session as stored (see ``SessionStore.load`` for what ``blobs`` and ``current`` leave out).

        Raises:
            NotFound: no such session of the tenant, or its environment was deleted (``EnvironmentGone``).
        """
        return await self.lookup.snapshot(session_id, trajectory=trajectory, tenant=tenant, blobs=blobs,
                                          current=current)

    async def live(self, offset: int, limit: int, *, tenant: str = "") -> tuple[list[Snapshot], int]:
        """A page of the tenant's live sessions, meta only (those that expired or were deleted meanwhile,
        or whose environment was deleted, are left out)."""
        return await self.lookup.live(offset, limit, tenant=tenant)

    async def environment_of(self, snap: Snapshot) -> Environment:
        """The version of its environment the session was made from.

        Raises:
            EnvironmentGone: that registration of the environment was deleted (the id may have been
                added again since, with other code or the same).
        """
        return await self.lookup.environment_of(snap)

    async def scenario_of(self, snap: Snapshot) -> Scenario | None:
        """The version of its scenario the session started on (its task, initial state and checks)."""
        return await self.lookup.scenario_of(snap)

    async def state_view(self, session_id: str, *, step: int | None = None, tenant: str = "") -> tuple[int, str]:
        """The step and the state's JSON view as JSON text (built off the event loop when large);
        with ``step``, the state after that step (0: the initial state)."""
        return await self.views.state_view(session_id, step=step, tenant=tenant)

    async def trajectory(self, session_id: str, offset: int = 0, limit: int = 1000, *,
                         tenant: str = "") -> tuple[list[dict[str, Any]], int]:
        """A page of the session's step records, and how many it holds."""
        return await self.views.trajectory(session_id, offset, limit, tenant=tenant)

    async def score(self, session_id: str, *, tenant: str = "", against: str | None = None) -> dict[str, Any]:
        """The session's checks on its current state; ``against`` scores it with the checks of another
        version of its scenario instead (``scenario_id`` for the latest, ``scenario_id@<version>``)."""
        return await self.views.score(session_id, tenant=tenant, against=against)

    # -- shared by the parts ----------------------------------------------------------------------
    def writing(self) -> AbstractAsyncContextManager[None]:
        """Around a write to one session. A read leaves a session whose environment was deleted as it
        is; a write that finds one removes it, and answers as the read would."""
        return _Writing(self)

    async def remove(self, meta: SessionMeta) -> bool:
        """End the session: its live process, its warm meta, its keys and its place in the tenant's
        count (False: the store held no such session)."""
        self.calls.forget_warm(meta.session_id)
        self.pool.end_session(meta.session_id)
        if not await self.stored(self.store.delete(meta.session_id)):
            return False
        await self.stored(self.store.forget(meta.tenant, [meta.session_id]))
        return True

    async def stored(self, operation: Awaitable[T]) -> T:
        """A store operation, timed; its failure an ``Unavailable``. (Not a context manager: every
        call makes two, and a generator's costs more than the rest of this.)"""
        started = time.perf_counter()
        try:
            return await operation
        except StoreError as exc:
            self.metrics.store_errors.inc()
            raise Unavailable(str(exc)) from exc
        finally:
            self.metrics.store_latency.observe(time.perf_counter() - started)

    def sandbox_slot(self, tenant: str) -> _SandboxSlot:
        """Hold a sandbox worker, granted fairly between tenants (see ``FairGate``), ``async with``."""
        return _SandboxSlot(self, tenant)


class _SandboxSlot:
    """``Sessions.sandbox_slot`` (a class: every tool call enters one, and a generator costs more)."""

    def __init__(self, engine: Sessions, tenant: str) -> None:
        self.engine = engine
        self.slot = engine.gate.slot(tenant, engine.pool.acquire_timeout)

    async def __aenter__(self) -> None:
        started = time.perf_counter()
        try:
            await self.slot.__aenter__()
        except NoSlot:
            raise SandboxBusy(f"no sandbox worker became free within {self.slot.timeout:g} s") from None
        self.engine.metrics.sandbox_wait.observe(time.perf_counter() - started)

    async def __aexit__(self, *exc: object) -> None:
        await self.slot.__aexit__(*exc)


class _Writing:
    """``Sessions.writing`` (a class: every tool call enters one, and a generator costs more)."""

    def __init__(self, engine: Sessions) -> None:
        self.engine = engine

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, EnvironmentGone):
            with suppress(Unavailable):  # (the store's TTL removes it then)
                await self.engine.remove(exc.meta)
