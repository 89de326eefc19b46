"""Stage 4, scenario generation and validation, with repair.

Each environment gets ``run.scenarios_per_env`` scenario slots. A slot draws
its initial state from the environment's ``states_per_env`` states (each
asked for alone), then writes drafts (task, checklist, checks, solution) until
one validates: a draft whose replay fails is repaired from the evidence up to
``repair.scenario_attempts`` times, and a slot writes up to
``repair.drafts_per_scenario`` drafts. A repair that blames the environment
sends the tool it names back through tool repair (``env_repair``): the same
draft is validated again with the repaired tool, or the environment is dropped.
The record keeps every validation (``history``) with its evidence: the
replayed calls, the checks' outcomes and the final state, and the revision of
the environment's code it was validated against (``env_revision``); a kept
scenario of an environment repaired since is replayed again, and one that no
longer validates is marked failed, so a rerun drafts it afresh.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sandbox.pool.requests import WorkerPool
from service.catalog.model import Environment
from synthesis.build import drafts
from synthesis.build.drafts import Draft
from synthesis.errors import AnswerRejected, Dropped
from synthesis.llm.prompts import shown
from synthesis.parsing.answers import Call, InitState
from synthesis.repair import scenario_repair
from synthesis.repair.env_repair import EnvironmentRepair, Verify, revision
from synthesis.run.context import Context
from synthesis.run.report import DROPPED, FAILED, KEPT, StageReport
from synthesis.stages import dedup, replay, states
from synthesis.stages.skeleton import environment

STAGE = "scenarios"


def scenario_keys(env_id: str, count: int) -> list[str]:
    return [f"{env_id}-s{k:02d}" for k in range(1, count + 1)]


async def run(ctx: Context) -> StageReport:
    skeletons = ctx.workspace.skeletons.load()
    assessments = ctx.workspace.assessments.load()
    scope = dedup.in_scope(ctx)
    assessed = {k for k, r in assessments.items()
                if r.get("status") == KEPT and k in scope and skeletons.get(k, {}).get("status") == KEPT}  # fmt: skip
    ctx.required(ctx.workspace.assessments, "assess", assessed)
    count, n_states = ctx.config.run.scenarios_per_env, ctx.config.states_per_env()
    envs = {env_id: environment(skeletons[env_id], assessments[env_id]) for env_id in sorted(assessed)}
    repairs = EnvironmentRepair(ctx, envs, stage=STAGE)
    owner = {key: env_id for env_id in envs for key in scenario_keys(env_id, count)}
    pending: dict[tuple[str, int], asyncio.Task[InitState]] = {}  # slots sharing a state share its request

    def state(env: Environment, index: int) -> asyncio.Task[InitState]:
        if (env.env_id, index) not in pending:
            purpose = f"starting point {index + 1} of {n_states}, for a realistic task different from the others'"
            pending[env.env_id, index] = asyncio.ensure_future(
                states.generate(ctx, env, item=f"state-{index + 1:02d}", purpose=purpose, stage=STAGE))
        return pending[env.env_id, index]

    async def work(key: str) -> dict[str, Any]:
        env = repairs.current(owner[key])
        index = scenario_keys(env.env_id, count).index(key) % n_states
        seed = await asyncio.shield(state(env, index))
        return await make(ctx, repairs.current(owner[key]), key, seed, repairs)

    try:
        report = await ctx.run_items(STAGE, sorted(owner), ctx.workspace.scenarios, work)
        report.notes.extend(repairs.notes())
        await _revalidate(ctx, envs, owner, report)
        records = ctx.workspace.scenarios.load()
        for key in sorted(owner):
            history = (records.get(key) or {}).get("history") or []
            if len(history) > 1:
                fixes = ", ".join(str(e["diagnosis"]["diagnosis"]) for e in history if e.get("diagnosis"))
                outcome = records[key]["status"]
                report.notes.append(f"{key}: {outcome} after {len(history)} validations, {history[-1]['draft']} "
                                    f"draft(s); repairs: {fixes or 'none'}")  # fmt: skip
        return report
    finally:
        for task in pending.values():
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # retrieved: each item already recorded it


async def make(ctx: Context, env: Environment, key: str, seed: InitState,
               repairs: EnvironmentRepair | None = None) -> dict[str, Any]:  # fmt: skip
    """Drafts, validations and repairs for one slot, within the configured bounds.

    ``repairs`` acts on a diagnosis that blames the environment; without it, such a draft is abandoned.

    Raises:
        Dropped: the environment was dropped because a tool a scenario found wrong could not be repaired.
    """
    pool = await ctx.pool()
    initial = await states.instantiate(pool, env, seed.init_config)
    view = shown(states.view(initial), 12000)
    slot = key.rsplit("-", 1)[1]
    bounds = ctx.config.repair
    history: list[dict[str, Any]] = []
    record: dict[str, Any] = {}
    abandoned: list[str] = []
    for d in range(1, bounds.drafts_per_scenario + 1):
        item = slot if d == 1 else f"{slot}-d{d}"
        draft = await drafts.write(ctx, env, item, seed, view, stage=STAGE, abandoned=abandoned)
        for attempt in range(bounds.scenario_attempts + 1):
            validation = await replay.replay(pool, env, initial, draft.calls, draft.checks)
            record = {"scenario": draft.scenario(key, env.env_id, seed).to_json(), "kinds": [c.kind for c in draft.checks],
                      "sub_goals": draft.spec.sub_goals, "env_revision": revision(env)}  # fmt: skip
            entry: dict[str, Any] = {"draft": d, "attempt": attempt, "result": validation.reason or "valid",
                                     "detail": validation.detail}  # fmt: skip
            history.append(entry)
            ctx.note(STAGE, f"{key}: draft {d}, validation {attempt + 1}: {entry['result']}")
            if validation.reason is None:
                return {**record, "status": KEPT, "trace": validation.trace, "history": history}
            final = states.view(validation.final) if validation.final else None
            entry["evidence"] = scenario_repair.evidence(validation, final)
            if attempt == bounds.scenario_attempts:
                break
            try:
                fix = await scenario_repair.diagnose(ctx, env, f"{item}-fix{attempt + 1}", draft, validation, view,
                                                     shown(final, 12000), stage=STAGE)  # fmt: skip
            except AnswerRejected as exc:
                entry["diagnosis"] = {"diagnosis": "none", "reason": f"no usable repair: {exc.last}"}
                break
            entry["diagnosis"] = {"diagnosis": fix.diagnosis, "reason": fix.reason, "changed": fix.changed(draft)}
            if fix.diagnosis == "environment" and fix.tool is not None and repairs is not None:
                entry["diagnosis"]["tool"] = fix.tool
                blamed = {"scenario_task": draft.spec.task, "diagnosis": fix.reason,
                          "validation": f"{validation.reason}: {validation.detail}", "calls_replayed": validation.trace,
                          "failing_checks": [draft.checks[i].source for i in validation.failing_checks()],
                          "final_state": shown(final, 4000)}  # fmt: skip
                try:
                    env = await repairs.blame(env, fix.tool, key, blamed, _verifier(pool, seed, draft))
                except Dropped as exc:
                    entry["diagnosis"]["changed"] = [f"environment dropped: {exc.detail}"]
                    raise
                entry["diagnosis"]["changed"] = [f"tool {fix.tool} repaired"]
                initial = await states.instantiate(pool, env, seed.init_config)
                continue  # the same draft, validated again with the repaired tool
            if fix.diagnosis in ("task", "environment"):
                break  # nothing to patch in this draft: a fresh one, if the budget allows
            draft = scenario_repair.apply(draft, fix)
        reason = history[-1].get("diagnosis", {}).get("reason") or f"{history[-1]['result']}: {history[-1]['detail']}"
        abandoned.append(f"{draft.spec.task} (abandoned: {reason})")
    last = history[-1]
    return {**record, "status": DROPPED, "reason": last["result"], "detail": last["detail"], "history": history}


def _verifier(pool: WorkerPool, seed: InitState, draft: Draft) -> Verify:
    """Accepts a rewritten environment when ``draft`` validates with it (None), else says why not."""

    async def verify(candidate: Environment) -> str | None:
        try:
            start = await states.instantiate(pool, candidate, seed.init_config)
        except Dropped as exc:
            return f"{exc.reason}: {exc.detail}"
        validation = await replay.replay(pool, candidate, start, draft.calls, draft.checks)
        return None if validation.reason is None else f"{validation.reason}: {validation.detail}"

    return verify


async def _revalidate(ctx: Context, envs: dict[str, Environment], owner: dict[str, str], report: StageReport) -> None:
    """Replay kept scenarios validated against code their environment no longer has; mark failed those that broke."""
    records = ctx.workspace.scenarios.load()
    for key in sorted(owner):
        record, env = records.get(key), envs[owner[key]]
        if record is None or record.get("status") != KEPT or record.get("env_revision") in (None, revision(env)):
            continue
        scenario = record["scenario"]
        checks = [replay.Check(c["item"], kind, c["check"]) for c, kind in zip(scenario["checklist"], record["kinds"], strict=True)]
        calls = [Call(c["name"], c["arguments"]) for c in scenario.get("reference_solution") or []]
        pool = await ctx.pool()
        try:
            initial = await states.instantiate(pool, env, scenario["init_config"])
            validation = await replay.replay(pool, env, initial, calls, checks)
            problem = None if validation.reason is None else f"{validation.reason}: {validation.detail}"
        except Dropped as exc:
            problem = f"{exc.reason}: {exc.detail}"
        if problem is None:
            ctx.workspace.scenarios.append({**record, "env_revision": revision(env)})
            continue
        error = f"no longer valid after its environment was repaired ({problem}); a rerun drafts it again"
        ctx.workspace.scenarios.append({**record, "status": FAILED, "error": error})
        report.kept -= 1
        report.failed.append((key, error))
