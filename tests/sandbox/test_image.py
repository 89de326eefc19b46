"""The sandbox image holds exactly the worker runtime, which uses the standard library only."""

from __future__ import annotations

import ast
import re
import sys

from sandbox.backends.container import RUNTIME_FOLDERS, runtime_files
from tests.conftest import ROOT

SANDBOX = ROOT / "sandbox"


def _module_file(module: str) -> str | None:
    """``sandbox.a.b`` as a path relative to ``sandbox/``, if it names a module there."""
    parts = module.split(".")[1:]
    for candidate in ("/".join(parts) + ".py", "/".join([*parts, "__init__.py"])):
        if (SANDBOX / candidate).is_file():
            return candidate
    return None


def _imports(name: str) -> set[str]:
    """What a runtime file imports: ``sandbox/`` files by path, anything else by its top-level name."""
    tree = ast.parse((SANDBOX / name).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                inside = _module_file(alias.name) if alias.name.startswith("sandbox.") else None
                found.add(inside or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "sandbox" or node.module.startswith("sandbox."):
                for alias in node.names:
                    inside = _module_file(f"{node.module}.{alias.name}") or _module_file(node.module)
                    assert inside, f"{name} imports {node.module}.{alias.name}, which is not in sandbox/"
                    found.add(inside)
            else:
                found.add(node.module.split(".")[0])
    return found


def test_the_worker_runtime_is_closed_under_imports_and_stdlib_only() -> None:
    image = set(runtime_files())
    seen, todo = set(), ["worker/main.py"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for module in _imports(name):
            if module.endswith(".py"):
                todo.append(module)
            elif module != "__future__":
                assert module in sys.stdlib_module_names, f"{name} imports {module}, not in the standard library"
    assert seen <= image, f"the worker imports files the image lacks: {sorted(seen - image)}"
    # Every file of the image, imported by the worker or not, is standard library only.
    for name in image:
        for module in _imports(name):
            if module.endswith(".py"):
                assert module in image, f"{name} imports {module}, which is not in the image"
            elif module != "__future__":
                assert module in sys.stdlib_module_names, f"{name} imports {module}, not in the standard library"


def test_the_dockerfile_copies_every_runtime_file() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stage = dockerfile.split("AS sandbox", 1)[1].split("FROM", 1)[0]
    copied = set(re.findall(r"^COPY sandbox/(\S+) ", stage, re.M))
    assert copied == {"__init__.py", *RUNTIME_FOLDERS}
