"""Repairing a scenario draft whose validation failed, from the evidence of its replay.

The model sees the failing check, the replayed calls with their results, every
check's outcome after and before the solution, and the final state, and says
what was wrong: a ``check`` (rewritten), the ``solution`` (rewritten), the
``task`` (the draft is abandoned for a fresh one) or the ``environment`` (a
named tool computes a wrong result: ``env_repair`` repairs the tool or drops
the environment).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from service.catalog.model import Environment
from synthesis.build.drafts import Draft, rules_of
from synthesis.errors import ParseError
from synthesis.llm.dialogue import ask
from synthesis.llm.prompts import render, shown
from synthesis.parsing import parse as p
from synthesis.parsing.answers import Call, parse_solution
from synthesis.parsing.sources import parse_check_func
from synthesis.run.context import Context
from synthesis.stages.replay import Validation

DIAGNOSES = ("check", "solution", "task", "environment")


@dataclass(frozen=True)
class ScenarioFix:
    diagnosis: str
    reason: str
    checks: dict[int, dict[str, str]] = field(default_factory=dict)  # 0-based index -> new "kind" and/or "source"
    calls: list[Call] | None = None
    tool: str | None = None  # the tool at fault, for "environment"

    def changed(self, draft: Draft) -> list[str]:
        """What the fix changes in ``draft``: a kind or a source given again unchanged is no change."""
        checks = []
        for i in sorted(self.checks):
            was = {"kind": draft.checks[i].kind, "source": draft.checks[i].source}
            parts = sorted(k for k, v in self.checks[i].items() if was[k] != v)
            checks.append(f"check {i + 1} {' and '.join(parts) if parts else 'unchanged'}")
        return checks + (["solution"] if self.calls is not None else [])


def parse_fix(answer: str, tools: set[str], n_checks: int) -> ScenarioFix:
    data = p.obj(p.json_answer(answer), "the answer")
    diagnosis = p.choice(data, "diagnosis", "answer", DIAGNOSES)
    reason = p.text(data, "reason", "answer")
    checks: dict[int, dict[str, str]] = {}
    for i, raw in enumerate(data.get("checks") or []):
        entry = p.obj(raw, f"checks[{i}]")
        number = p.integer(entry, "item", f"checks[{i}]", 1, n_checks)
        change: dict[str, str] = {}
        if "kind" in entry:
            change["kind"] = p.choice(entry, "kind", f"checks[{i}]", ("change", "keep"))
        if "check_func" in entry:
            source = p.text(entry, "check_func", f"checks[{i}]")
            try:
                change["source"] = parse_check_func(f"```python\n{source}\n```")
            except ParseError as exc:
                raise ParseError(f"checks[{i}].check_func: {exc.reason}") from None
        if not change:
            raise ParseError(f"checks[{i}] needs a new check_func, a new kind, or both")
        checks[number - 1] = change
    calls = parse_solution(json.dumps({"calls": data["calls"]}), tools) if data.get("calls") else None
    if diagnosis == "check" and not checks:
        raise ParseError('diagnosis "check" needs "checks": the new check_func or kind of each item at fault')
    if diagnosis == "solution" and calls is None:
        raise ParseError('diagnosis "solution" needs "calls": the complete corrected list of calls')
    tool = None
    if diagnosis == "environment":
        tool = p.choice(data, "tool", "answer", tuple(sorted(tools)))
    return ScenarioFix(diagnosis, reason, checks, calls, tool)


def apply(draft: Draft, fix: ScenarioFix) -> Draft:
    fixed = draft.with_checks(fix.checks)
    return replace(fixed, calls=fix.calls) if fix.calls is not None else fixed


def evidence(validation: Validation, states_view: Any) -> dict[str, Any]:
    """What the record keeps of a failed validation: enough to tell an environment bug from a bad check."""
    return {"trace": validation.trace, "checks_after": validation.after, "checks_before": validation.before,
            "final_state": states_view}  # fmt: skip


async def diagnose(ctx: Context, env: Environment, item: str, draft: Draft, validation: Validation, initial: str,
                   final: str, *, stage: str) -> ScenarioFix:  # fmt: skip
    """Ask the generator what was wrong and for the fix. ``initial`` and ``final`` are state views for the prompt."""
    numbered = [{"item": n, "kind": c.kind, "fact": c.item, "check_func": c.source}
                for n, c in enumerate(draft.checks, start=1)]  # fmt: skip
    at_fault = [n + 1 for n in validation.failing_checks()]
    outcomes = [{"item": n, "after_solution": a, "before_solution": b}
                for n, (a, b) in enumerate(zip(validation.after, validation.before, strict=False), start=1)]  # fmt: skip
    prompt = render(
        "scenario_repair", env=env.env_id, item=item, task=draft.spec.task, rules=rules_of(env),
        tools=shown(env.tools, 8000), checks=shown(numbered, 8000),
        calls=[{"name": c.name, "arguments": c.arguments} for c in draft.calls],
        failure=f"{validation.reason}: {validation.detail}", at_fault=at_fault or "none (a call or the solution failed)",
        trace=shown(validation.trace, 6000), outcomes=shown(outcomes, 3000), initial=initial, final=final,
    )  # fmt: skip
    return await ask(ctx.client, "generator", prompt, lambda a: parse_fix(a, env.tool_names, len(draft.checks)), stage=stage)
