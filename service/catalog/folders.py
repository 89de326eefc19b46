"""Catalog packages on disk, read and written.

A package is a folder per environment::

    <env_id>/env.py           the class source (never imported by the API process)
    <env_id>/env.json         {env_id, class_name, summary, introduction, rules, tools?, requirements?}
    <env_id>/scenarios.jsonl  one scenario per line

``tools`` in ``env.json`` is optional: a mapping of tool name to fields
(``description``, ``parameters``) that replace what static analysis extracted.
``requirements`` is optional too: the packages the code imports beyond the standard library
(see ``service.catalog.requirements``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.catalog.admission import build_environment
from service.catalog.model import CatalogError, Environment, Scenario


def read_package(folder: Path) -> tuple[Environment, list[Scenario], list[str]]:
    """Read one package folder: the environment, its readable scenarios, and what was wrong with the rest.

    Raises:
        CatalogError: the environment itself is unusable; ``path`` names the file at fault.
    """
    manifest_path = folder / "env.json"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CatalogError(f"cannot read {manifest_path}: {exc}", path=str(manifest_path)) from exc
    for key in ("env_id", "class_name"):
        if not isinstance(manifest.get(key), str):
            raise CatalogError(f"{manifest_path} lacks '{key}'", field=key, path=str(manifest_path))
    code_path = folder / "env.py"
    try:
        code = code_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"cannot read {code_path}: {exc}", path=str(code_path)) from exc
    try:
        env = build_environment(
            env_id=manifest["env_id"],
            class_name=manifest["class_name"],
            code=code,
            summary=manifest.get("summary", ""),
            introduction=manifest.get("introduction", ""),
            rules=manifest.get("rules", []),
            tool_overrides=manifest.get("tools"),
            requirements=_requirements(manifest.get("requirements"), manifest_path),
        )
    except CatalogError as exc:
        exc.path = str(code_path)
        raise
    if isinstance(manifest.get("provenance"), dict):
        env.provenance = manifest["provenance"]
    scenarios: list[Scenario] = []
    problems: list[str] = []
    scen_path = folder / "scenarios.jsonl"
    if scen_path.is_file():
        for lineno, line in enumerate(scen_path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{scen_path}:{lineno}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"{where}: invalid JSON: {exc} (scenario skipped)")
                continue
            try:
                scenario = Scenario.from_json(data, where=where)
            except CatalogError as exc:
                problems.append(f"{exc.message} (scenario skipped)")
                continue
            if scenario.env_id != env.env_id:
                problems.append(f"{where}: env_id '{scenario.env_id}' does not match the package '{env.env_id}' "
                                "(scenario skipped)")
                continue
            scenarios.append(scenario)
    return env, scenarios, problems


def _requirements(value: Any, where: Path) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise CatalogError(f"{where}: requirements must be a list of strings", field="requirements", path=str(where))
    return list(value)


def write_package(env: Environment, scenarios: list[Scenario], out: Path) -> Path:
    """Write ``env`` and its scenarios as a package folder under ``out``; return the folder."""
    folder = Path(out) / env.env_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "env.py").write_text(env.code, encoding="utf-8")
    (folder / "env.json").write_text(json.dumps(env.manifest(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    lines = [json.dumps(s.to_json(), ensure_ascii=False) for s in scenarios]
    (folder / "scenarios.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return folder


def bundled_catalog_dir() -> Path:
    """The catalog shipped with the project (a checkout's ``catalog/`` or the wheel's copy)."""
    service_root = Path(__file__).resolve().parents[1]
    for candidate in (service_root / "bundled_catalog", service_root.parent / "catalog"):
        if candidate.is_dir():
            return candidate
    raise CatalogError("the bundled catalog is missing from this installation")
