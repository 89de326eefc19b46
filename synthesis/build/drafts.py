"""A scenario draft: the task, its checklist, one check function per item, and the reference solution."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from service.catalog.model import CheckItem, Environment, Scenario, ToolCall
from synthesis.llm.dialogue import ask
from synthesis.llm.prompts import render, shown
from synthesis.parsing.answers import (
    Call,
    ChecklistItem,
    InitState,
    TaskSpec,
    parse_checklist,
    parse_solution,
    parse_task,
)
from synthesis.parsing.sources import parse_check_func
from synthesis.run.context import Context
from synthesis.stages import replay


@dataclass(frozen=True)
class Draft:
    spec: TaskSpec
    checks: list[replay.Check]
    calls: list[Call]

    def scenario(self, key: str, env_id: str, seed: InitState) -> Scenario:
        return Scenario(
            scenario_id=key, env_id=env_id, task=self.spec.task, init_config=seed.init_config,
            checklist=[CheckItem(c.item, c.source, c.kind) for c in self.checks],
            reference_solution=[ToolCall(c.name, c.arguments) for c in self.calls],
        )  # fmt: skip

    def with_checks(self, changes: dict[int, dict[str, str]]) -> Draft:
        """A copy with the checks at the given 0-based indexes changed (``kind`` and/or ``source``)."""
        checks = [replace(c, **changes.get(i, {})) for i, c in enumerate(self.checks)]
        return replace(self, checks=checks)


def rules_of(env: Environment) -> str:
    return "\n".join(f"- {rule}" for rule in env.rules)


async def write(ctx: Context, env: Environment, item: str, seed: InitState, view: str, *, stage: str,
                abandoned: list[str] | None = None) -> Draft:  # fmt: skip
    """A fresh draft grounded in the initial state ``view``; ``item`` labels its requests.

    ``abandoned``: earlier tasks for this state and why they were given up. They
    make the request differ from the first draft's (which the cache would
    otherwise answer with the same task) and steer the model away from them.
    """
    rules, tools = rules_of(env), shown(env.tools, 12000)
    earlier = ("\n\nEarlier tasks for this state were abandoned; write a different one that avoids their problem:\n"
               + "\n".join(f"- {a}" for a in abandoned)) if abandoned else ""  # fmt: skip
    spec = await ask(ctx.client, "generator",
                     render("task", env=env.env_id, item=item, introduction=env.introduction, rules=rules, tools=tools,
                            state=view, description=seed.description, earlier=earlier), parse_task, stage=stage)  # fmt: skip
    checklist = await ask(ctx.client, "generator",
                          render("checklist", env=env.env_id, item=item, task=spec.task, sub_goals=spec.sub_goals,
                                 state=view, rules=rules), parse_checklist, stage=stage)  # fmt: skip

    async def check(j: int, entry: ChecklistItem) -> replay.Check:
        prompt = render("check_func", env=env.env_id, item=f"{item}-c{j}", check_item=entry.item, kind=entry.kind,
                        task=spec.task, code=env.code, state=view)  # fmt: skip
        return replay.Check(entry.item, entry.kind, await ask(ctx.client, "generator", prompt, parse_check_func, stage=stage))

    checks = list(await asyncio.gather(*(check(j, e) for j, e in enumerate(checklist, start=1))))
    numbered = [{"item": c.item, "kind": c.kind} for c in checklist]
    calls = await ask(ctx.client, "generator",
                      render("solution", env=env.env_id, item=item, task=spec.task, checklist=numbered, tools=tools,
                             state=view, rules=rules),
                      lambda answer: parse_solution(answer, env.tool_names), stage=stage)  # fmt: skip
    return Draft(spec, checks, calls)
