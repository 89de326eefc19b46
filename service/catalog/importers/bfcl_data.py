"""Reading an installed ``bfcl-eval`` (or a copy of its folder) as files, never importing it: its API
modules import packages such as mpmath and sentence-transformers, and the service runs none of its
code. Read are the entries and ground truth under ``data/``, the function docs under
``data/multi_turn_func_doc/``, the API classes' source under
``eval_checker/multi_turn_eval/func_source_code/``, and a few constants.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.catalog.model import CatalogError

_PROMPTS = "constants/default_prompts.py"
# What BFCL's inference says in a turn that only brings functions (its question is empty), when
# bfcl-eval's own constant cannot be read.
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
_SOURCE_DIR = "eval_checker/multi_turn_eval/func_source_code"
_CONSTANTS = "constants/executable_backend_config.py"


@dataclass
class Backend:
    """What bfcl-eval's constants say about its API classes."""

    modules: dict[str, str]  # class name -> module file stem
    docs: dict[str, str]  # class name -> function doc file name
    stateless: list[str]


def find_package() -> Path:
    """The folder of the installed ``bfcl_eval`` package, found without importing it.

    Raises:
        CatalogError: bfcl-eval is not installed.
    """
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise CatalogError("bfcl-eval is not installed: pip install bfcl-eval (or pass --source DIR)")
    return Path(next(iter(spec.submodule_search_locations)))


def _literal_assignments(path: Path) -> dict[str, Any]:
    values: dict[str, Any] = {}
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            node = stmt.value
            if isinstance(node, ast.Dict):
                values[stmt.targets[0].id] = {
                    ast.literal_eval(k): _text(v) for k, v in zip(node.keys, node.values, strict=True) if k
                }
            else:
                try:
                    values[stmt.targets[0].id] = ast.literal_eval(node)
                except ValueError:
                    continue
    return values


def _text(node: ast.expr) -> str:
    # Module paths are f-strings on a prefix constant: the literal parts are enough.
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
    return str(ast.literal_eval(node))


def read_backend(package: Path) -> Backend:
    path = package / _CONSTANTS
    try:
        values = _literal_assignments(path)
        modules = {name: path.rsplit(".", 1)[-1] for name, path in values["CLASS_FILE_PATH_MAPPING"].items()}
        return Backend(modules=modules,
                        docs=dict(values["MULTI_TURN_FUNC_DOC_FILE_MAPPING"]),
                        stateless=list(values.get("STATELESS_CLASSES", [])))
    except (OSError, SyntaxError, ValueError, KeyError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise CatalogError(f"not a bfcl_eval package: cannot read BFCL's class mappings ({reason})",
                           path=str(path)) from exc


def jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise CatalogError(f"cannot read {path}: {exc}", path=str(path)) from exc
    return [row for row in rows if isinstance(row, dict)]


def data_file(package: Path, folder: str, category: str) -> Path:
    matches = sorted((package / folder).glob(f"BFCL_*_{category}.json"))
    if not matches:
        raise CatalogError(f"no BFCL_*_{category}.json under {package / folder}", path=str(package / folder))
    return matches[-1]


class Source:
    """One BFCL module: its text without its ``bfcl_eval`` imports, and its classes' method signatures."""

    def __init__(self, path: Path) -> None:
        self.path = path
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        self.needs: set[str] = set()  # packages outside the standard library it imports
        lines = text.splitlines(keepends=True)
        for stmt in tree.body:
            if isinstance(stmt, ast.ImportFrom) and (stmt.module or "").startswith("bfcl_eval"):
                for n in range(stmt.lineno - 1, stmt.end_lineno or stmt.lineno):
                    lines[n] = "\n"  # the names come from the namespace it runs in
            elif isinstance(stmt, ast.Import | ast.ImportFrom):
                names = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else [stmt.module or ""]
                self.needs |= {n.split(".")[0] for n in names if not _stdlib(n)}
        self.text = "".join(lines)
        self.classes = {stmt.name: stmt for stmt in tree.body if isinstance(stmt, ast.ClassDef)}

    def methods(self, class_name: str) -> dict[str, ast.FunctionDef]:
        node = self.classes[class_name]
        return {fn.name: fn for fn in node.body if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_")}


def required_versions(package: Path) -> dict[str, str]:
    """bfcl-eval's own requirements by project name ("mpmath" -> "mpmath==1.3.0"), read from the
    metadata installed beside it (none for a source folder without it)."""
    from email.parser import HeaderParser

    from packaging.requirements import InvalidRequirement, Requirement

    found: dict[str, str] = {}
    for metadata in sorted(package.parent.glob("bfcl_eval-*.dist-info/METADATA")):
        for line in HeaderParser().parsestr(metadata.read_text(encoding="utf-8", errors="replace")).get_all(
                "Requires-Dist") or []:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            if requirement.marker is None and not requirement.url:
                found[requirement.name.lower()] = f"{requirement.name.lower()}{requirement.specifier}"
    return found


def _stdlib(module: str) -> bool:
    import sys

    return module.split(".")[0] in sys.stdlib_module_names

def added_functions_prompt(package: Path) -> str:
    try:
        value = _literal_assignments(package / _PROMPTS).get("DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC")
    except (OSError, SyntaxError, ValueError):
        return ADDED_FUNCTIONS_PROMPT
    return value if isinstance(value, str) and value else ADDED_FUNCTIONS_PROMPT


def read_sources(package: Path, backend: Backend) -> tuple[dict[str, Source], Source]:
    """The API modules by file stem, and ``long_context`` (whose names the others import).

    Raises:
        CatalogError: a source cannot be read or parsed.
    """
    source_dir = package / _SOURCE_DIR
    try:
        sources = {stem: Source(source_dir / f"{stem}.py") for stem in set(backend.modules.values())
                   if (source_dir / f"{stem}.py").is_file()}
        long_context = Source(source_dir / "long_context.py")
    except (OSError, SyntaxError, ValueError) as exc:
        raise CatalogError(f"cannot read BFCL's API sources under {source_dir}: {exc}", path=str(source_dir)) from exc
    return sources, long_context
