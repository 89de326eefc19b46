"""Finding a session and what it was made from: the reads every other part of the engine starts with.

Reads read. A session a read finds unusable (expired, another tenant's, its environment deleted)
is answered as not found and left as it is, so a GET never deletes or writes. Removing a session
whose environment was deleted is the business of the next write to it (``Sessions.writing``);
the store's TTL reaps those that no write touches again. (Every read of the store refreshes the
session's idle TTL: that is the store's contract, ``service.stores.store``, not a write here.)
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from service.catalog.model import Environment, Scenario
from service.engine.failures import EnvironmentGone
from service.errors import NotFound
from service.stores.store import Snapshot

if TYPE_CHECKING:
    from service.engine.sessions import Sessions


class Lookup:
    """The lookups of one engine (``Sessions.lookup``); it keeps nothing of its own."""

    def __init__(self, engine: Sessions) -> None:
        self.engine = engine

    async def snapshot(self, session_id: str, *, trajectory: bool = False, tenant: str = "",
                       blobs: bool = True, current: bool = True) -> Snapshot:
        engine = self.engine
        snap = await engine.stored(engine.store.load(session_id, trajectory=trajectory, blobs=blobs, current=current))
        found = visible(snap, session_id, tenant)
        await self.environment_of(found)  # a session whose environment was deleted is gone
        return found

    async def live(self, offset: int, limit: int, *, tenant: str = "") -> tuple[list[Snapshot], int]:
        engine = self.engine
        ids, total = await engine.stored(engine.store.live(tenant, offset, limit))
        # Meta only, read at once: a page of an RL batch's sessions may hold gigabytes of state.
        snaps = await asyncio.gather(*(engine.stored(engine.store.load(sid, blobs=False)) for sid in ids))
        kept = []
        for snap in snaps:
            if snap is None or snap.meta.tenant != tenant:
                continue
            try:
                await self.environment_of(snap)
            except EnvironmentGone:  # left to a write or the TTL to remove, and not counted meanwhile
                total -= 1
                continue
            kept.append(snap)
        return kept, total

    async def environment_of(self, snap: Snapshot) -> Environment:
        """The version of its environment the session was made from.

        Raises:
            EnvironmentGone: that registration of the environment was deleted.
        """
        meta = snap.meta
        registry = self.engine.registry
        try:
            env: Environment | None = await registry.environment(meta.env_id, meta.tenant)
        except NotFound:
            env = None
        if env is not None and env.registration == meta.env_registration and meta.env_version in ("", env.version):
            return env
        if meta.env_version:  # the version it started on, while that registration of it exists
            env = await self.engine.stored(registry.pinned_environment(meta.env_id, meta.env_version,
                                                                       meta.env_registration, meta.tenant))
            if env is not None:
                return env
        raise EnvironmentGone(meta)

    async def scenario_of(self, snap: Snapshot) -> Scenario | None:
        """The version of its scenario the session started on (its task, initial state and checks)."""
        meta = snap.meta
        if meta.scenario_id is None:
            return None
        registry = self.engine.registry
        try:
            scenario = await registry.scenario(meta.scenario_id, meta.tenant)
        except NotFound:
            scenario = None
        if scenario is not None and meta.scenario_version in ("", scenario.version):
            return scenario
        pinned = await self.engine.stored(registry.pinned_scenario(meta.scenario_id, meta.scenario_version,
                                                                   meta.tenant))
        if pinned is not None:
            return pinned
        raise NotFound(f"the scenario '{meta.scenario_id}' of session '{meta.session_id}' was deleted")

    async def template_scenario(self, snap: Snapshot) -> Scenario | None:
        """The scenario whose initial state a session's state is kept against, if it is."""
        if not snap.state_digest or snap.state_digest != snap.initial_digest:
            return None
        try:
            return await self.scenario_of(snap)
        except NotFound:
            return None


def visible(snap: Snapshot | None, session_id: str, tenant: str) -> Snapshot:
    """Raises NotFound: no such session, or another tenant's, which is reported exactly like a missing one."""
    if snap is None or snap.meta.tenant != tenant:
        raise NotFound(f"session '{session_id}' not found (it may have expired)")
    return snap
