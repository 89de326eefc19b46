"""The sandbox image holds exactly the worker runtime, which uses the standard library only."""

from __future__ import annotations

import ast
import re
import sys

from sandbox.container import RUNTIME_FILES
from tests.conftest import ROOT

SANDBOX = ROOT / "sandbox"


def _imports(name: str) -> set[str]:
    tree = ast.parse((SANDBOX / name).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "sandbox":
                found.update(f"sandbox.{alias.name}" for alias in node.names)
            else:
                found.add(node.module if node.module.startswith("sandbox.") else node.module.split(".")[0])
    return found


def test_the_worker_runtime_is_closed_under_imports_and_stdlib_only() -> None:
    seen, todo = set(), ["worker.py"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for module in _imports(name):
            if module.startswith("sandbox."):
                todo.append(module.split(".", 1)[1] + ".py")
            elif module != "__future__":
                assert module in sys.stdlib_module_names, f"{name} imports {module}, not in the standard library"
    assert seen | {"__init__.py"} == set(RUNTIME_FILES)


def test_the_dockerfile_copies_every_runtime_file() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"sandbox/(\w+\.py)", dockerfile.split("AS sandbox", 1)[1].split("FROM", 1)[0]))
    assert copied == set(RUNTIME_FILES)
