"""Import and export the JSON files EnvScaler released.

EnvScaler ships two kinds of file:

* environment metadata: one JSON object keyed by env_id, each value holding
  ``env_class_name``, ``env_class_code``, ``environment_introduction``,
  ``constraints_rules``, ``tools`` (OpenAI function schemas) and descriptive
  fields (``environment_summary``, ``state_space_definition``, ``operation_list``);
* scenarios: a JSON list of ``{task_id, env_id, env_class_name, init_config,
  task, checklist, checklist_with_func: [{check_item, check_func}]}``, where
  ``init_config`` is sometimes itself a JSON string.

Importing turns them into catalog packages (see ``service.catalog.folders``); exporting
writes a catalog back in the same shapes. Tool schemas are always re-extracted
from the class code: the released ones drop Literal/Union types and can carry
mangled parameter names, so they only fill in tool descriptions the code lacks.
A whole file that cannot be read raises ``CatalogError``; a bad environment or
scenario inside a readable file is skipped and named in the ``ImportReport``.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.catalog.admission import build_environment
from service.catalog.collection import Catalog
from service.catalog.folders import write_package
from service.catalog.model import (
    CatalogError,
    CheckItem,
    ConflictError,
    Environment,
    Scenario,
    ToolCall,
    turns_from_json,
)

# An env_id becomes a folder name, so it must not be able to leave ``out``.
_ENV_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_+-]*\s*\n(.*?)\n?\s*```\s*$", re.DOTALL)
_FIRST_SENTENCE = re.compile(r"^(.+?[.!?])(?:\s|$)", re.DOTALL)


@dataclass
class ImportReport:
    """What an import wrote, and every item it skipped with the reason."""

    environments: int = 0
    scenarios: int = 0
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was imported otherwise than the source has it


class _SkipItem(Exception):
    """One environment or scenario is unusable; the message says why."""


# --- reading files -------------------------------------------------------------------


def _read_json_records(path: Path, what: str) -> tuple[Any, list[str]]:
    """Parse ``path`` as one JSON document, or as JSON Lines when it is not one.

    Returns the document (a list for JSON Lines) and the reasons for any JSON
    Lines rows that did not parse.

    Raises:
        CatalogError: the file cannot be read, or is neither JSON nor JSON Lines.
    """
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"cannot read {what} file {path}: {exc}", path=str(path)) from exc
    try:
        return json.loads(text), []
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, absurd numbers or nesting
        document_error: Exception = exc
    rows: list[Any] = []
    bad: list[str] = []
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    for position, (lineno, line) in enumerate(lines):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:
            if position == 0:
                break  # not JSON Lines either: report the document's own error
            bad.append(f"{what} {path}:{lineno}: invalid JSON: {exc}")
            continue
        if position == 0 and not isinstance(row, dict):
            break
        rows.append(row)
    else:
        if rows:
            return rows, bad
    detail = (
        f"line {document_error.lineno}, column {document_error.colno}: {document_error.msg}"
        if isinstance(document_error, json.JSONDecodeError)
        else str(document_error) or type(document_error).__name__
    )
    raise CatalogError(f"{what} file {path} is not valid JSON ({detail})", path=str(path))


def _env_entries(document: Any, path: Path) -> list[tuple[str, Any]]:
    """(env_id, record) pairs from an object keyed by env_id, or a list of records with ``env_id``."""
    if isinstance(document, dict):
        return [(str(key), value) for key, value in document.items()]
    if isinstance(document, list):
        entries = []
        for i, record in enumerate(document):
            env_id = record.get("env_id") if isinstance(record, dict) else None
            entries.append((str(env_id) if env_id is not None else f"#{i}", record))
        return entries
    raise CatalogError(
        f"environment file {path} must hold a JSON object keyed by env_id, not {type(document).__name__}",
        path=str(path),
    )


def _is_scenario(value: Any) -> bool:
    return isinstance(value, dict) and "task" in value and ("init_config" in value or "env_id" in value)


def _scenario_entries(document: Any, path: Path) -> list[tuple[str, Any]]:
    """(where, record) pairs from a list, an object keyed by anything, or a single scenario."""
    if isinstance(document, list):
        return [(f"scenarios[{i}]", record) for i, record in enumerate(document)]
    if _is_scenario(document):
        return [("scenario", document)]
    if isinstance(document, dict):
        entries: list[tuple[str, Any]] = []
        for key, value in document.items():
            if isinstance(value, list):
                entries += [(f"scenarios[{key!r}][{i}]", record) for i, record in enumerate(value)]
            else:
                entries.append((f"scenarios[{key!r}]", value))
        return entries
    raise CatalogError(
        f"scenario file {path} must hold a JSON list of scenarios, not {type(document).__name__}",
        path=str(path),
    )


# --- environments --------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _strip_fence(code: str) -> str:
    match = _FENCE.match(code)
    return match.group(1) if match else code


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    match = _FIRST_SENTENCE.match(flat)
    return match.group(1) if match else flat


def _rules(value: Any) -> list[str]:
    if isinstance(value, str):
        value = value.splitlines()
    if not isinstance(value, list):
        return []
    rules = []
    for rule in value:
        text = _BULLET.sub("", rule, count=1).strip() if isinstance(rule, str) else ""
        if text:
            rules.append(text)
    return rules


def _released_descriptions(tools: Any) -> dict[str, str]:
    """Tool name -> description from released OpenAI schemas (nested or flat)."""
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except (ValueError, RecursionError):
            return {}
    if isinstance(tools, dict):
        tools = list(tools.values())
    if not isinstance(tools, list):
        return {}
    found: dict[str, str] = {}
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        spec: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else tool
        name, description = spec.get("name"), _text(spec.get("description"))
        if isinstance(name, str) and description:
            found[name] = description
    return found


def _environment(env_id: str, record: Any) -> Environment:
    if not _ENV_ID.match(env_id):
        raise _SkipItem("env_id must be letters, digits, '_', '.' or '-' (at most 128, not starting with a symbol)")
    if not isinstance(record, dict):
        raise _SkipItem(f"the entry must be an object, not {type(record).__name__}")
    class_name = _text(record.get("env_class_name"))
    code = record.get("env_class_code")
    if not class_name:
        raise _SkipItem("env_class_name is missing")
    if not isinstance(code, str) or not code.strip():
        raise _SkipItem("env_class_code is missing")
    code = _strip_fence(code)
    introduction = _text(record.get("environment_introduction"))
    summary = _text(record.get("environment_summary")) or _first_sentence(introduction)
    rules = _rules(record.get("constraints_rules"))
    try:
        env = build_environment(
            env_id=env_id, class_name=class_name, code=code, summary=summary, introduction=introduction, rules=rules
        )
    except CatalogError as exc:
        raise _SkipItem(f"the class code is unusable: {exc.message}") from exc
    # Released descriptions only fill gaps: the code's own docstrings win.
    released = _released_descriptions(record.get("tools"))
    overrides = {
        tool["function"]["name"]: {"description": released[tool["function"]["name"]]}
        for tool in env.tools
        if not tool["function"].get("description") and tool["function"]["name"] in released
    }
    if not overrides:
        return env
    return build_environment(
        env_id=env_id,
        class_name=class_name,
        code=code,
        summary=summary,
        introduction=introduction,
        rules=rules,
        tool_overrides=overrides,
    )


# --- scenarios -----------------------------------------------------------------------


def _task_id(record: Any) -> str | None:
    if not isinstance(record, dict):
        return None
    task_id = record.get("task_id")
    if task_id is None or isinstance(task_id, (dict, list)) or str(task_id).strip() == "":
        return None
    return str(task_id).strip()


def _decode_init_config(value: Any) -> dict[str, Any]:
    # Released files sometimes store the state as a JSON string (rarely a Python repr).
    for _ in range(3):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            try:
                value = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                raise _SkipItem("init_config is a string that is not JSON") from None
    if not isinstance(value, dict):
        raise _SkipItem(f"init_config must be an object, not {type(value).__name__}")
    try:
        plain: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise _SkipItem(f"init_config is not plain JSON: {exc}") from None
    return plain


def _checklist(record: dict[str, Any]) -> list[CheckItem]:
    entries = record.get("checklist_with_func")
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise _SkipItem("checklist_with_func must be a list")
    plain_items: list[Any] = record["checklist"] if isinstance(record.get("checklist"), list) else []
    checks = []
    for i, entry in enumerate(entries):
        source = entry.get("check_func") if isinstance(entry, dict) else None
        if not isinstance(source, str) or not source.strip():
            raise _SkipItem(f"checklist_with_func[{i}] has no check_func source")
        item = entry.get("check_item")
        if not isinstance(item, str) and i < len(plain_items) and isinstance(plain_items[i], str):
            item = plain_items[i]
        checks.append(CheckItem(item=item if isinstance(item, str) else "", check=source))
    return checks


def _reference_solution(value: Any) -> list[ToolCall] | None:
    """Our own extension to the released shape, so exports of the catalog round-trip."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise _SkipItem("reference_solution must be a list")
    calls = []
    for i, call in enumerate(value):
        name = call.get("name") if isinstance(call, dict) else None
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise _SkipItem(f"reference_solution[{i}] must be {{name, arguments}}")
        calls.append(ToolCall(name=name, arguments=arguments))
    return calls


def _env_id_of(record: dict[str, Any], class_owners: dict[str, list[str]]) -> str:
    env_id = record.get("env_id")
    if isinstance(env_id, (str, int)) and not isinstance(env_id, bool) and str(env_id).strip():
        return str(env_id).strip()
    owners = class_owners.get(_text(record.get("env_class_name")), [])
    if len(owners) == 1:
        return owners[0]
    raise _SkipItem("env_id is missing")


def _scenario(record: dict[str, Any], scenario_id: str, env_id: str, env_class_name: str) -> Scenario:
    task = _text(record.get("task"))
    if not task:
        raise _SkipItem("task is missing")
    if "init_config" not in record:
        raise _SkipItem("init_config is missing")
    declared = _text(record.get("env_class_name"))
    if declared and declared != env_class_name:
        raise _SkipItem(f"env_class_name '{declared}' does not match environment '{env_id}' ({env_class_name})")
    return Scenario(
        scenario_id=scenario_id,
        env_id=env_id,
        task=task,
        init_config=_decode_init_config(record["init_config"]),
        checklist=_checklist(record),
        reference_solution=_reference_solution(record.get("reference_solution")),
        # Our own extension too: a turn-based scenario's turns, in the catalog's shape.
        turns=turns_from_json(record.get("turns"), f"scenario '{scenario_id}'"),
    )


def _scenario_ids(entries: list[tuple[str, Any]], env_ids: list[str | None]) -> list[str]:
    """``task_id`` when it is unique in the file, else ``{env_id}-{task_id}``."""
    task_ids = [_task_id(record) for _, record in entries]
    counts = Counter(t for t in task_ids if t is not None)
    ids = []
    for index, (task_id, env_id) in enumerate(zip(task_ids, env_ids, strict=False)):
        if task_id is None:
            ids.append(f"{env_id}-{index}")
        elif counts[task_id] == 1:
            ids.append(task_id)
        else:
            ids.append(f"{env_id}-{task_id}")
    return ids


def _add_scenarios(catalog: Catalog, path: Path, skipped_envs: set[str], report: ImportReport) -> None:
    """Add every usable scenario in ``path`` to ``catalog``; note the rest in ``report``."""
    document, bad_rows = _read_json_records(path, "scenario")
    report.skipped += bad_rows
    entries = _scenario_entries(document, path)
    class_owners: dict[str, list[str]] = {}
    for env in catalog.environments.values():
        class_owners.setdefault(env.class_name, []).append(env.env_id)
    env_ids: list[str | None] = []
    unresolved: list[str] = []
    for _, record in entries:
        try:
            if not isinstance(record, dict):
                raise _SkipItem(f"the entry must be an object, not {type(record).__name__}")
            env_ids.append(_env_id_of(record, class_owners))
            unresolved.append("")
        except _SkipItem as exc:
            env_ids.append(None)
            unresolved.append(str(exc))
    scenario_ids = _scenario_ids(entries, env_ids)
    for (where, record), env_id, why, scenario_id in zip(entries, env_ids, unresolved, scenario_ids, strict=False):
        task_id = _task_id(record)
        label = f"scenario {where}" + (f" (task_id {task_id})" if task_id is not None else "")
        try:
            if env_id is None:
                raise _SkipItem(why)
            owner = catalog.environments.get(env_id)
            if owner is None:
                reason = "was skipped" if env_id in skipped_envs else "is not in the environment file"
                raise _SkipItem(f"environment '{env_id}' {reason}")
            scenario = _scenario(record, scenario_id, env_id, owner.class_name)
            if not catalog.add_scenario(scenario):
                raise _SkipItem(f"duplicate of scenario '{scenario_id}'")
        except _SkipItem as exc:
            report.skipped.append(f"{label}: {exc}")
        except CatalogError as exc:  # a check that does not parse, or a conflicting id
            report.skipped.append(f"{label}: {exc.message}")


# --- public API ----------------------------------------------------------------------


def import_envscaler(envs_path: Path, scenarios_path: Path | None, out: Path) -> ImportReport:
    """Convert EnvScaler's released files into catalog packages under ``out``.

    Every usable environment is written with its usable scenarios via
    ``write_package``; anything else is skipped and described in the report.

    Raises:
        CatalogError: a file cannot be read, is not JSON (or JSON Lines), or has the wrong top-level shape.
    """
    report = ImportReport()
    catalog = Catalog()
    skipped_envs: set[str] = set()

    env_document, bad_rows = _read_json_records(Path(envs_path), "environment")
    report.skipped += bad_rows
    for env_id, record in _env_entries(env_document, Path(envs_path)):
        try:
            env = _environment(env_id, record)
            catalog.add_environment(env)
        except (_SkipItem, ConflictError) as exc:
            skipped_envs.add(env_id)
            report.skipped.append(f"environment '{env_id}': {exc}")

    if scenarios_path is not None:
        _add_scenarios(catalog, Path(scenarios_path), skipped_envs, report)

    for env in catalog.environments.values():
        try:
            write_package(env, catalog.scenarios_of(env.env_id), Path(out))
        except OSError as exc:
            raise CatalogError(f"cannot write package '{env.env_id}' under {out}: {exc}", path=str(out)) from exc
    report.environments = len(catalog.environments)
    report.scenarios = len(catalog.scenarios)
    return report


def export_envscaler(catalog: Catalog, envs_out: Path, scenarios_out: Path) -> None:
    """Write ``catalog`` as EnvScaler's environment-metadata object and scenario list.

    Scenarios keep their reference solutions under ``reference_solution`` and a
    turn-based scenario its ``turns`` in the catalog's own shape (neither is part
    of EnvScaler's shape; its loaders ignore unknown keys), so an import of the
    export gives the same scenarios back.

    Raises:
        CatalogError: an output file cannot be written.
    """
    environments = {
        env.env_id: {
            "env_class_name": env.class_name,
            "env_class_code": env.code,
            "environment_summary": env.summary,
            "environment_introduction": env.introduction,
            "constraints_rules": list(env.rules),
            "tools": env.tools,
        }
        for env in catalog.environments.values()
    }
    scenarios = []
    for scenario in catalog.scenarios.values():
        env = catalog.environments[scenario.env_id]
        record: dict[str, Any] = {
            "task_id": scenario.scenario_id,
            "env_id": scenario.env_id,
            "env_class_name": env.class_name,
            "init_config": scenario.init_config,
            "task": scenario.task,
            "checklist": [check.item for check in scenario.checklist],
            "checklist_with_func": [
                {"check_item": check.item, "check_func": check.check} for check in scenario.checklist
            ],
        }
        if scenario.reference_solution is not None:
            record["reference_solution"] = [
                {"name": call.name, "arguments": call.arguments} for call in scenario.reference_solution
            ]
        if scenario.turns:
            record["turns"] = [turn.to_json() for turn in scenario.turns]
        scenarios.append(record)
    _write_json(Path(envs_out), environments)
    _write_json(Path(scenarios_out), scenarios)


def _write_json(path: Path, document: Any) -> None:
    partial = path.with_name(f".{path.name}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise CatalogError(f"cannot write {path}: {exc}", path=str(path)) from exc
