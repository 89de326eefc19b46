"""Replaying a reference solution with a rebuild before every call, to find state kept outside the instance.

A session's instance is stored as its attributes and rebuilt from them whenever its live process
is gone. The static check (``service.catalog.outside_state``) refuses the ways of keeping state elsewhere
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

from sandbox.pool.calls import CallOutcome
from sandbox.pool.requests import WorkerPool
from sandbox.state.view import diff, view_encoded
from service.catalog.model import Environment, Scenario
from service.catalog.registry import env_code

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
            # (the state is used only when the worker no longer holds the session)
            outcome = await pool.held_call(code, session, step, call.name, call.arguments, state)
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
    note when the live run does not repeat itself either and differs from the rebuilt one only
    where it differs from itself (then no problem is reported)."""
    live = await live_run(pool, env, scenario)
    rebuilt = await rebuilt_run(pool, env, scenario)
    found = difference(live, rebuilt, scenario)
    if found is None:
        return None, None
    again = await live_run(pool, env, scenario)
    noise = Noise.between(live, again)
    if noise.empty:
        return _problem(found), None
    # Compared again, leaving out what two live runs disagree on (a timestamp, a drawn id):
    # everything else must still be the same after rebuilds.
    found = difference(live, rebuilt, scenario, noise)
    if found is not None:
        return _problem(found), None
    return None, (f"its results differ between two live runs too ({noise}); everything else is the same "
                  f"when rebuilt")


def _problem(found: str) -> str:
    return (f"a rebuild changes the results, so it keeps state outside the instance's attributes, which is "
            f"lost whenever a session is rebuilt from its stored state: {found}")


@dataclass(frozen=True)
class Noise:
    """Where two live runs of one solution differ: answers (by step) and state paths."""

    steps: frozenset[int]
    paths: frozenset[str] | None  # None: the states could not be compared path by path

    @classmethod
    def between(cls, one: Run, two: Run) -> Noise:
        steps = frozenset(i for i, (a, b) in enumerate(zip(one.answers, two.answers, strict=True)) if a != b)
        paths: list[str] | None = [] if one.state == two.state else _paths(one.state, two.state)
        return cls(steps, None if paths is None else frozenset(paths))

    @property
    def empty(self) -> bool:
        return not self.steps and self.paths == frozenset()

    def __str__(self) -> str:
        parts = [f"answers at steps {sorted(self.steps)}"] if self.steps else []
        if self.paths is None:
            parts.append("the final state")
        elif self.paths:
            parts.append(f"the final state at {', '.join(sorted(self.paths)[:SHOWN_PATHS])}")
        return " and ".join(parts)


def difference(live: Run, rebuilt: Run, scenario: Scenario, noise: Noise | None = None) -> str | None:
    """The first difference between the two runs, named by step, outside ``noise``; None when they agree."""
    calls = scenario.reference_solution or []
    for i, (a, b, call) in enumerate(zip(live.answers, rebuilt.answers, calls, strict=True)):
        if a != b and (noise is None or i not in noise.steps):
            return (f"reference_solution[{i}] {call.name} answered {_shown(a)} in a live session but "
                    f"{_shown(b)} when rebuilt from the stored state")
    if live.state != rebuilt.state:
        paths = _paths(live.state, rebuilt.state)
        if noise is not None:
            if noise.paths is None:
                return None  # (the live runs' states could not be compared: nothing more to say)
            paths = None if paths is None else [p for p in paths if p not in noise.paths]
        if paths == []:
            return None  # the same state written otherwise (a set's order), or differing only as live runs do
        where = f" at {', '.join(paths[:SHOWN_PATHS])}" if paths else ""
        return f"the final state differs{where} between the live session and the rebuilt one"
    return None


def _answer(outcome: CallOutcome) -> dict[str, Any]:
    return {"ok": outcome.ok, "result": outcome.result, "error": outcome.error}


def _shown(answer: dict[str, Any]) -> str:
    text = json.dumps(answer["result"] if answer["ok"] else {"error": answer["error"]}, sort_keys=True,
                      ensure_ascii=False, default=repr)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _paths(live: str, rebuilt: str) -> list[str] | None:
    """Every place the two states' views differ (empty: nowhere); None when they cannot be compared."""
    try:
        changes = diff(view_encoded(json.loads(live)), view_encoded(json.loads(rebuilt)))
    except (ValueError, TypeError, RecursionError):
        return None
    return [c.get("path", "") or "/" for c in (*changes["changed"], *changes["added"], *changes["removed"])]
