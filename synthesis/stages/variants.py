"""Turn-based variants of validated scenarios (``envfoundry synth variants``): the training data for
episodes whose tool set or information changes mid-episode, which EnvScaler found missing.

From a scenario whose reference solution validates, each kind derives a two-turn episode:

    missing-tool   the tool of the solution's last call is withheld in turn 1 (the user's task as it
                   was); turn 2's user message says the assistant can go ahead, and the tool arrives
                   with it. The LLM writes that message.
    missing-param  a required argument of the solution that the task states (a card number, an
                   order id) is left out of turn 1: the LLM rewrites the task without it, so the
                   assistant has to ask, and writes the user's answer that gives it in turn 2.

Turn 1 has no part of the solution and one check, that nothing changed: the request cannot be
finished yet, so the right move is to say so (or ask) rather than leave it half done, which is
also what keeps an agent that guesses the missing value from passing. Turn 2 carries the whole
reference solution and the source's checks. A rewrite that still names the value, or an answer
that does not give it, is sent back to the model with the reason.

Each variant is replayed turn by turn in the sandbox exactly as ``catalog validate`` replays any
turn-based scenario (``service.engine.validate.check_scenario``: the solution turn by turn, an agent
that only ends turns must not score 1.0, the rebuild comparison); only variants without a
problem are written.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.errors import SandboxError
from service.catalog.collection import Catalog
from service.catalog.folders import bundled_catalog_dir, write_package
from service.catalog.model import MAX_TAGS, CatalogError, CheckItem, Environment, Scenario, ToolCall, Turn
from service.engine.validate import Report, check_scenario, sessions_for
from service.errors import ServiceError
from synthesis.errors import AnswerRejected, ConfigError, EndpointUnusable, LLMError, ParseError
from synthesis.llm.dialogue import ask
from synthesis.llm.prompts import render
from synthesis.parsing import parse
from synthesis.run.config import SynthConfig
from synthesis.run.context import Context

KINDS = ("missing-tool", "missing-param")
STAGE = "variants"
UNCHANGED = "def check_func(final_state):\n    return final_state == initial_state\n"


@dataclass(frozen=True)
class Held:
    """The argument a missing-param variant holds back from the first turn."""

    tool: str
    parameter: str
    value: Any


@dataclass
class Outcome:
    kept: list[Scenario] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (source scenario id, why)


def variant_id(scenario_id: str, kind: str) -> str:
    return f"{scenario_id}-{kind}"


def withheld_tool(scenario: Scenario) -> str | None:
    """The tool a missing-tool variant withholds: that of the solution's last call, the one that
    finishes the request (earlier calls are often lookups an agent could do in other ways)."""
    solution = scenario.reference_solution or []
    return solution[-1].name if solution else None


def _value_text(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None  # a flag or a structure is not something a user states in words
    text = str(value).strip()
    return text if len(text) >= 2 or isinstance(value, (int, float)) else None


def mentions(text: str, value: Any) -> bool:
    """Whether ``text`` states ``value`` (case-insensitive; not as part of a longer word or number)."""
    shown = _value_text(value)
    if shown is None:
        return False
    # Not inside a longer id ("M0021") or number ("15", "5.5"); a sentence's full stop may follow.
    return re.search(rf"(?<![\w.]){re.escape(shown)}(?!\w|[.,]\d)", text, re.IGNORECASE) is not None


def held_parameter(env: Environment, scenario: Scenario) -> Held | None:
    """The first required argument of the solution whose value the task states."""
    for call in scenario.reference_solution or []:
        tool = env.tool(call.name)
        required = (tool or {}).get("function", {}).get("parameters", {}).get("required") or []
        for name in required:
            if name in call.arguments and mentions(scenario.task, call.arguments[name]):
                return Held(call.name, name, call.arguments[name])
    return None


def parse_arrival(answer: str) -> str:
    data = parse.obj(parse.json_answer(answer), "the answer")
    return parse.text(data, "message", "the answer", min_len=5)


def parse_rewrite(answer: str, held: Held) -> tuple[str, str]:
    """The task without the held value and the reply that gives it."""
    data = parse.obj(parse.json_answer(answer), "the answer")
    task = parse.text(data, "task", "the answer", min_len=10)
    reply = parse.text(data, "reply", "the answer", min_len=2)
    shown = json.dumps(held.value, ensure_ascii=False)
    if mentions(task, held.value):
        raise ParseError(f"the rewritten task still states {shown}; leave that value out")
    if not mentions(reply, held.value):
        raise ParseError(f"the reply does not give {shown}; it must state exactly that value")
    return task, reply


def two_turns(scenario: Scenario, kind: str, first: str, second: str, arriving: tuple[str, ...],
              waiting_for: str) -> Scenario:
    """The variant: turn 1 changes nothing; turn 2 is the source's solution and checks."""
    hold = Turn(message=first, checklist=(CheckItem(item=f"Nothing was changed before {waiting_for}",
                                                    check=UNCHANGED, kind="keep"),),
                reference_solution=())
    act = Turn(message=second, tools=arriving, checklist=tuple(scenario.checklist),
               reference_solution=tuple(ToolCall(c.name, c.arguments) for c in scenario.reference_solution or []))
    tags = scenario.tags + (kind,) if kind not in scenario.tags and len(scenario.tags) < MAX_TAGS else scenario.tags
    return Scenario(scenario_id=variant_id(scenario.scenario_id, kind), env_id=scenario.env_id, task=first,
                    init_config=scenario.init_config, reference_solution=list(scenario.reference_solution or []),
                    split=scenario.split, tags=tags, turns=(hold, act))


def unusable(scenario: Scenario) -> str | None:
    """Why a scenario cannot be the source of a variant, or None."""
    if scenario.turns:
        return "it is turn-based already"
    if not scenario.reference_solution:
        return "it has no reference solution"
    if not scenario.checklist:
        return "it has no checks"
    if scenario.unchanged_is_correct:
        return "its correct outcome changes nothing"
    return None


async def derive(ctx: Context, env: Environment, scenario: Scenario, kind: str) -> Scenario | str:
    """The variant of ``kind``, or why there is none (before validation)."""
    why = unusable(scenario)
    if why is not None:
        return why
    if kind == "missing-tool":
        tool = withheld_tool(scenario)
        spec = env.tool(tool or "")
        if tool is None or spec is None:
            return "its solution calls no tool of the environment"
        if len(env.tools) < 2:
            return f"'{tool}' is the environment's only tool: turn 1 would offer none"
        prompt = render("variant_tool", env=env.env_id, item=scenario.scenario_id, task=scenario.task, tool=tool,
                        description=spec["function"].get("description") or "no description")
        message = await ask(ctx.client, "generator", prompt, parse_arrival, stage=STAGE)
        return two_turns(scenario, kind, scenario.task, message, (tool,), f"'{tool}' was available")
    held = held_parameter(env, scenario)
    if held is None:
        return "its task states no required argument of the solution"
    prompt = render("variant_param", env=env.env_id, item=scenario.scenario_id, task=scenario.task, tool=held.tool,
                    parameter=held.parameter, value=json.dumps(held.value, ensure_ascii=False))
    task, reply = await ask(ctx.client, "generator", prompt, lambda a: parse_rewrite(a, held), stage=STAGE)
    return two_turns(scenario, kind, task, reply, (), f"the user gave {held.parameter}")


async def validate(ctx: Context, env: Environment, variant: Scenario) -> list[str]:
    """The problems ``catalog validate`` would report for ``variant`` (none: it is kept)."""
    catalog = Catalog()
    catalog.add_environment(env)
    try:
        catalog.add_scenario(variant)
    except CatalogError as exc:
        return [exc.message]
    pool = await ctx.pool()
    report = Report()
    try:
        await check_scenario(sessions_for(catalog, pool), pool, catalog, variant, report)
    except ServiceError as exc:
        report.problems.append(exc.detail)
    except SandboxError as exc:
        report.problems.append(f"the sandbox failed: {exc.message}")
    return report.problems


async def run(ctx: Context, catalog: Catalog, kind: str, scenario_ids: list[str]) -> Outcome:
    """Derive and validate a ``kind`` variant of each scenario, ``run.concurrency`` at a time.

    Raises:
        EndpointUnusable: the LLM endpoint can serve no request.
    """
    outcome = Outcome()
    slots = asyncio.Semaphore(ctx.config.run.concurrency)

    async def one(scenario: Scenario) -> None:
        env = catalog.environments[scenario.env_id]
        async with slots:
            try:
                made = await derive(ctx, env, scenario, kind)
            except (AnswerRejected, LLMError) as exc:
                made = f"no usable rewrite: {exc.message}"
            if isinstance(made, str):
                outcome.dropped.append((scenario.scenario_id, made))
                ctx.note(STAGE, f"{scenario.scenario_id}: dropped: {made}")
                return
            problems = await validate(ctx, env, made)
        if problems:
            outcome.dropped.append((scenario.scenario_id, "; ".join(problems)))
            ctx.note(STAGE, f"{scenario.scenario_id}: dropped: {problems[0]}")
        else:
            outcome.kept.append(made)
            ctx.note(STAGE, f"{made.scenario_id}: validated turn by turn")

    try:
        async with asyncio.TaskGroup() as group:
            for scenario_id in scenario_ids:
                group.create_task(one(catalog.scenarios[scenario_id]))
    except BaseExceptionGroup as failures:
        stop = failures.subgroup(EndpointUnusable)
        if stop is None:
            raise
        raise _first(stop) from None
    outcome.kept.sort(key=lambda s: s.scenario_id)
    outcome.dropped.sort()
    return outcome


def _first(group: BaseExceptionGroup[EndpointUnusable]) -> EndpointUnusable:
    """The first item to meet it says why."""
    leaf = group.exceptions[0]
    return _first(leaf) if isinstance(leaf, BaseExceptionGroup) else leaf


def write(out: Path, catalog: Catalog, variants: list[Scenario]) -> None:
    """Write each environment with its variants under ``out``, keeping variants an earlier run wrote
    there (a variant of the same id is replaced)."""
    for env_id in sorted({v.env_id for v in variants}):
        mine = [v for v in variants if v.env_id == env_id]
        ids = {v.scenario_id for v in mine}
        earlier: list[Scenario] = []
        existing = out / env_id / "scenarios.jsonl"
        if existing.is_file():
            for line in existing.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    try:
                        scenario = Scenario.from_json(json.loads(line), where=str(existing))
                    except (ValueError, CatalogError):
                        continue  # not a scenario the server would load either
                    if scenario.scenario_id not in ids:
                        earlier.append(scenario)
        write_package(catalog.environments[env_id], sorted(earlier + mine, key=lambda s: s.scenario_id), out)


def run_command(config: SynthConfig, api_key: str | None, kind: str, catalog_dir: Path | None, out: Path,
                scenario_ids: list[str], *, use_cache: bool = True) -> int:
    """``synth variants``: derive, validate, write, and say what was kept; the exit code of ``synthesis.cli``.

    Raises:
        ConfigError: the catalog cannot be read, or names no such scenario.
    """
    try:
        catalog = Catalog()
        catalog.load_dir(catalog_dir or bundled_catalog_dir())
    except CatalogError as exc:
        raise ConfigError(exc.message, path=exc.path) from exc
    unknown = [s for s in scenario_ids if s not in catalog.scenarios]
    if unknown:
        raise ConfigError(f"no scenario {', '.join(map(repr, unknown))} in the catalog")
    chosen = scenario_ids or sorted(catalog.scenarios)

    async def go() -> Outcome:
        ctx = Context(config, out, api_key=api_key, stream=sys.stderr, use_cache=use_cache)
        try:
            return await run(ctx, catalog, kind, chosen)
        finally:
            await ctx.close()

    try:
        outcome = asyncio.run(go())
    except EndpointUnusable as exc:
        print(f"error: {exc.message}; nothing was written", file=sys.stderr)
        return 3
    write(out, catalog, outcome.kept)
    for scenario in outcome.kept:
        print(f"kept     {scenario.scenario_id}")
    for source, why in outcome.dropped:
        print(f"dropped  {source}: {why}")
    print(f"{kind}: {len(outcome.kept)} of {len(chosen)} scenarios gave a validated variant, written to {out}")
    return 0 if outcome.kept else 3
