"""What a session shows: its state (now, or after a past step), its trajectory and its score.

None of these writes. A past state is composed from the initial state and the fields the first
steps left (``service.engine.past``) or, failing that, replayed in the sandbox
(``service.engine.rewind``): the replay's time is the tenant's (``service.engine.replays``) and what
it rebuilt is kept in this replica, for the next view or fork at that step.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from sandbox.errors import SandboxError
from sandbox.state import deltas
from service.catalog.model import Scenario
from service.catalog.registry import env_code
from service.catalog.versions import split
from service.engine import failures, past, rewind, steps
from service.engine.offload import ViewError
from service.engine.replays import ReplayBudget, ReplayCache
from service.errors import InvalidRequest, LimitExceeded, NotFound, QuotaExceeded, Unavailable
from service.stores.store import SessionMeta, Snapshot

if TYPE_CHECKING:
    from service.engine.sessions import Sessions


class Views:
    """The views of one engine's sessions (``Sessions.views``), and the past states it rebuilt."""

    def __init__(self, engine: Sessions) -> None:
        self.engine = engine
        limits = engine.limits
        self.replayed = ReplayCache(limits.replay_cache_entries, limits.replay_cache_bytes)
        self.replay_budget = ReplayBudget(limits.replay_seconds, limits.max_tenant_replays,
                                          engine.metrics.replay_seconds.inc)

    async def state_view(self, session_id: str, *, step: int | None = None, tenant: str = "") -> tuple[int, str]:
        engine = self.engine
        snap = await engine.snapshot(session_id, tenant=tenant, trajectory=step is not None)
        state = snap.state
        if step is not None and step != snap.meta.step:
            check_step(snap, step)
            fields = past.fields_at(snap.trajectory[:step]) if snap.initial_digest else None
            if fields is None:
                state = await self.state_at(snap, step, tenant)
            else:
                state = await asyncio.to_thread(_composed, snap.initial, fields)
        try:
            return snap.meta.step if step is None else step, await engine.offload.state_view(state)
        except ViewError as exc:
            raise LimitExceeded(f"{exc}; read the state through the tools instead", limit="state_view") from exc

    async def trajectory(self, session_id: str, offset: int, limit: int, *,
                         tenant: str = "") -> tuple[list[dict[str, Any]], int]:
        engine = self.engine
        await engine.snapshot(session_id, tenant=tenant)
        page = await engine.stored(engine.store.trajectory_page(session_id, offset, limit))
        if page is None:
            raise NotFound(f"session '{session_id}' not found (it may have expired)")
        records, total = page
        return [steps.public(json.loads(r)) for r in records], total

    async def score(self, session_id: str, *, tenant: str = "", against: str | None = None) -> dict[str, Any]:
        engine = self.engine
        snap = await engine.snapshot(session_id, tenant=tenant)
        env = await engine.environment_of(snap)
        scenario = await engine.scenario_of(snap) if against is None else await self._other_version(snap, against)
        if scenario is not None and scenario.turns:  # (an ended turn keeps the results its checks had then)
            return {**await engine.turns.score(session_id, scenario, tenant), "env_version": env.version,
                    "scenario_version": scenario.version}
        checklist = scenario.checklist if scenario else []
        budget = engine.limits.score_budget
        try:
            async with engine.sandbox_slot(tenant):
                results = await asyncio.wait_for(
                    engine.pool.score(env_code(env), snap.state, snap.initial, [c.check for c in checklist]), budget)
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
        scenario: Scenario = await self.engine.registry.scenario(reference, snap.meta.tenant)
        return scenario

    async def state_at(self, snap: Snapshot, step: int, tenant: str) -> str:
        """The state after ``step``, replayed from the initial state, or as rebuilt before."""
        check_step(snap, step)
        engine = self.engine
        env = await engine.environment_of(snap)
        code = env_code(env)
        key = (tenant, snap.meta.session_id, step, code.key)
        kept = self.replayed.get(key)
        if kept is not None:
            engine.metrics.replays.labels("cached").inc()
            return kept
        budget = engine.limits.rewind_budget
        outcome = "failed"
        try:
            async with self.replay_budget.turn(tenant) as turn, engine.sandbox_slot(tenant):
                turn.start()  # (waiting for a worker is not charged)
                state = await rewind.state_at(engine.pool, code, snap.initial, snap.trajectory[:step], budget,
                                              **randomness(snap.meta))
            outcome = "replayed"
        except QuotaExceeded:
            outcome = "refused"
            raise
        except failures.REPLAY_FAILURES as exc:
            raise failures.replay_failure(exc, step, budget) from exc
        finally:
            engine.metrics.replays.labels(outcome).inc()
        self.replayed.put(key, state)
        return state


def check_step(snap: Snapshot, step: int) -> None:
    """Raises InvalidRequest: ``step`` is not one of the session's (0 is the initial state)."""
    if not 0 <= step <= snap.meta.step:
        raise InvalidRequest(f"step {step} is not a step of this session: it is at step {snap.meta.step} "
                             "(0 is the initial state)", field="step")


def randomness(meta: SessionMeta) -> dict[str, Any]:
    """What the sandbox needs to rebuild a session's randomness (a session made before streams: none)."""
    return {"stream": meta.stream or None, "seed": meta.seed}


def _composed(initial: str, fields: dict[str, str]) -> str:
    return deltas.compose(deltas.Base(initial), fields) if fields else initial
