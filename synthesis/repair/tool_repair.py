"""Repairing the tools the checking agent labelled fail, then assessing them again.

For each such tool the generator gets the checker's reasons, the method source,
the class, and every failing call (arguments, starting records, result, state
change). Its rewrite replaces the method, the class is loaded in the sandbox,
and every logged call of the tool is run again from the state it started from
and judged again. A tool is repaired when none of its calls fails any more;
after ``repair.tool_attempts`` rewrites it is removed from the class (and so
from the tool schemas) or, with ``repair.remove_unrepaired = false``, left
failing, which drops the environment. Nothing labelled fail ships. After a
removal the environment's summary, introduction and rules are rewritten to
describe only the tools that remain (``describe_remaining``), so no later
prompt asks for a tool that is gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sandbox.errors import RequestFailed
from service.catalog.admission import build_environment
from service.catalog.model import CatalogError, Environment
from service.catalog.registry import env_code
from synthesis.agents import checker
from synthesis.agents.tester import Probing
from synthesis.build.assembly import replace_method
from synthesis.errors import AnswerRejected, ParseError
from synthesis.llm.dialogue import ask
from synthesis.llm.prompts import render, shown
from synthesis.parsing.answers import EnvTexts, parse_env_texts
from synthesis.parsing.sources import MethodSource, parse_method, refuse_outside_state
from synthesis.run.context import Context
from synthesis.stages import states


def rebuilt(env: Environment, name: str, method: MethodSource | None) -> Environment:
    """``env`` with method ``name`` replaced (or removed); raises CatalogError or ParseError when unusable."""
    code = replace_method(env.code, env.class_name, name, method)
    return build_environment(env_id=env.env_id, class_name=env.class_name, code=code, summary=env.summary,
                             introduction=env.introduction, rules=env.rules)  # fmt: skip


async def repair(ctx: Context, env: Environment, probing: Probing, *, stage: str) -> tuple[Environment, dict[str, Any]]:
    """The environment with its failing tools repaired or removed, and what was done (``repaired``, ``removed``,
    ``failing``: tools still labelled fail, ``attempts``). The log's entries get their new verdicts; the first
    verdict stays as ``first_verdict``."""
    failing = sorted({e["tool"] for e in probing.log if e.get("verdict") == "fail"})
    summary: dict[str, Any] = {"repaired": [], "removed": [], "failing": [], "attempts": []}
    bounds = ctx.config.repair
    for tool in failing:
        fixed = None
        earlier: list[str] = []
        for attempt in range(1, bounds.tool_attempts + 1):
            outcome = await _attempt(ctx, env, tool, attempt, probing, earlier, stage=stage)
            earlier.append(f"rewrite {attempt}: {outcome[1]}")
            summary["attempts"].append({"tool": tool, "attempt": attempt, "result": outcome[1]})
            ctx.note(stage, f"{env.env_id}: repair of {tool}, attempt {attempt}: {outcome[1]}")
            if outcome[0] is not None:
                fixed = outcome[0]
                break
        if fixed is not None:
            env = fixed
            summary["repaired"].append(tool)
        elif bounds.remove_unrepaired:
            env = rebuilt(env, tool, None)
            for entry in probing.log:
                if entry.get("tool") == tool:
                    entry["tool_removed"] = True
            summary["removed"].append(tool)
            ctx.note(stage, f"{env.env_id}: removed {tool}: still failing after {bounds.tool_attempts} rewrites")
        else:
            summary["failing"].append(tool)
    return env, summary


async def describe_remaining(ctx: Context, before: Environment, after: Environment, removed: list[str], *,
                             stage: str) -> tuple[Environment, EnvTexts]:  # fmt: skip
    """``after`` (``before`` less the ``removed`` tools) with texts that describe only the tools it has."""
    gone = [{"name": t["function"]["name"], "description": t["function"].get("description", "")}
            for t in before.tools if t["function"]["name"] in removed]  # fmt: skip
    left = [{"name": t["function"]["name"], "description": t["function"].get("description", "")} for t in after.tools]
    prompt = render("env_texts", env=before.env_id, env_name=before.env_id, summary=before.summary,
                    introduction=before.introduction, rules="\n".join(f"- {r}" for r in before.rules),
                    removed=shown(gone, 4000), remaining=shown(left, 8000))  # fmt: skip
    texts = await ask(ctx.client, "generator", prompt, lambda a: parse_env_texts(a, removed), stage=stage)
    described = build_environment(env_id=after.env_id, class_name=after.class_name, code=after.code, summary=texts.summary,
                                  introduction=texts.introduction, rules=texts.rules)  # fmt: skip
    return described, texts


async def rewrite(ctx: Context, env: Environment, tool: str, failures: list[dict[str, Any]], *, item: str,
                  verify: Callable[[Environment], Awaitable[str | None]], stage: str,
                  ) -> tuple[Environment | None, list[str]]:  # fmt: skip
    """Rewrites of ``tool`` from ``failures`` until ``verify`` (None: fixed, else what is still wrong) accepts one,
    at most ``repair.tool_attempts``: the repaired environment (None if none was accepted) and each rewrite's result."""
    earlier: list[str] = []
    for attempt in range(1, ctx.config.repair.tool_attempts + 1):
        candidate, result = await _candidate(ctx, env, tool, failures, f"{item}-fix{attempt}", earlier, stage=stage)
        if candidate is not None:
            problem = await verify(candidate)
            result = f"still wrong: {problem}" if problem else "repaired: the scenario validates with it"
            candidate = None if problem else candidate
        earlier.append(f"rewrite {attempt}: {result}")
        ctx.note(stage, f"{env.env_id}: repair of {tool}, attempt {attempt}: {result}")
        if candidate is not None:
            return candidate, earlier
    return None, earlier


async def _candidate(ctx: Context, env: Environment, tool: str, failures: list[dict[str, Any]], item: str,
                     earlier: list[str], *, stage: str) -> tuple[Environment | None, str]:  # fmt: skip
    """One rewrite of ``tool`` that loads in the sandbox (None if not) and, if not, why.

    ``earlier``: what became of the previous rewrites; the model sees it (and the request differs from the
    previous one, which the cache would otherwise answer with the same rewrite).
    """
    rules = "\n".join(f"- {rule}" for rule in env.rules)
    prompt = render("tool_repair", env=env.env_id, item=item, tool=tool, class_name=env.class_name,
                    rules=rules, code=shown(env.code, 16000), method=checker.method_source(env.code, env.class_name, tool),
                    failures=shown(failures, 8000),
                    earlier="\n\nYour earlier rewrites did not fix it:\n" + "\n".join(earlier) if earlier else "")  # fmt: skip
    try:
        def parse(answer: str) -> MethodSource:
            method = parse_method(answer, tool)
            code = replace_method(env.code, env.class_name, tool, method)
            refuse_outside_state(code, env.class_name, set(method.functions))  # (sent back like a parse error)
            return method

        method = await ask(ctx.client, "generator", prompt, parse, stage=stage)
        candidate = rebuilt(env, tool, method)
    except AnswerRejected as exc:
        return None, f"no usable rewrite: {exc.last}"
    except (CatalogError, ParseError) as exc:
        return None, f"the rewrite is unusable: {exc.message}"
    pool = await ctx.pool()
    try:
        failure = await pool.validate(env_code(candidate))
    except RequestFailed as exc:
        failure = {"kind": exc.kind, "message": exc.message}
    if failure is not None:
        return None, f"the class does not load: {failure['kind']}: {failure['message']}"
    return candidate, ""


async def _attempt(ctx: Context, env: Environment, tool: str, attempt: int, probing: Probing, earlier: list[str],
                   *, stage: str) -> tuple[Environment | None, str]:  # fmt: skip
    """One rewrite of ``tool`` and its re-assessment: the repaired environment (None if not) and a one-line result."""
    entries = [e for e in probing.log if e.get("tool") == tool]
    failures = [{"arguments": e["arguments"], "intent": e["intent"], "expectation": e["expectation"],
                 "started_from": shown(states.focused(states.view(probing.before[e["round"]]), e["arguments"]), 4000), "returned": e["result"],
                 "error": e["error"], "state_changes": e["diff"], "reviewer": e["reason"]}
                for e in entries if e["verdict"] == "fail"]  # fmt: skip
    candidate, problem = await _candidate(ctx, env, tool, failures, f"{tool}-fix{attempt}", earlier, stage=stage)
    if candidate is None:
        return None, problem
    pool = await ctx.pool()
    verdicts = []
    for entry in entries:
        before = probing.before[entry["round"]]
        outcome = await pool.call(env_code(candidate), before, tool, entry["arguments"])
        rerun = {**entry, "ok": outcome.ok, "result": outcome.result, "error": outcome.error, "diff": outcome.diff}
        item = f"{tool}-fix{attempt}-r{entry['round']:02d}"
        rerun["verdict"], rerun["reason"] = await checker.label(ctx, candidate, item, rerun, before, outcome, stage=stage)
        verdicts.append(rerun)
    still = [v for v in verdicts if v["verdict"] == "fail"]
    if still:
        return None, f"{len(still)} of {len(verdicts)} calls still fail: {still[0]['reason']}"
    for entry, rerun in zip(entries, verdicts, strict=True):
        entry.setdefault("first_verdict", entry["verdict"])
        entry.setdefault("first_reason", entry["reason"])
        entry.update({k: rerun[k] for k in ("ok", "result", "error", "diff", "verdict", "reason")})
        entry["repaired_in"] = attempt
    return candidate, f"repaired: {len(verdicts)} calls judged again, none fails"
