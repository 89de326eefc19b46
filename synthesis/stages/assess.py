"""Stage 3, dual-agent assessment, then repair of the tools it finds failing.

The testing agent (``tester``) holds one conversation per environment and sees
what each call did; every call runs in the sandbox; the checking agent
(``checker``) labels it. Tools labelled fail are rewritten and judged again
(``tool_repair``). An environment is kept only when no tool remains labelled
fail and (pass + warning) / judged reaches ``pass_ratio`` over the calls of the
tools it keeps. The record holds the full log, the repaired code (``code``)
and the summary the catalog publishes (``assessment``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from service.catalog.model import Environment
from synthesis.agents import tester
from synthesis.agents.checker import JUDGED, method_source
from synthesis.repair import tool_repair
from synthesis.run.config import Thresholds
from synthesis.run.context import Context
from synthesis.run.report import DROPPED, KEPT, StageReport
from synthesis.stages import dedup, states
from synthesis.stages.skeleton import environment

STAGE = "assess"
__all__ = ["STAGE", "assess", "decide", "method_source", "pass_ratio", "run"]


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
        kinds = {op["name"]: op["kind"] for op in skeletons[key].get("operations") or []}
        return await assess(ctx, environment(skeletons[key]), kinds)

    report = await ctx.run_items(STAGE, sorted(skeletons), ctx.workspace.assessments, work)
    records = ctx.workspace.assessments.load()
    for key in sorted(skeletons):
        done = (records.get(key) or {}).get("assessment") or {}
        counts = " -> ".join(", ".join(f"{k} {v}" for k, v in sorted(c.items())) for c in (done.get("first_counts"), done.get("counts")) if c)
        if done.get("repaired") or done.get("removed") or done.get("failing"):
            parts = [f"{name} {', '.join(done[k])}" for k, name in (("repaired", "repaired"), ("removed", "removed"),
                                                                     ("failing", "still failing")) if done.get(k)]  # fmt: skip
            report.notes.append(f"{key}: {'; '.join(parts)} ({counts})")
    return report


async def assess(ctx: Context, env: Environment, kinds: dict[str, str] | None = None) -> dict[str, Any]:
    """``kinds``: operation name -> query | change, to refuse a removal that leaves no operation of a kind."""
    rounds = ctx.config.thresholds.rounds
    seed = await states.generate(ctx, env, item="assessment", stage=STAGE,
                                 purpose="a varied state to test every tool against")  # fmt: skip
    state = await states.instantiate(await ctx.pool(), env, seed.init_config)
    probing = await tester.probe(ctx, env, state, stage=STAGE)
    first = Counter(e["verdict"] for e in probing.log if e.get("verdict") in JUDGED)
    repaired, done = await tool_repair.repair(ctx, env, probing, stage=STAGE)
    counts = Counter(e["verdict"] for e in probing.log if e.get("verdict") in JUDGED and not e.get("tool_removed"))
    left = {kinds.get(name) for name in repaired.tool_names} if kinds else {"query", "change"}
    if done["removed"] and not {"query", "change"} <= left:
        done["failing"].append(f"removing {', '.join(done['removed'])} leaves no query or no change operation")
    texts = None
    if done["removed"] and not done["failing"]:
        repaired, texts = await tool_repair.describe_remaining(ctx, env, repaired, done["removed"], stage=STAGE)
    summary = {"rounds": rounds, "judged": sum(counts.values()), "counts": dict(counts), "first_counts": dict(first),
               "repaired": done["repaired"], "removed": done["removed"], "failing": done["failing"],
               "repair_attempts": len(done["attempts"])}  # fmt: skip
    record = {"ratio": round(pass_ratio(counts), 4), "counts": dict(counts), "judged": sum(counts.values()),
              "rounds": rounds, "seed": seed.init_config, "log": probing.log, "assessment": summary,
              "repairs": done["attempts"]}  # fmt: skip
    if repaired.code != env.code:
        record["code"] = repaired.code
    if texts is not None:  # the texts the environment is published and prompted with from now on
        record["texts"] = {"summary": texts.summary, "introduction": texts.introduction, "rules": texts.rules}
        summary["texts_rewritten"] = f"without {', '.join(done['removed'])}"
    return {**record, **decide(counts, rounds, ctx.config.thresholds, done["failing"])}


def decide(counts: Counter[str], rounds: int, thresholds: Thresholds, failing: list[str] | None = None) -> dict[str, Any]:
    """Keep or drop: ``status``, and ``reason`` and ``detail`` for a drop. ``failing``: tools still labelled fail."""
    judged = counts["pass"] + counts["warning"] + counts["fail"]
    ratio = pass_ratio(counts)
    if failing:
        return {"status": DROPPED, "reason": "tool_unrepaired", "detail": "still labelled fail: " + "; ".join(failing)}
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
            failing = (record.get("assessment") or {}).get("failing") or []
            verdict = decide(Counter(record["counts"]), int(record["rounds"]), ctx.config.thresholds, failing)
            if verdict["status"] != record["status"] or verdict["reason"] != record.get("reason"):
                ctx.workspace.assessments.append({**record, **verdict})
