"""``envfoundry catalog validate``: load every package and replay every reference solution in the sandbox,
as a session would run it and again with its instance rebuilt from the stored state before every call."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sandbox.errors import SandboxError
from sandbox.pool.requests import WorkerPool
from sandbox.wire.answers import ToolError
from service.catalog import rebuilds
from service.catalog.collection import Catalog
from service.catalog.model import CatalogError, Scenario
from service.catalog.registry import Registry, env_code
from service.catalog.requirements import AllowList, Packages
from service.engine.sessions import SessionLimits, Sessions
from service.errors import ServiceError
from service.stores.memory_store import MemoryStore


@dataclass
class Report:
    environments: int = 0
    scenarios: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


async def validate_catalog(folders: list[Path], pool: WorkerPool, packages: Packages | None = None) -> Report:
    """``packages``: what environments may require (as the server would have it); none by default."""
    report = Report()
    catalog = Catalog()
    for folder in folders:
        try:
            catalog.load_dir(folder)
        except CatalogError as exc:
            report.problems.append(f"{exc.path or folder}: {exc.message}")
            return report
    report.problems.extend(catalog.problems)
    # An environment whose requirements are refused or cannot be installed is a problem, and is
    # not replayed (the server would skip it too).
    report.problems.extend(await (packages or Packages(AllowList([]), None)).attach_catalog(catalog))
    report.environments = len(catalog.environments)
    report.scenarios = len(catalog.scenarios)
    sessions = sessions_for(catalog, pool)
    for env in catalog.environments.values():
        try:
            failure = await pool.validate(env_code(env))
        except SandboxError as exc:
            failure = {"kind": getattr(exc, "kind", ToolError.SANDBOX_ERROR), "message": exc.message}
        if failure:
            report.problems.append(f"{env.env_id}: {failure['kind']}: {failure['message']}")
    for scenario in sorted(catalog.scenarios.values(), key=lambda s: s.scenario_id):
        await check_scenario(sessions, pool, catalog, scenario, report)
    return report


def sessions_for(catalog: Catalog, pool: WorkerPool) -> Sessions:
    """An engine over ``catalog`` with sessions in memory: what ``check_scenario`` replays through."""
    store = MemoryStore()
    # One tenant replays: a sandbox worker kept for another would only idle.
    return Sessions(Registry(catalog, store, pool), store, pool, lock_wait=60, limits=SessionLimits(sandbox_reserve=0))


async def check_scenario(sessions: Sessions, pool: WorkerPool, catalog: Catalog, scenario: Scenario,
                         report: Report) -> None:
    """Replay ``scenario``'s reference solution as a session would (turn by turn for a turn-based one),
    then again with a rebuild before every call; add what is wrong to ``report.problems``."""
    where = f"{scenario.env_id}/{scenario.scenario_id}"
    if scenario.reference_solution is None:
        report.problems.append(f"{where}: no reference_solution")
        return
    if scenario.turns:
        await _validate_turns(sessions, scenario, where, report)
        await _compare_rebuilt(pool, catalog, scenario, where, report)
        return
    try:
        created = await sessions.create(scenario.scenario_id, None, None)
        sid = created.meta.session_id
        before = await sessions.score(sid)
        if before["total"] and before["passed"] == before["total"] and scenario.unchanged_is_correct:
            report.notes.append(f"{where}: every check passes on the initial state, as declared "
                                "(unchanged_is_correct: the correct outcome changes nothing)")
        elif before["total"] and before["passed"] == before["total"]:
            report.problems.append(f"{where}: every check already passes on the initial state "
                                   "(an agent that does nothing scores 1.0)")
        for check, item in zip(before["checks"], scenario.checklist, strict=True):
            if not check["passed"] or item.kind == "keep":
                continue  # a keep check is meant to pass on the initial state
            if item.kind == "change":
                report.problems.append(f"{where}: a 'change' check passes before any call, so it checks "
                                       f"nothing the agent does: {check['item']}")
            else:
                report.notes.append(f"{where}: passes before any call (fine for a 'leave unchanged' "
                                    f"check; give it kind 'keep' to say so): {check['item']}")
        for i, call in enumerate(scenario.reference_solution):
            step = (await sessions.call(sid, call.name, call.arguments)).record
            if not step["ok"]:
                report.problems.append(f"{where}: reference_solution[{i}] {call.name}: {step['observation']}")
        score = await sessions.score(sid)
        # Thousands of scenarios (an imported benchmark) must not all stay in memory at once.
        await sessions.delete(sid)
    except ServiceError as exc:
        report.problems.append(f"{where}: {exc.detail}")
        return
    for check in score["checks"]:
        if not check["passed"]:
            reason = f" ({check['error']})" if check["error"] else ""
            report.problems.append(f"{where}: check not passed after the reference solution: {check['item']}{reason}")
    await _compare_rebuilt(pool, catalog, scenario, where, report)


async def _validate_turns(sessions: Sessions, scenario: Scenario, where: str, report: Report) -> None:
    """A turn-based scenario: each turn's part of the reference solution, then the turn ended, as an agent
    would; every turn's checks must pass. A turn without a part of the solution is ended with no call.
    An agent that only ends every turn must not score 1.0 (unless the scenario says so)."""
    try:
        idle = (await sessions.create(scenario.scenario_id, None, None)).meta.session_id
        for _ in scenario.turns:
            await sessions.turns.end(idle, None)
        nothing = await sessions.score(idle)
        await sessions.delete(idle)
        if nothing["reward"] == 1.0 and scenario.unchanged_is_correct:
            report.notes.append(f"{where}: an agent that ends every turn without a call scores 1.0, as declared "
                                "(unchanged_is_correct)")
        elif nothing["reward"] == 1.0:
            report.problems.append(f"{where}: an agent that ends every turn without a call scores 1.0")
        sid = (await sessions.create(scenario.scenario_id, None, None)).meta.session_id
        for t, turn in enumerate(scenario.turns):
            for i, call in enumerate(turn.reference_solution or ()):
                step = (await sessions.call(sid, call.name, call.arguments)).record
                if not step["ok"]:
                    report.problems.append(f"{where}: turns[{t}].reference_solution[{i}] {call.name}: "
                                           f"{step['observation']}")
            await sessions.turns.end(sid, None)
        score = await sessions.score(sid)
        await sessions.delete(sid)
    except ServiceError as exc:
        report.problems.append(f"{where}: {exc.detail}")
        return
    for turn in score.get("turns") or []:
        for check in turn["checks"]:
            if not check["passed"]:
                reason = f" ({check['error']})" if check["error"] else ""
                report.problems.append(f"{where}: turns[{turn['turn']}]: check not passed after the reference "
                                       f"solution: {check['item']}{reason}")


async def _compare_rebuilt(pool: WorkerPool, catalog: Catalog, scenario: Scenario, where: str, report: Report) -> None:
    """The reference solution again, live and with a rebuild before every call: a class whose results
    differ keeps state outside its attributes, which a rebuilt session loses (``service.catalog.rebuilds``)."""
    try:
        problem, note = await rebuilds.divergence(pool, catalog.environments[scenario.env_id], scenario)
    except SandboxError as exc:
        report.problems.append(f"{where}: the rebuild check could not run: {exc.message}")
        return
    if problem is not None:
        report.problems.append(f"{where}: {problem}")
    if note is not None:
        report.notes.append(f"{where}: {note}")
