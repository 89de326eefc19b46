"""What an environment module binds, read from its syntax tree: its module-level names by kind,
its classes (their class-level names, the names their methods bind on the instance, their
hierarchy), and the module functions its methods reach. ``service.catalog.state_writes`` asks it
where an object a method changes lives. Standard library only: it runs in the analysis child
(``python -S``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

CONSTRUCT_CHARS = 80  # a construct quoted in a finding is cut to this

Function = ast.FunctionDef | ast.AsyncFunctionDef
CONTAINERS = frozenset({"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "Counter", "deque",
                        "ChainMap", "array"})
ITERATORS = frozenset({"count", "cycle", "iter"})
FIELD_DECORATORS = ("dataclass", "define", "attrs", "frozen", "mutable")  # dataclasses, attrs


def short(node: ast.AST) -> str:
    try:
        text = " ".join(ast.unparse(node).split())
    except (ValueError, RecursionError, AttributeError):
        return type(node).__name__
    return text if len(text) <= CONSTRUCT_CHARS else text[: CONSTRUCT_CHARS - 3] + "..."


def is_container(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    return isinstance(value, ast.Call) and called_name(value) in CONTAINERS


def is_iterator(value: ast.expr | None) -> bool:
    if isinstance(value, ast.GeneratorExp):
        return True
    return isinstance(value, ast.Call) and called_name(value) in ITERATORS


def called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def decorator_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of the functions, lambdas and classes it defines."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _nested_functions(fn: Function) -> list[Function]:
    return [n for n in own_nodes(fn) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


@dataclass
class ClassBindings:
    node: ast.ClassDef
    attrs: dict[str, ast.expr | None] = field(default_factory=dict)  # class-body bindings
    fields: set[str] = field(default_factory=set)  # annotated names an instance gets as its own (dataclass, model)
    bound: set[str] = field(default_factory=set)  # names some method binds on the instance
    dynamic: bool = False  # a method binds computed names (setattr(self, name, v), self.__dict__...)
    bases: list[str] = field(default_factory=list)


class ModuleBindings:
    """Built once per module: ``kinds`` maps each module-level name to class, function, module,
    imported, container, iterator or value; ``classes`` and ``functions`` hold the module's own."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.kinds: dict[str, str] = {}
        self.classes: dict[str, ClassBindings] = {}
        self.functions: dict[str, Function] = {}
        self._families: dict[str, list[ClassBindings]] = {}
        self._class_levels: dict[tuple[str, str], ast.expr | None | bool] = {}
        for node in self._module_statements(tree.body):
            self._bind_module(node)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            self.classes.setdefault(cls.name, self._class_info(cls))

    def methods(self) -> list[tuple[Function, ClassBindings]]:
        """Every method of every class, with its class."""
        return [(item, info) for info in self.classes.values() for item in info.node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]

    def _module_statements(self, body: list[ast.stmt]) -> Iterator[ast.stmt]:
        for node in body:
            yield node
            if isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for name in ("body", "orelse", "finalbody"):
                    yield from self._module_statements(getattr(node, name, []))
                for handler in getattr(node, "handlers", []):
                    yield from self._module_statements(handler.body)

    def _bind_module(self, node: ast.stmt) -> None:
        if isinstance(node, ast.ClassDef):
            self.kinds[node.name] = "class"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.kinds[node.name] = "function"
            self.functions[node.name] = node
        elif isinstance(node, ast.Import):
            for alias in node.names:
                self.kinds[alias.asname or alias.name.partition(".")[0]] = "module"
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                self.kinds[alias.asname or alias.name] = "imported"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            kind = "container" if is_container(node.value) else "iterator" if is_iterator(node.value) else "value"
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in (n for n in ast.walk(target) if isinstance(n, ast.Name)):
                    self.kinds[name.id] = kind

    def _class_info(self, cls: ast.ClassDef) -> ClassBindings:
        info = ClassBindings(cls, bases=[b.id for b in cls.bases if isinstance(b, ast.Name)])
        # Annotated class-body names are the instance's own in a dataclass, attrs class, pydantic
        # model, NamedTuple...: any class with a decorator or a base; in a plain class they are
        # class attributes.
        fields_like = bool(cls.bases or cls.keywords) or any(
            (decorator_name(d) or "") in FIELD_DECORATORS for d in cls.decorator_list)
        for item in cls.body:
            if isinstance(item, ast.Assign):
                for target in item.targets:
                    if isinstance(target, ast.Name):
                        info.attrs[target.id] = item.value
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                info.attrs[item.target.id] = item.value
                if fields_like and "ClassVar" not in short(item.annotation):
                    info.fields.add(item.target.id)
        for fn in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            self_name = fn.args.args[0].arg if fn.args.args else None
            if self_name is None:
                continue
            for node in ast.walk(fn):
                self._note_binding(node, self_name, info)
        return info

    @staticmethod
    def _note_binding(node: ast.AST, self_name: str, info: ClassBindings) -> None:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.For, ast.comprehension, ast.With)):
            targets = [node.target] if not isinstance(node, ast.With) else [
                i.optional_vars for i in node.items if i.optional_vars is not None]
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == self_name \
                        and isinstance(t.ctx, ast.Store):
                    info.bound.add(t.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Name) and first.id == self_name:
                name = node.args[1] if len(node.args) > 1 else None
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    info.bound.add(name.value)
                else:
                    info.dynamic = True
        if isinstance(node, ast.Attribute) and node.attr == "__dict__" and isinstance(node.value, ast.Name) \
                and node.value.id == self_name:
            info.dynamic = True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "vars" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Name) and first.id == self_name:
                info.dynamic = True

    def _family(self, info: ClassBindings) -> list[ClassBindings]:
        """The class, its ancestors and its descendants defined in the module."""
        known = self._families.get(info.node.name)
        if known is None:
            known = self._families[info.node.name] = self._find_family(info)
        return known

    def _find_family(self, info: ClassBindings) -> list[ClassBindings]:
        family: dict[str, ClassBindings] = {}
        stack = [info]
        while stack:  # ancestors
            current = stack.pop()
            if current.node.name in family:
                continue
            family[current.node.name] = current
            stack.extend(self.classes[b] for b in current.bases if b in self.classes)
        changed = True
        while changed:  # descendants (and their other ancestors do not matter)
            changed = False
            for name, other in self.classes.items():
                if name not in family and any(b in family for b in other.bases):
                    family[name] = other
                    changed = True
        return list(family.values())

    def class_level(self, info: ClassBindings | None, attr: str) -> ast.expr | None | bool:
        """The class-level value ``attr`` has for instances of ``info``, when no instance ever binds
        it (False when instances bind it, or it is no class-level name of the hierarchy)."""
        if info is None:
            return False
        key = (info.node.name, attr)
        if key not in self._class_levels:
            self._class_levels[key] = self._find_class_level(info, attr)
        return self._class_levels[key]

    def _find_class_level(self, info: ClassBindings, attr: str) -> ast.expr | None | bool:
        family = self._family(info)
        if any(attr in c.bound or c.dynamic or attr in c.fields for c in family):
            return False
        for c in family:
            if attr in c.attrs:
                return c.attrs[attr]
        return False

    # -- which module functions run during calls -------------------------------------------
    def reachable(self, methods: list[Function]) -> list[Function]:
        """Module-level functions a method calls or refers to (transitively); for a decorator of a
        method, only the functions it defines (its own body runs once, at import)."""
        if not self.functions:
            return []
        seen: set[str] = set()
        out: list[Function] = []
        stack: list[ast.AST] = list(methods)
        decorating = {id(n) for m in methods for d in m.decorator_list for n in ast.walk(d)}
        while stack:
            fn = stack.pop()
            for node in ast.walk(fn):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.functions \
                        and node.id not in seen:
                    seen.add(node.id)
                    target = self.functions[node.id]
                    if id(node) in decorating:
                        nested = _nested_functions(target)
                        out.extend(nested)
                        stack.extend(nested)
                    else:
                        out.append(target)
                        stack.append(target)
        return out
