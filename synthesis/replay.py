"""Stage 5, scenario validation: replay the reference solution in the sandbox and run every check.

A scenario is kept only when each reference call is accepted, the calls change
the state, every check passes on the resulting state, and every check of kind
``change`` fails on the initial state (else it verifies nothing the task does).
Each rejection raises ``Dropped`` with a reason code and the specifics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from sandbox.pool import WorkerPool
from service.catalog import Environment
from synthesis.answers import Call
from synthesis.errors import Dropped
from synthesis.skeleton import env_code


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


async def replay(pool: WorkerPool, env: Environment, initial: str, calls: list[Call], checks: list[Check]) -> list[dict[str, Any]]:
    """Run ``calls`` from the encoded state ``initial``; return the trace, or raise ``Dropped``."""
    code = env_code(env)
    state = initial
    trace: list[dict[str, Any]] = []
    for i, call in enumerate(calls):
        where = f"calls[{i}] {call.name}"
        problem = argument_problem(env, call)
        if problem:
            raise Dropped("solution_invalid_call", f"{where}: {problem}")
        outcome = await pool.call(code, state, call.name, call.arguments)
        if not outcome.ok:
            assert outcome.error is not None
            raise Dropped("solution_call_error", f"{where}: {outcome.error['type']}: {outcome.error['message']}")
        result = outcome.result
        if isinstance(result, dict) and result.get("success") is False:
            raise Dropped("solution_call_refused", f"{where}: {result.get('error')}")
        trace.append({"name": call.name, "arguments": call.arguments, "result": result})
        if outcome.state is not None:
            state = outcome.state
    if state == initial:
        raise Dropped("solution_changes_nothing", "the reference solution leaves the state as it was")
    sources = [c.source for c in checks]
    after = await pool.score(code, state, initial, sources)
    failing = [f"{c.item} ({r['error'] or 'returned False'})" for c, r in zip(checks, after, strict=True) if not r["passed"]]
    if failing:
        raise Dropped("check_fails_after_solution", "; ".join(failing))
    before = await pool.score(code, initial, initial, sources)
    vacuous = [c.item for c, r in zip(checks, before, strict=True) if c.kind == "change" and r["passed"]]
    if vacuous:
        raise Dropped("check_passes_initially", "; ".join(vacuous))
    return trace
