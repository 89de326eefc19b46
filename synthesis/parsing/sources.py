"""Strict parsers for the code answers: the state class, one operation method, one check function.

Parsing here is static (``ast``); nothing is executed. The lints encode the
contract the prompts state: operations return ``{"success": ...}`` and never
raise, check functions never mutate the state they are given.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from service.catalog import outside_state
from synthesis.errors import ParseError
from synthesis.parsing.parse import python_answer

_MUTATORS = {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault",
             "add", "discard", "sort", "reverse", "__setitem__", "__delitem__"}  # fmt: skip
_STATE_ARGUMENTS = ("final_state", "initial_state")


def parse_class_code(answer: str, class_name: str, attributes: list[str]) -> str:
    """The module defining the record types and ``class_name`` with an ``__init__`` that sets every attribute."""
    source, tree = python_answer(answer)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    cls = classes.get(class_name)
    if cls is None:
        raise ParseError(f"the code defines no top-level class {class_name}")
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.Assign, ast.AnnAssign)) and not _docstring(node):
            raise ParseError(f"line {node.lineno}: only imports, classes and constants may appear at module level")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    init = methods.get("__init__")
    if init is None:
        raise ParseError(f"class {class_name} has no __init__")
    public = sorted(n for n in methods if not n.startswith("_"))
    if public:
        raise ParseError(f"class {class_name} must define only __init__ and private helpers for now; remove {', '.join(public)}")
    assigned = {t.attr for n in ast.walk(init) for t in _targets(n)
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}  # fmt: skip
    missing = [a for a in attributes if a not in assigned]
    if missing:
        raise ParseError(f"__init__ does not set self.{', self.'.join(missing)}")
    found = outside_state.findings(source)
    if found:
        raise ParseError(f"{OUTSIDE}\n{outside_state.problem_text(found)}")
    return source


# What a refusal of state kept outside the instance tells the model, before the lines at fault.
OUTSIDE = ("a session's instance is stored as its attributes and rebuilt from them, so state kept anywhere else "
           "is lost (module globals, class attributes, class-level containers changed through self, mutable "
           "defaults, caches on methods); keep all state on self:")


def refuse_outside_state(code: str, class_name: str, names: set[str]) -> None:
    """Refuse what the functions ``names`` of ``class_name`` in ``code`` (a class with a method just written
    into it) do to keep state outside the instance; the rest of the class was checked already.

    Raises:
        ParseError: naming each such construct, the method it is in, and the fix.
    """
    tree = ast.parse(code)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    spans = [(n.name, min([d.lineno for d in n.decorator_list] + [n.lineno]), n.end_lineno or n.lineno)
             for n in (cls.body if cls else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.name in names]
    problems = []
    for finding in outside_state.findings(code):
        for name, start, end in spans:
            if start <= finding.line <= end:
                problems.append(f"in {name}, line {finding.line - start + 1}: `{finding.construct}` "
                                f"{finding.problem}; {finding.fix}")
    if problems:
        raise ParseError(f"{OUTSIDE}\n" + "\n".join(problems[: outside_state.MAX_FINDINGS]))


@dataclass(frozen=True)
class MethodSource:
    """An operation's code: its imports and its functions (the operation plus private helpers)."""

    name: str
    imports: list[str]
    functions: dict[str, str]  # name -> source at column 0


def parse_method(answer: str, name: str) -> MethodSource:
    source, tree = python_answer(answer)
    lines = source.splitlines()
    imports: list[str] = []
    functions: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(ast.unparse(node))
        elif isinstance(node, ast.FunctionDef):
            if node.name != name and not node.name.startswith("_"):
                raise ParseError(f"give only the method {name} (private helpers starting with _ are allowed), not {node.name}")
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            functions[node.name] = "\n".join(lines[start - 1 : node.end_lineno])
        elif isinstance(node, ast.ClassDef):
            raise ParseError(f"give the method {name} alone, not inside a class")
        else:
            raise ParseError(f"line {node.lineno}: only imports and the method may appear; remove the rest")
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        raise ParseError(f"the code defines no method {name}")
    if not fn.args.args or fn.args.args[0].arg != "self":
        raise ParseError(f"{name} must take self as its first parameter")
    if not any(_is_result(n) for n in ast.walk(fn)):
        raise ParseError(f'{name} never returns a dict literal with a "success" key')
    for helper in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        stray = _raise_outside_try(helper)
        if stray is not None:
            raise ParseError(f"line {stray}: a raise escapes {helper.name}; return {{\"success\": False, \"error\": ...}} instead")
    return MethodSource(name, imports, functions)


def parse_check_func(answer: str) -> str:
    source, tree = python_answer(answer)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check_func"), None)
    if fn is None:
        raise ParseError("the code defines no top-level function check_func")
    if len(fn.args.args) != 1 or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs:
        raise ParseError("check_func must take exactly one parameter, final_state")
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.Assign)) and not _docstring(node):
            raise ParseError(f"line {node.lineno}: only imports, constants and functions may appear at module level")
    line = _mutation(tree, {fn.args.args[0].arg, *_STATE_ARGUMENTS})
    if line is not None:
        raise ParseError(f"line {line}: the check modifies the state it inspects; read it without changing it")
    if not any(isinstance(n, ast.Return) for n in ast.walk(fn)):
        raise ParseError("check_func never returns; it must return True or False")
    return source


# -- helpers ------------------------------------------------------------------------------


def _docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


def _is_result(node: ast.AST) -> bool:
    if not isinstance(node, ast.Return) or not isinstance(node.value, ast.Dict):
        return False
    return any(isinstance(k, ast.Constant) and k.value == "success" for k in node.value.keys)


def _raise_outside_try(fn: ast.FunctionDef) -> int | None:
    def visit(node: ast.AST, guarded: bool) -> int | None:
        if isinstance(node, ast.Raise) and not guarded:
            return node.lineno
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and node is not fn:
            return None  # a nested function raising into its own caller is that caller's business
        for name, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            inner = guarded or (isinstance(node, ast.Try) and name == "body")
            for child in children:
                if isinstance(child, ast.AST):
                    found = visit(child, inner)
                    if found is not None:
                        return found
        return None

    return visit(fn, False)


def _root(node: ast.AST) -> str | None:
    while True:
        if isinstance(node, (ast.Subscript, ast.Attribute)):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def _mutation(tree: ast.Module, tainted: set[str]) -> int | None:
    """The first line that changes something reached from a state argument, or None.

    Names bound from the state (``pets = final_state["pets"]``, loop variables over
    it) are followed; copies (``dict(...)``, ``copy.deepcopy(...)``) are not tainted.
    """
    tainted = set(tainted)
    for node in ast.walk(tree):  # two passes are enough for the aliasing checks write in practice
        _taint(node, tainted)
    for node in ast.walk(tree):
        _taint(node, tainted)
    for node in ast.walk(tree):
        for target in _targets(node) + (list(node.targets) if isinstance(node, ast.Delete) else []):
            if isinstance(target, (ast.Subscript, ast.Attribute)) and _root(target) in tainted:
                return target.lineno
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            if _root(node.func.value) in tainted:
                return node.lineno
    return None


def _taint(node: ast.AST, tainted: set[str]) -> None:
    if isinstance(node, ast.Assign) and _derived(node.value, tainted):
        tainted.update(t.id for t in node.targets if isinstance(t, ast.Name))
    elif isinstance(node, (ast.For, ast.comprehension)) and _derived(node.iter, tainted):
        tainted.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))


def _derived(value: ast.expr, tainted: set[str]) -> bool:
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return False  # dict(x), list(x), deepcopy(x), len(x): a new object
    return _root(value) in tainted
