"""Stage 5, scenario validation: replay the reference solution in the sandbox and run every check.

A scenario is kept only when each reference call is accepted, the calls change
the state, every check passes on the resulting state, and every check of kind
``change`` fails on the initial state (else it verifies nothing the task does).
Each rejection names a reason code and the specifics, and keeps the evidence
(the replayed calls, the final state, every check's outcome) a repair needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from sandbox.pool.requests import WorkerPool
from service.catalog.model import Environment
from service.catalog.registry import env_code
from synthesis.parsing.answers import Call


@dataclass(frozen=True)
class Check:
    item: str
    kind: str  # change | keep
    source: str


def argument_problem(env: Environment, call: Call) -> str | None:
    """What the service would reject about ``call``'s arguments (the same JSON Schema check)."""
    tool = env.tool(call.name)
    if tool is None:
        return f"unknown tool '{call.name}'"
    error = best_match(Draft202012Validator(tool["function"].get("parameters") or {"type": "object"}).iter_errors(call.arguments))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"argument '{where}': {error.message}" if where else error.message


@dataclass
class Validation:
    """What a replay found: ``reason`` is None when the scenario is valid, else a drop reason code.

    The evidence a repair needs is kept either way: each call with its result,
    the final state, and every check's outcome after the solution and before it.
    """

    reason: str | None = None
    detail: str = ""
    trace: list[dict[str, Any]] = field(default_factory=list)
    final: str | None = None  # the encoded state after the calls that ran
    after: list[dict[str, Any]] = field(default_factory=list)  # {passed, error} per check, on the final state
    before: list[dict[str, Any]] = field(default_factory=list)  # the same on the initial state
    vacuous: list[int] = field(default_factory=list)  # checks of kind change that pass before the solution

    def failing_checks(self) -> list[int]:
        """Indexes of the checks at fault: failing after the solution, or (kind change) passing before it."""
        if self.reason == "check_fails_after_solution":
            return [i for i, r in enumerate(self.after) if not r["passed"]]
        return list(self.vacuous)


async def replay(pool: WorkerPool, env: Environment, initial: str, calls: list[Call], checks: list[Check]) -> Validation:
    """Run ``calls`` from the encoded state ``initial``, then every check; a rejection names its reason and keeps the evidence."""
    code = env_code(env)
    out = Validation(final=initial)
    for i, call in enumerate(calls):
        where = f"calls[{i}] {call.name}"
        problem = argument_problem(env, call)
        if problem:
            return _reject(out, "solution_invalid_call", f"{where}: {problem}")
        outcome = await pool.call(code, out.final or initial, call.name, call.arguments)
        out.trace.append({"name": call.name, "arguments": call.arguments, "result": outcome.result,
                          "error": outcome.error})  # fmt: skip
        if not outcome.ok:
            assert outcome.error is not None
            return _reject(out, "solution_call_error", f"{where}: {outcome.error['type']}: {outcome.error['message']}")
        result = outcome.result
        if isinstance(result, dict) and result.get("success") is False:
            return _reject(out, "solution_call_refused", f"{where}: {result.get('error')}")
        if outcome.state is not None:
            out.final = outcome.state
    for entry in out.trace:
        del entry["error"]  # every call succeeded: keep the trace as the catalog shows it
    sources = [c.source for c in checks]
    out.after = await pool.score(code, out.final or initial, initial, sources)
    out.before = await pool.score(code, initial, initial, sources)
    if out.final == initial:
        return _reject(out, "solution_changes_nothing", "the reference solution leaves the state as it was")
    failing = [f"{c.item} ({r['error'] or 'returned False'})" for c, r in zip(checks, out.after, strict=True) if not r["passed"]]
    if failing:
        return _reject(out, "check_fails_after_solution", "; ".join(failing))
    vacuous = [i for i, (c, r) in enumerate(zip(checks, out.before, strict=True)) if c.kind == "change" and r["passed"]]
    if vacuous:
        out.vacuous = vacuous
        return _reject(out, "check_passes_initially", "; ".join(checks[i].item for i in vacuous))
    return out


def _reject(out: Validation, reason: str, detail: str) -> Validation:
    out.reason, out.detail = reason, detail
    return out
