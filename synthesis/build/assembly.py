"""Assembling an environment class from its parts: the state module plus one method per operation.

Imports from every part are hoisted to the top and merged; methods are
indented to match the class body; a method name already defined wins over a
later one. The result is parsed again, so what comes out always compiles.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field

from synthesis.errors import ParseError
from synthesis.parsing.sources import MethodSource


@dataclass
class Assembled:
    code: str
    skipped: list[str] = field(default_factory=list)  # functions dropped because the name was taken


def assemble(state_code: str, class_name: str, methods: list[MethodSource]) -> Assembled:
    """Raises ParseError: the state code defines no ``class_name`` (the parsers already checked)."""
    tree = ast.parse(state_code)
    lines = state_code.splitlines()
    imports: list[str] = []
    pieces: list[str] = []
    cls: ast.ClassDef | None = None
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(ast.unparse(node))
            continue
        piece = "\n".join(lines[_start(node, lines) - 1 : node.end_lineno])
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            cls = node
            piece = "\x00CLASS\x00"
        pieces.append(piece)
    if cls is None:
        raise ParseError(f"the state code defines no class {class_name}")
    indent = " " * (cls.body[0].col_offset if cls.body else 4)
    taken = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    added: list[str] = []
    out = Assembled("")
    for method in methods:
        imports.extend(method.imports)
        for name, source in method.functions.items():
            if name in taken:
                out.skipped.append(f"{method.name}: {name} is already defined")
                continue
            taken.add(name)
            added.append(textwrap.indent(source, indent))
    class_text = "\n".join(lines[_start(cls, lines) - 1 : cls.end_lineno])
    body = "\n\n".join([class_text, *added])
    module = "\n\n\n".join(p if p != "\x00CLASS\x00" else body for p in pieces)
    header = "\n".join(merge_imports(imports))
    out.code = (header + "\n\n\n" if header else "") + module.strip("\n") + "\n"
    ast.parse(out.code)  # a bug here is ours: let SyntaxError surface as one
    return out


def merge_imports(statements: list[str]) -> list[str]:
    """One line per module: ``from __future__`` first, then ``import x``, then merged ``from x import ...``."""
    plain: set[str] = set()
    from_names: dict[str, set[str]] = {}
    for statement in statements:
        for node in ast.parse(statement).body:
            if isinstance(node, ast.Import):
                plain.update(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                from_names.setdefault(module, set()).update(
                    a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names
                )
    lines: list[str] = []
    future = from_names.pop("__future__", None)
    if future:
        lines.append(f"from __future__ import {', '.join(sorted(future))}")
    lines.extend(f"import {name}" for name in sorted(plain))
    lines.extend(f"from {module} import {', '.join(sorted(names))}" for module, names in sorted(from_names.items()))
    return lines


def _start(node: ast.stmt, lines: list[str]) -> int:
    """First line of ``node`` with its decorators and the comment lines right above it."""
    decorators: list[ast.expr] = getattr(node, "decorator_list", [])
    start: int = min([d.lineno for d in decorators] + [node.lineno])
    while start > 1 and lines[start - 2].startswith("#"):  # column 0: not a comment of the block above
        start -= 1
    return start


def replace_method(code: str, class_name: str, name: str, method: MethodSource | None) -> str:
    """``code`` with method ``name`` of ``class_name`` replaced by ``method`` where it stands (its helpers replace
    any of the same name where they stand, new ones follow it), or removed when ``method`` is None. Imports are
    merged as in ``assemble``. Keeping the order keeps diffs between an environment's versions small.

    Raises ParseError: ``code`` defines no ``class_name``.
    """
    tree = ast.parse(code)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        raise ParseError(f"the code defines no class {class_name}")
    indent = " " * (cls.body[0].col_offset if cls.body else 4)
    new = dict(method.functions) if method else {}
    lines = code.splitlines()
    cut: set[int] = set()
    put: dict[int, list[str]] = {}  # line index -> the lines that go before it
    anchor = cls.end_lineno or len(lines)  # where functions the class did not have go: after the method, else last
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (node.name == name or node.name in new):
            start = _start(node, lines) - 1
            cut.update(range(start, node.end_lineno or node.lineno))
            if node.name in new:
                put[start] = textwrap.indent(new.pop(node.name), indent).splitlines()
            if node.name == name and method is not None:
                anchor = start
    if new:
        extra = [line for source in new.values() for line in ["", *textwrap.indent(source, indent).splitlines()]]
        put[anchor] = put.get(anchor, []) + extra
    out: list[str] = []
    for i, line in enumerate([*lines, ""]):
        out.extend(put.get(i, []))
        if i < len(lines) and i not in cut:
            out.append(line)
    imports = MethodSource(name, method.imports, {}) if method else None
    return assemble("\n".join(out), class_name, [imports] if imports else []).code
