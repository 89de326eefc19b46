"""Stage 4, scenario generation (initial states, task, checklist, checks, reference solution), then validation."""

from __future__ import annotations

import asyncio
from typing import Any

from service.catalog import CheckItem, Environment, Scenario, ToolCall
from synthesis import dedup, replay, states
from synthesis.answers import ChecklistItem, InitState, parse_checklist, parse_solution, parse_task
from synthesis.context import Context
from synthesis.dialogue import ask
from synthesis.errors import Dropped
from synthesis.prompts import render, shown
from synthesis.report import DROPPED, KEPT, StageReport
from synthesis.skeleton import environment
from synthesis.sources import parse_check_func

STAGE = "scenarios"


def scenario_keys(env_id: str, count: int) -> list[str]:
    return [f"{env_id}-s{k:02d}" for k in range(1, count + 1)]


async def run(ctx: Context) -> StageReport:
    skeletons = ctx.workspace.skeletons.load()
    scope = dedup.in_scope(ctx)
    assessed = {k for k, r in ctx.workspace.assessments.load().items()
                if r.get("status") == KEPT and k in scope and skeletons.get(k, {}).get("status") == KEPT}  # fmt: skip
    ctx.required(ctx.workspace.assessments, "assess", assessed)
    count = ctx.config.run.scenarios_per_env
    envs = {env_id: environment(skeletons[env_id]) for env_id in sorted(assessed)}
    owner = {key: env_id for env_id in envs for key in scenario_keys(env_id, count)}
    # One request yields all of an environment's states; its items share it.
    pending: dict[str, asyncio.Task[list[InitState]]] = {}

    def states_of(env: Environment) -> asyncio.Task[list[InitState]]:
        if env.env_id not in pending:
            pending[env.env_id] = asyncio.ensure_future(states.generate(
                ctx, env, count=count, item="scenarios", stage=STAGE,
                purpose=f"{count} distinct starting points, each for a different realistic task"))  # fmt: skip
        return pending[env.env_id]

    async def work(key: str) -> dict[str, Any]:
        env = envs[owner[key]]
        index = scenario_keys(env.env_id, count).index(key)
        seeds = await asyncio.shield(states_of(env))
        return await generate(ctx, env, key, seeds[index])

    try:
        return await ctx.run_items(STAGE, sorted(owner), ctx.workspace.scenarios, work)
    finally:
        for task in pending.values():
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # retrieved: each item already recorded it


async def generate(ctx: Context, env: Environment, key: str, seed: InitState) -> dict[str, Any]:
    pool = await ctx.pool()
    initial = await states.instantiate(pool, env, seed.init_config)
    view = shown(states.view(initial), 12000)
    item = key.rsplit("-", 1)[1]
    rules = "\n".join(f"- {rule}" for rule in env.rules)
    tools = shown(env.tools, 12000)
    spec = await ask(ctx.client, "generator",
                     render("task", env=env.env_id, item=item, introduction=env.introduction, rules=rules, tools=tools,
                            state=view, description=seed.description), parse_task, stage=STAGE)  # fmt: skip
    checklist = await ask(ctx.client, "generator",
                          render("checklist", env=env.env_id, item=item, task=spec.task, sub_goals=spec.sub_goals,
                                 state=view, rules=rules), parse_checklist, stage=STAGE)  # fmt: skip

    async def write(j: int, entry: ChecklistItem) -> replay.Check:
        prompt = render("check_func", env=env.env_id, item=f"{item}-c{j}", check_item=entry.item, kind=entry.kind,
                        task=spec.task, code=env.code, state=view)  # fmt: skip
        source = await ask(ctx.client, "generator", prompt, parse_check_func, stage=STAGE)
        return replay.Check(entry.item, entry.kind, source)

    checks = list(await asyncio.gather(*(write(j, e) for j, e in enumerate(checklist, start=1))))
    numbered = [{"item": c.item, "kind": c.kind} for c in checklist]
    calls = await ask(ctx.client, "generator",
                      render("solution", env=env.env_id, item=item, task=spec.task, checklist=numbered, tools=tools,
                             state=view, rules=rules),
                      lambda answer: parse_solution(answer, env.tool_names), stage=STAGE)  # fmt: skip
    scenario = Scenario(
        scenario_id=key, env_id=env.env_id, task=spec.task, init_config=seed.init_config,
        checklist=[CheckItem(c.item, c.source) for c in checks],
        reference_solution=[ToolCall(c.name, c.arguments) for c in calls],
    )  # fmt: skip
    record = {"scenario": scenario.to_json(), "kinds": [c.kind for c in checks], "sub_goals": spec.sub_goals}
    try:
        trace = await replay.replay(pool, env, initial, calls, checks)
    except Dropped as exc:  # keep what was generated: the record shows what the replay rejected
        return {**record, "status": DROPPED, "reason": exc.reason, "detail": exc.detail}
    return {**record, "status": KEPT, "trace": trace}
