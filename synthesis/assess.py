"""Stage 3, dual-agent assessment: a testing agent proposes calls, the sandbox runs them, a checking agent judges.

Outcomes the sandbox already decides are labelled without asking the checker:
an exception, a timeout or a resource limit is a Fail (a tool must never
raise), and so is a result that is not ``{"success": bool, ...}``. A call the
tester got wrong (unknown tool, arguments that do not bind) tests nothing and
is left out of the ratio.
"""

from __future__ import annotations

import ast
from collections import Counter
from typing import Any

from sandbox.pool import CallOutcome
from service.catalog import Environment
from synthesis import dedup, states
from synthesis.answers import ProbeCall, parse_probe_call, parse_verdict
from synthesis.config import Thresholds
from synthesis.context import Context
from synthesis.dialogue import ask
from synthesis.errors import AnswerRejected
from synthesis.prompts import render, shown
from synthesis.report import DROPPED, KEPT, StageReport
from synthesis.skeleton import env_code, environment

STAGE = "assess"
HISTORY = 6  # recent calls the tester sees, so it does not repeat itself
SANDBOX_FAILS = {"tool_exception", "timeout", "resource_limit"}


def pass_ratio(counts: Counter[str]) -> float:
    """(pass + warning) / judged; 0.0 when nothing was judged (EnvScaler divided by zero here)."""
    judged = counts["pass"] + counts["warning"] + counts["fail"]
    return (counts["pass"] + counts["warning"]) / judged if judged else 0.0


async def run(ctx: Context) -> StageReport:
    scope = dedup.in_scope(ctx)
    skeletons = {k: r for k, r in ctx.workspace.skeletons.load().items() if r.get("status") == KEPT and k in scope}
    ctx.required(ctx.workspace.skeletons, "skeletons", set(skeletons))
    _rejudge(ctx, set(skeletons))

    async def work(key: str) -> dict[str, Any]:
        return await assess(ctx, environment(skeletons[key]))

    return await ctx.run_items(STAGE, sorted(skeletons), ctx.workspace.assessments, work)


async def assess(ctx: Context, env: Environment) -> dict[str, Any]:
    rounds = ctx.config.thresholds.rounds
    pool = await ctx.pool()
    code = env_code(env)
    seed = (await states.generate(ctx, env, count=1, item="assessment", stage=STAGE,
                                  purpose="a varied state to test every tool against"))[0]  # fmt: skip
    state = await states.instantiate(pool, env, seed.init_config)
    tools = sorted(env.tool_names)
    tally = {name: {"positive": 0, "negative": 0} for name in tools}
    rules = "\n".join(f"- {rule}" for rule in env.rules)
    log: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    for n in range(1, rounds + 1):
        item = f"r{n:02d}"
        history = [{k: e[k] for k in ("tool", "arguments", "intent", "verdict")} for e in log[-HISTORY:] if "tool" in e]
        prompt = render("test_call", env=env.env_id, item=item, introduction=env.introduction, rules=rules,
                        tools=shown(env.tools, 12000), tally=tally, state=shown(states.view(state)),
                        history=history, round=str(n), rounds=str(rounds))  # fmt: skip
        try:
            probe = await ask(ctx.client, "tester", prompt, lambda a: parse_probe_call(a, set(tools)), stage=STAGE)
        except AnswerRejected as exc:
            log.append({"round": n, "skipped": f"tester: {exc.last}"})
            continue
        tally[probe.tool][probe.intent] += 1
        outcome = await pool.call(code, state, probe.tool, probe.arguments)
        entry: dict[str, Any] = {"round": n, "tool": probe.tool, "arguments": probe.arguments, "intent": probe.intent,
                                 "expectation": probe.expectation, "ok": outcome.ok, "result": outcome.result,
                                 "error": outcome.error, "diff": outcome.diff}  # fmt: skip
        entry["verdict"], entry["reason"] = await _label(ctx, env, item, rules, probe, state, outcome)
        if entry["verdict"] in ("pass", "warning", "fail"):
            counts[entry["verdict"]] += 1
        log.append(entry)
        if outcome.state is not None:
            state = outcome.state
    record = {"ratio": round(pass_ratio(counts), 4), "counts": dict(counts), "judged": sum(counts.values()),
              "rounds": rounds, "seed": seed.init_config, "log": log}  # fmt: skip
    return {**record, **decide(counts, rounds, ctx.config.thresholds)}


def decide(counts: Counter[str], rounds: int, thresholds: Thresholds) -> dict[str, Any]:
    """Keep or drop on the verdict counts: ``status``, and ``reason`` and ``detail`` for a drop."""
    judged = counts["pass"] + counts["warning"] + counts["fail"]
    ratio = pass_ratio(counts)
    if judged == 0 or judged < thresholds.min_judged * rounds:
        return {"status": DROPPED, "reason": "too_few_verdicts", "detail": f"{judged} of {rounds} rounds judged"}
    if ratio < thresholds.pass_ratio:
        detail = f"(pass + warning) / judged = {ratio:.2f} < {thresholds.pass_ratio}"
        return {"status": DROPPED, "reason": "below_pass_ratio", "detail": detail}
    return {"status": KEPT, "reason": None, "detail": None}


def _rejudge(ctx: Context, keys: set[str]) -> None:
    """Apply the current thresholds to finished assessments: a changed pass ratio needs no new rounds."""
    for key, record in ctx.workspace.assessments.load().items():
        if key in keys and record.get("status") in (KEPT, DROPPED) and "counts" in record:
            verdict = decide(Counter(record["counts"]), int(record["rounds"]), ctx.config.thresholds)
            if verdict["status"] != record["status"] or verdict["reason"] != record.get("reason"):
                ctx.workspace.assessments.append({**record, **verdict})


async def _label(ctx: Context, env: Environment, item: str, rules: str, probe: ProbeCall, before: str,
                 outcome: CallOutcome) -> tuple[str, str]:  # fmt: skip
    """The round's label and reason: from the sandbox outcome where that decides, else from the checking agent."""
    if outcome.error is not None:
        kind, message = outcome.error["type"], outcome.error["message"]
        if kind in SANDBOX_FAILS:
            return "fail", f"the tool did not return normally: {kind}: {message}"
        return "not_a_test", f"{kind}: {message}"  # the tester's mistake (or the sandbox's), not the tool's
    if not isinstance(outcome.result, dict) or not isinstance(outcome.result.get("success"), bool):
        return "fail", 'the result is not {"success": bool, ...}'
    after = outcome.state if outcome.state is not None else before
    prompt = render("check_call", env=env.env_id, item=item, rules=rules, tool=probe.tool,
                    method=method_source(env.code, env.class_name, probe.tool), arguments=probe.arguments,
                    intent=probe.intent, expectation=probe.expectation, before=shown(states.view(before)),
                    after=shown(states.view(after)), diff=shown(outcome.diff), result=shown(outcome.result, 3000))  # fmt: skip
    try:
        verdict = await ask(ctx.client, "checker", prompt, parse_verdict, stage=STAGE)
    except AnswerRejected:
        return "skipped", "the checker gave no usable verdict"
    return verdict.label, verdict.reason


def method_source(code: str, class_name: str, name: str) -> str:
    """The source of one method of ``class_name`` (what the checker reads)."""
    tree = ast.parse(code)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == name:
                    return ast.get_source_segment(code, fn, padded=True) or ""
    return ""
