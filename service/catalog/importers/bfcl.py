"""Import BFCL's multi-turn categories from an installed ``bfcl-eval`` as catalog packages.

BFCL's files are read by ``bfcl_data``, never imported; ``bfcl_environment`` turns its API classes
into environments, one per distinct set of involved classes and excluded functions. This module
turns its entries into scenarios.

Checks are BFCL's: for each involved class, every public attribute equals the
ground-truth instance's (``state_checker``), the ground truth being replayed
by the check on a copy of the session's initial instances; and every
ground-truth execution result appears among the session's results
(``response_checker``). Two differences, both stated in the README: the checks
run once, on the final state, where BFCL checks after every turn; and the
task gives all turns at once (the conversation mode's simulated user can
reveal them one by one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.catalog.collection import Catalog
from service.catalog.folders import write_package
from service.catalog.importers.bfcl_data import (
    added_functions_prompt,
    data_file,
    find_package,
    jsonl,
    read_backend,
    read_sources,
    required_versions,
)
from service.catalog.importers.bfcl_environment import (
    RENDER,
    Combination,
    environment,
    schema_mismatch,
    widen_parameters,
)
from service.catalog.importers.envscaler import ImportReport
from service.catalog.model import CatalogError, CheckItem, Scenario, ToolCall, Turn

CATEGORIES = ("multi_turn_base", "multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param")
# Categories also written all at once (every turn in the task, checks on the final state), as a split
# of their own: miss_func and miss_param make sense only turn by turn.
ALL_AT_ONCE = ("multi_turn_base", "multi_turn_long_context")
ALL_AT_ONCE_SUFFIX = "_all_at_once"

_REPLAY = '''import json
from copy import deepcopy
''' + RENDER + '''

def _replay():
    instances = {{name: deepcopy(initial_state[name]) for name in {classes!r}}}
    results = []
    for api, method, arguments in {calls!r}:
        try:
            results.append(_render(getattr(instances[api], method)(**deepcopy(arguments))))
        except Exception as exc:
            results.append(f"Error during execution: {{exc}}")
    return instances, results
'''

_STATE_CHECK = '''

def check_func(final_state):
    expected = _replay()[0][{api!r}]
    model = final_state[{api!r}]
    return all(getattr(model, name, object()) == value
               for name, value in vars(expected).items() if not name.startswith("_"))
'''

_RESPONSE_CHECK = '''

def check_func(final_state):
    remaining = list(final_state.get("execution_results", []))
    for result in _replay()[1][{start}:]:
        if result not in remaining:
            return False
        remaining.remove(result)
    return True
'''

# BFCL fails a turn whose ground truth has calls when the model made none in it.
_ANSWERED_CHECK = '''
def check_func(final_state):
    return len(turn_responses["calls"]) > 0
'''


def _task(entry: dict[str, Any]) -> str:
    turns = []
    for number, turn in enumerate(entry.get("question") or [], start=1):
        text = "\n".join(str(m.get("content", "")) for m in turn if isinstance(m, dict) and m.get("role") == "user")
        turns.append(f"[turn {number}] {text}")
    return "\n\n".join(turns)


def _checks(combo: Combination, calls: list[ToolCall], start: int = 0) -> list[CheckItem]:
    """BFCL's state checker for each class and its response checker, after ``calls`` (the ground truth
    so far); the response checker asks for the results of ``calls[start:]`` (this turn's)."""
    resolved = [(combo.owner[c.name], c.name, c.arguments) for c in calls]
    replay = _REPLAY.format(classes=combo.classes, calls=resolved)
    checks = [CheckItem(item=f"{api}'s state equals the ground truth's (BFCL's state checker)",
                        check=replay + _STATE_CHECK.format(api=api)) for api in combo.classes]
    checks.append(CheckItem(item="Every ground-truth result appears among the calls' results (BFCL's response "
                                 "checker)", check=replay + _RESPONSE_CHECK.format(start=start)))
    return checks


def _arrivals(entry: dict[str, Any], ground_truth: list[list[ToolCall]]) -> tuple[dict[str, int], list[str]]:
    """The turn each function BFCL withholds arrives at, and notes where that is earlier than BFCL's:
    a ground truth that calls it before its turn (miss_func 49 calls ``tail`` in turn 1 and lists it as
    missing until turn 3; BFCL's executor runs it all the same) gets it from the turn that calls it, or
    its own reference solution would be an unknown tool."""
    arrival = {str(name): int(turn) for turn, names in (entry.get("missed_function") or {}).items()
               for name in names or []}
    notes = []
    for index, calls in enumerate(ground_truth):
        for call in calls:
            if arrival.get(call.name, -1) > index:
                notes.append(f"{call.name} arrives in turn {index}, where the ground truth calls it, not in turn "
                             f"{arrival[call.name]} as BFCL withholds it")
                arrival[call.name] = index
    return arrival, notes


def _turns(combo: Combination, entry: dict[str, Any], ground_truth: list[list[ToolCall]],
           added_prompt: str, arrival: dict[str, int]) -> tuple[Turn, ...]:
    """BFCL's protocol: one turn per question, the functions it withholds arriving at their turn, and
    after each turn whose ground truth has calls, BFCL's checks: the model called something in it, each
    class's state equals the ground truth's so far, and this turn's ground-truth results appear among
    the model's results so far. A turn whose ground truth is empty (the function or a parameter is
    missing, so the model should ask or stop) is not checked, as in BFCL."""
    turns = []
    done: list[ToolCall] = []
    for index, question in enumerate(entry.get("question") or []):
        message = _message(question) or added_prompt
        calls = ground_truth[index] if index < len(ground_truth) else []
        checks: list[CheckItem] = []
        if calls:
            checks = [CheckItem(item="The model called a function in this turn (BFCL fails an empty turn)",
                                check=_ANSWERED_CHECK),
                      *_checks(combo, done + calls, start=len(done))]
        done += calls
        tools = tuple(name for name, turn in arrival.items() if turn == index)
        turns.append(Turn(message=message, tools=tools, checklist=tuple(checks), reference_solution=tuple(calls)))
    return tuple(turns)


def _message(question: Any) -> str:
    if not isinstance(question, list):
        return ""
    return "\n".join(str(m.get("content", "")) for m in question if isinstance(m, dict) and m.get("role") == "user")


def import_bfcl(out: Path, package: Path | None = None, categories: tuple[str, ...] = CATEGORIES, *,
                widen: bool = True) -> ImportReport:
    """Write the multi-turn ``categories`` of bfcl-eval (installed, or at ``package``) as packages under ``out``.

    A ground truth that gives a parameter another type than BFCL's doc says (entry 173 of each category
    closes ticket 'ticket_001' where the doc says an integer) widens that parameter of its environment
    to take both, named in the report's notes; with ``widen`` false such an entry is skipped instead.

    An environment whose classes import packages outside the standard library (MathAPI imports
    mpmath) declares them as ``requirements``, at the versions bfcl-eval itself requires when its
    metadata says; a server serves it when its operator allows them (``service.catalog.requirements``).

    Raises:
        CatalogError: bfcl-eval cannot be found, a category is not multi-turn, or its files cannot be read.
    """
    for category in categories:
        if category not in CATEGORIES:
            raise CatalogError(f"category {category!r} is not importable: choose from {', '.join(CATEGORIES)}")
    package = Path(package) if package is not None else find_package()
    backend = read_backend(package)
    sources, long_context = read_sources(package, backend)
    report = ImportReport()
    catalog = Catalog()
    pinned = required_versions(package)
    added_prompt = added_functions_prompt(package)
    combos: dict[str, Combination] = {}
    for category in categories:
        answers = {row.get("id"): row.get("ground_truth") for row in
                   jsonl(data_file(package, "data/possible_answer", category))}
        for entry in jsonl(data_file(package, "data", category)):
            entry_id = str(entry.get("id"))
            classes = [str(c) for c in entry.get("involved_classes") or []]
            missing = [c for c in classes if backend.modules.get(c) not in sources]
            if missing or not classes:
                report.skipped.append(f"{entry_id}: no source for {missing or 'its classes'}")
                continue
            needs = sorted({n for c in classes for n in sources[backend.modules[c]].needs})
            excluded = [str(f) for f in entry.get("excluded_function") or []]
            key = json.dumps([classes, sorted(excluded)])
            if key not in combos:
                combos[key] = Combination(package, backend, classes, excluded, sources)
                combo = combos[key]
                catalog.add_environment(environment(combo, backend, sources, long_context, pinned, needs))
            combo = combos[key]
            try:
                ground_truth = [[combo.call(text) for text in turn] for turn in answers.get(entry.get("id")) or []]
            except (ValueError, SyntaxError, KeyError) as exc:
                report.skipped.append(f"{entry_id}: ground truth not readable: {exc}")
                continue
            calls = [call for turn in ground_truth for call in turn]
            if not calls:
                report.skipped.append(f"{entry_id}: no ground truth in possible_answer")
                continue
            if schema_mismatch(combo, calls) and widen:
                notes = widen_parameters(combo, calls)
                if notes:  # the environment again, with the parameter widened
                    report.notes += [f"{entry_id}: {note}" for note in notes]
                    catalog.environments[combo.env_id] = environment(combo, backend, sources, long_context,
                                                                      pinned, needs)
            mismatch = schema_mismatch(combo, calls)
            if mismatch:  # the service checks every call against the tool's schema, so it could never replay
                report.skipped.append(f"{entry_id}: its ground truth does not match BFCL's own schema: {mismatch}")
                continue
            init_config = {"_initial_config": entry.get("initial_config") or {},
                           "_long_context": category == "multi_turn_long_context"}
            scenario_id = f"bfcl-{entry_id.replace('_', '-')}"
            arrival, notes = _arrivals(entry, ground_truth)
            report.notes += [f"{entry_id}: {note}" for note in notes]
            turns = _turns(combo, entry, ground_truth, added_prompt, arrival)
            # BFCL has no train/test: its category is the set a run evaluates on.
            catalog.add_scenario(Scenario(
                scenario_id=scenario_id, env_id=combo.env_id, task=turns[0].message, init_config=init_config,
                reference_solution=calls, split=category, tags=("bfcl",), turns=turns))
            if category in ALL_AT_ONCE:
                catalog.add_scenario(Scenario(
                    scenario_id=f"{scenario_id}-all-at-once", env_id=combo.env_id, task=_task(entry),
                    init_config=init_config, checklist=_checks(combo, calls), reference_solution=calls,
                    split=category + ALL_AT_ONCE_SUFFIX, tags=("bfcl",)))
    for env in catalog.environments.values():
        if catalog.scenarios_of(env.env_id):  # every entry of a combination may have been skipped
            write_package(env, catalog.scenarios_of(env.env_id), Path(out))
            report.environments += 1
    report.scenarios = len(catalog.scenarios)
    return report
