"""Stage 2, skeleton synthesis: plan the state and rules, write the class, plan and write the operations."""

from __future__ import annotations

import asyncio
from typing import Any

from sandbox.errors import RequestFailed
from service.catalog.admission import build_environment
from service.catalog.model import CatalogError, Environment
from service.catalog.registry import env_code
from synthesis.build.assembly import assemble
from synthesis.errors import AnswerRejected, ConfigError, Dropped
from synthesis.llm.dialogue import ask
from synthesis.llm.prompts import render
from synthesis.parsing.answers import Operation, parse_operation_plan, parse_state_plan
from synthesis.parsing.sources import MethodSource, parse_class_code, parse_method, refuse_outside_state
from synthesis.run.context import Context
from synthesis.run.report import KEPT, StageReport
from synthesis.stages import dedup

STAGE = "skeletons"


def environment(record: dict[str, Any], assessment: dict[str, Any] | None = None) -> Environment:
    """The environment a kept skeleton record describes, with the code its assessment repaired, if it did,
    and the texts it rewrote after removing tools, if it did.

    Raises CatalogError if the code is unusable.
    """
    code = (assessment or {}).get("code") or record["code"]
    texts = (assessment or {}).get("texts") or record
    return build_environment(
        env_id=record["key"], class_name=record["class_name"], code=code, summary=texts["summary"],
        introduction=texts["introduction"], rules=texts["rules"],
    )  # fmt: skip


async def run(ctx: Context) -> StageReport:
    if not ctx.workspace.environments.is_file():
        raise ConfigError("no environments yet: run `synth themes` first")
    themes = {env["env_id"]: env for env in dedup.environments(ctx)}
    if not themes:
        raise ConfigError("theme mining kept no environment: nothing to build")
    judged = ctx.workspace.themes.load()

    async def build(key: str) -> dict[str, Any]:
        source = judged.get(str(themes[key].get("source_task")), {}).get("task", "")
        return await build_skeleton(ctx, themes[key], source)

    return await ctx.run_items(STAGE, sorted(themes), ctx.workspace.skeletons, build)


async def build_skeleton(ctx: Context, theme: dict[str, Any], source_task: str = "") -> dict[str, Any]:
    """``source_task``: the corpus task the theme was mined from; the state plan must be able to serve it."""
    env_id = theme["env_id"]
    about = {"env_name": env_id, "summary": theme["summary"], "introduction": theme["introduction"]}
    task = source_task or "(not recorded)"
    plan = await ask(ctx.client, "generator", render("state_plan", env=env_id, source_task=task, **about),
                     parse_state_plan, stage=STAGE)  # fmt: skip
    attributes = [e.container for e in plan.entities] + [s.name for s in plan.settings]
    state_code = await ask(
        ctx.client, "generator",
        render("state_code", env=env_id, class_name=plan.class_name, plan=plan.to_json(), **about),
        lambda answer: parse_class_code(answer, plan.class_name, attributes), stage=STAGE,
    )  # fmt: skip
    rules = "\n".join(f"- {rule}" for rule in plan.rules)
    operations = await ask(
        ctx.client, "generator",
        render("operation_plan", env=env_id, class_name=plan.class_name, rules=rules, state_code=state_code, **about),
        lambda answer: parse_operation_plan(answer, set(attributes)), stage=STAGE,
    )  # fmt: skip
    names = ", ".join(op.name for op in operations)

    async def write(op: Operation) -> MethodSource | str:
        prompt = render(
            "operation_code", env=env_id, item=op.name, class_name=plan.class_name, rules=rules, state_code=state_code,
            operation={"name": op.name, "kind": op.kind, "description": op.description,
                       "parameters": [vars(a) for a in op.parameters]},
            all_operations=names,
        )  # fmt: skip
        def parse(answer: str) -> MethodSource:
            method = parse_method(answer, op.name)
            # (written into the class, to be checked with the class attributes it uses)
            code = assemble(state_code, plan.class_name, [method]).code
            refuse_outside_state(code, plan.class_name, set(method.functions))
            return method

        try:
            return await ask(ctx.client, "generator", prompt, parse, stage=STAGE)
        except AnswerRejected as exc:
            return f"{op.name}: {exc.last}"  # one bad method costs that operation, not the environment

    written = await asyncio.gather(*(write(op) for op in operations))
    methods = [m for m in written if isinstance(m, MethodSource)]
    lost = [m for m in written if isinstance(m, str)]
    kinds = {op.name: op.kind for op in operations}
    kept_kinds = {kinds[m.name] for m in methods}
    if kept_kinds != {"query", "change"}:
        raise Dropped("too_few_operations", "needs at least one working query and one state change; lost: " + "; ".join(lost))
    assembled = assemble(state_code, plan.class_name, methods)
    try:
        env = build_environment(env_id=env_id, class_name=plan.class_name, code=assembled.code, summary=theme["summary"],
                                introduction=theme["introduction"], rules=plan.rules)  # fmt: skip
    except CatalogError as exc:
        raise Dropped("unreadable_tools", exc.message) from exc
    pool = await ctx.pool()
    try:
        failure = await pool.validate(env_code(env))
    except RequestFailed as exc:  # e.g. a module that loops at import: the code's fault, not the sandbox's
        failure = {"kind": exc.kind, "message": exc.message}
    if failure is not None:
        raise Dropped("does_not_load", f"{failure['kind']}: {failure['message']}")
    return {
        "status": KEPT, "class_name": plan.class_name, "code": assembled.code, "summary": theme["summary"],
        "introduction": theme["introduction"], "rules": plan.rules, "plan": plan.to_json(),
        "operations": [{"name": op.name, "kind": op.kind} for op in operations if op.name in env.tool_names],
        "lost_operations": lost, "skipped_functions": assembled.skipped, "tools": sorted(env.tool_names),
    }  # fmt: skip
