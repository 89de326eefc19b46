"""Replaying a reference solution with a rebuild before every call, to find state kept outside the instance.

A session's instance is stored as its attributes and rebuilt from them whenever its live process
is gone. The static check (``service.outside_state``) refuses the ways of keeping state elsewhere
that can be read from the code; what it cannot follow (a closure's cell, a module-level object
changed through an alias, a module object's own methods) shows when the same calls give other
results once the instance is rebuilt. So the reference solution runs twice in the sandbox: in a
live session, and with each call's instance rebuilt from the state the previous call stored.
Every call's answer and the final state must be the same.

An environment that does not repeat itself (time, randomness) differs between two live runs too:
when the live run, made again, differs from itself at the same place, the difference is put down
to that, not to a rebuild.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from sandbox.pool import CallOutcome, WorkerPool
from sandbox.view import diff, view_encoded
from service.catalog import Environment, Scenario
from service.registry import env_code

SHOWN_CHARS = 300
SHOWN_PATHS = 5


@dataclass
class Run:
    answers: list[dict[str, Any]]  # per call: ok, result, error
    state: str  # the encoded state after the last call


async def live_run(pool: WorkerPool, env: Environment, scenario: Scenario) -> Run:
    """The solution in one live session (the worker keeps the instance between calls)."""
    code = env_code(env)
    session = "rebuild-check-" + secrets.token_hex(8)
    state = await pool.init_state(code, scenario.init_config, session)
    answers = []
    try:
        for step, call in enumerate(scenario.reference_solution or []):
            current = state

            async def stored(current: str = current) -> str:
                return current  # (read only when the worker no longer holds the session)

            outcome = await pool.session_call(code, session, step, stored, call.name, call.arguments)
            answers.append(_answer(outcome))
            state = outcome.state if outcome.state is not None else state
    finally:
        pool.end_session(session)
    return Run(answers, state)


async def rebuilt_run(pool: WorkerPool, env: Environment, scenario: Scenario) -> Run:
    """The solution with every call's instance rebuilt from the state the previous call stored."""
    code = env_code(env)
    state = await pool.init_state(code, scenario.init_config)
    answers = []
    for call in scenario.reference_solution or []:
        outcome = await pool.call(code, state, call.name, call.arguments)
        answers.append(_answer(outcome))
        state = outcome.state if outcome.state is not None else state
    return Run(answers, state)


async def divergence(pool: WorkerPool, env: Environment, scenario: Scenario) -> tuple[str | None, str | None]:
    """(problem, note): what differs when every call rebuilds the instance, naming the step; or a
    note when the live run does not repeat itself either (then no problem is reported)."""
    live = await live_run(pool, env, scenario)
    rebuilt = await rebuilt_run(pool, env, scenario)
    found = difference(live, rebuilt, scenario)
    if found is None:
        return None, None
    again = await live_run(pool, env, scenario)
    if difference(live, again, scenario) is not None:
        return None, f"its results differ between two live runs too, so rebuilds were not compared ({found})"
    return (f"a rebuild changes the results, so it keeps state outside the instance's attributes, which is "
            f"lost whenever a session is rebuilt from its stored state: {found}"), None


def difference(live: Run, rebuilt: Run, scenario: Scenario) -> str | None:
    """The first difference between the two runs, named by step; None when they agree."""
    calls = scenario.reference_solution or []
    for i, (a, b, call) in enumerate(zip(live.answers, rebuilt.answers, calls, strict=True)):
        if a != b:
            return (f"reference_solution[{i}] {call.name} answered {_shown(a)} in a live session but "
                    f"{_shown(b)} when rebuilt from the stored state")
    if live.state != rebuilt.state:
        paths = _changed_paths(live.state, rebuilt.state)
        if paths == []:
            return None  # the same state written otherwise (a set's order)
        where = f" at {', '.join(paths)}" if paths else ""
        return f"the final state differs{where} between the live session and the rebuilt one"
    return None


def _answer(outcome: CallOutcome) -> dict[str, Any]:
    return {"ok": outcome.ok, "result": outcome.result, "error": outcome.error}


def _shown(answer: dict[str, Any]) -> str:
    text = json.dumps(answer["result"] if answer["ok"] else {"error": answer["error"]}, sort_keys=True,
                      ensure_ascii=False, default=repr)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _changed_paths(live: str, rebuilt: str) -> list[str] | None:
    """Where the two states' views differ (empty: nowhere); None when they cannot be compared."""
    try:
        changes = diff(view_encoded(json.loads(live)), view_encoded(json.loads(rebuilt)))
    except (ValueError, TypeError, RecursionError):
        return None
    paths = [c.get("path", "") for kind in ("changed", "added", "removed") for c in changes.get(kind, [])]
    return [p or "/" for p in paths[:SHOWN_PATHS]]
