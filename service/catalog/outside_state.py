"""Refusing environment code that keeps state outside the instance, before anything runs.

A session's instance is stored as its attributes (``public_state``) and rebuilt from them
whenever its live process is gone: after an eviction, on another replica, after a restart, for
a fork or a group. Whatever a call keeps anywhere else is lost then, silently: a counter kept on
the class (``Order.next_id += 1``) issues id 1 again and overwrites order 1. So such code is
refused at registration, with the line, the construct and the fix. What is checked, in every
method of every class in the module and in every module-level function a method calls:

- ``global`` names written (``global _next_id; _next_id += 1``);
- class attributes written or replaced (``Order.next_id += 1``, ``type(self).price = f``,
  ``self.__class__.x = 1``, ``cls.x = 1``), and objects kept on a class changed
  (``Order.registry[k] = v``);
- a class-level container changed through ``self`` (class body ``registry = {}``, a method
  ``self.registry[k] = v``) when no method of its class hierarchy binds ``self.registry`` (the
  common class-level default shadowed in ``__init__`` is fine);
- module-level objects changed (``ITEMS.append(x)``, ``CONFIG["k"] = v``), also through a local
  alias (``items = ITEMS; items.append(x)``);
- a mutable default argument changed (``def add(self, tags=[]): tags.append(...)``);
- iterators kept on the module or the class drawn from (``_ids = itertools.count(1)``);
- ``functools.lru_cache`` / ``functools.cache`` on methods: the cache outlives the state it was
  computed from, in the live process only.

Left to the replay check (``service.catalog.rebuilds``), which runs the reference solutions with a
rebuild before every call: state reached in ways a static reading cannot follow, such as an
instance attribute aliasing a module-level object (``self.items = ITEMS``, then ``ITEMS`` read
by name), closures (``nonlocal``), or a module-level object's own methods. ``cached_property``
is fine: its value is an attribute of the instance, and stored with it.

Standard library only: it runs in the analysis child (``python -S``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

REASON = "state_outside_instance"
MAX_FINDINGS = 10
CONSTRUCT_CHARS = 80

_Function = ast.FunctionDef | ast.AsyncFunctionDef
# Method names that change the container they are called on.
MUTATORS = frozenset({
    "append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault", "add",
    "discard", "sort", "reverse", "appendleft", "extendleft", "popleft", "rotate", "move_to_end",
    "difference_update", "intersection_update", "symmetric_difference_update", "__setitem__", "__delitem__",
})  # fmt: skip
# Functions that change their first argument in place.
MUTATING_FUNCTIONS = frozenset({"heappush", "heappop", "heapify", "heapreplace", "heappushpop", "shuffle",
                                "insort", "insort_left", "insort_right"})
_CONTAINERS = frozenset({"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "Counter", "deque",
                         "ChainMap", "array"})
_ITERATORS = frozenset({"count", "cycle", "iter"})
_CACHES = frozenset({"lru_cache", "cache"})
_FIELD_DECORATORS = ("dataclass", "define", "attrs", "frozen", "mutable")  # dataclasses, attrs

KEEP_ON_SELF = "keep it on `self`, set in `__init__`"


@dataclass(frozen=True)
class Finding:
    line: int
    construct: str
    problem: str
    fix: str

    def message(self) -> str:
        return f"line {self.line}: `{self.construct}` {self.problem}; {self.fix}"


def findings(code: str) -> list[Finding]:
    """What in ``code`` keeps state outside the instance, in line order (empty when the code does
    not parse: the tool extraction reports that)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    try:
        found = _Checker(tree).run()
    except RecursionError:
        return []
    unique = {(f.line, f.construct, f.problem): f for f in found}
    return sorted(unique.values(), key=lambda f: (f.line, f.construct))


def problem_text(found: list[Finding]) -> str:
    """The refusal's message: one line per finding, at most MAX_FINDINGS."""
    lines = [f.message() for f in found[:MAX_FINDINGS]]
    if len(found) > MAX_FINDINGS:
        lines.append(f"... and {len(found) - MAX_FINDINGS} more")
    return "\n".join(lines)


def _short(node: ast.AST) -> str:
    try:
        text = " ".join(ast.unparse(node).split())
    except (ValueError, RecursionError, AttributeError):
        return type(node).__name__
    return text if len(text) <= CONSTRUCT_CHARS else text[: CONSTRUCT_CHARS - 3] + "..."


def _is_container(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    return isinstance(value, ast.Call) and _called_name(value) in _CONTAINERS


def _is_iterator(value: ast.expr | None) -> bool:
    if isinstance(value, ast.GeneratorExp):
        return True
    return isinstance(value, ast.Call) and _called_name(value) in _ITERATORS


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _decorator_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of the functions, lambdas and classes it defines."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _nested_functions(fn: _Function) -> list[_Function]:
    return [n for n in _own_nodes(fn) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


@dataclass
class _Class:
    node: ast.ClassDef
    attrs: dict[str, ast.expr | None] = field(default_factory=dict)  # class-body bindings
    fields: set[str] = field(default_factory=set)  # annotated names an instance gets as its own (dataclass, model)
    bound: set[str] = field(default_factory=set)  # names some method binds on the instance
    dynamic: bool = False  # a method binds computed names (setattr(self, name, v), self.__dict__...)
    bases: list[str] = field(default_factory=list)


@dataclass
class _Scope:
    fn: _Function
    self_name: str | None  # the instance parameter of a method (or of the method a nested function is in)
    cls_name: str | None  # the class parameter of a classmethod
    owner: _Class | None
    local: set[str]
    declared_global: set[str]
    defaults: dict[str, ast.expr]  # mutable default values of parameters never rebound
    aliases: dict[str, tuple[str, str]] = field(default_factory=dict)  # local -> (problem, fix) of what it aliases


class _Checker:
    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.kinds: dict[str, str] = {}  # module-level name -> class/function/module/imported/container/iterator/value
        self.classes: dict[str, _Class] = {}
        self.functions: dict[str, _Function] = {}
        self.found: list[Finding] = []
        self.families: dict[str, list[_Class]] = {}
        self.class_level: dict[tuple[str, str], ast.expr | None | bool] = {}

    # -- what the module binds ------------------------------------------------------------
    def run(self) -> list[Finding]:
        for node in self._module_statements(self.tree.body):
            self._bind_module(node)
        for cls in (n for n in ast.walk(self.tree) if isinstance(n, ast.ClassDef)):
            self.classes.setdefault(cls.name, self._class_info(cls))
        methods: list[tuple[_Function, _Class]] = []
        for info in self.classes.values():
            for item in info.node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    methods.append((item, info))
        for fn, info in methods:
            self._check_cache(fn)
            self._check_function(fn, info, enclosing=set(), self_name=None, method=True)
        for fn in self._reachable([fn for fn, _ in methods]):
            self._check_function(fn, None, enclosing=set(), self_name=None, method=False)
        return self.found

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
            kind = "container" if _is_container(node.value) else "iterator" if _is_iterator(node.value) else "value"
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in (n for n in ast.walk(target) if isinstance(n, ast.Name)):
                    self.kinds[name.id] = kind

    def _class_info(self, cls: ast.ClassDef) -> _Class:
        info = _Class(cls, bases=[b.id for b in cls.bases if isinstance(b, ast.Name)])
        # Annotated class-body names are the instance's own in a dataclass, attrs class, pydantic
        # model, NamedTuple...: any class with a decorator or a base; in a plain class they are
        # class attributes.
        fields_like = bool(cls.bases or cls.keywords) or any(
            (_decorator_name(d) or "") in _FIELD_DECORATORS for d in cls.decorator_list)
        for item in cls.body:
            if isinstance(item, ast.Assign):
                for target in item.targets:
                    if isinstance(target, ast.Name):
                        info.attrs[target.id] = item.value
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                info.attrs[item.target.id] = item.value
                if fields_like and "ClassVar" not in _short(item.annotation):
                    info.fields.add(item.target.id)
        for fn in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            self_name = fn.args.args[0].arg if fn.args.args else None
            if self_name is None:
                continue
            for node in ast.walk(fn):
                self._note_binding(node, self_name, info)
        return info

    @staticmethod
    def _note_binding(node: ast.AST, self_name: str, info: _Class) -> None:
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

    def _family(self, info: _Class) -> list[_Class]:
        """The class, its ancestors and its descendants defined in the module."""
        known = self.families.get(info.node.name)
        if known is None:
            known = self.families[info.node.name] = self._find_family(info)
        return known

    def _find_family(self, info: _Class) -> list[_Class]:
        family: dict[str, _Class] = {}
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

    def _class_level(self, info: _Class | None, attr: str) -> ast.expr | None | bool:
        """The class-level value ``attr`` has for instances of ``info``, when no instance ever binds
        it (False when instances bind it, or it is no class-level name of the hierarchy)."""
        if info is None:
            return False
        key = (info.node.name, attr)
        if key not in self.class_level:
            self.class_level[key] = self._find_class_level(info, attr)
        return self.class_level[key]

    def _find_class_level(self, info: _Class, attr: str) -> ast.expr | None | bool:
        family = self._family(info)
        if any(attr in c.bound or c.dynamic or attr in c.fields for c in family):
            return False
        for c in family:
            if attr in c.attrs:
                return c.attrs[attr]
        return False

    # -- which module functions run during calls -------------------------------------------
    def _reachable(self, methods: list[_Function]) -> list[_Function]:
        """Module-level functions a method calls or refers to (transitively); for a decorator of a
        method, only the functions it defines (its own body runs once, at import)."""
        if not self.functions:
            return []
        seen: set[str] = set()
        out: list[_Function] = []
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

    # -- one function --------------------------------------------------------------------
    def _check_cache(self, fn: _Function) -> None:
        for decorator in fn.decorator_list:
            if _decorator_name(decorator) in _CACHES:
                self._add(decorator, f"@{_short(decorator)} on method {fn.name}",
                          "caches results outside the instance: after the state changes the live process serves "
                          "the old result, and a rebuilt session computes a new one",
                          "drop the cache and compute the result each time")

    def _check_function(self, fn: _Function, owner: _Class | None, *, enclosing: set[str], self_name: str | None,
                        method: bool, cls_name: str | None = None) -> None:
        args = fn.args
        params = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
        params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
        decorators = {_decorator_name(d) for d in fn.decorator_list}
        if method and params and "staticmethod" not in decorators:
            if "classmethod" in decorators:
                cls_name, self_name = params[0], None
            else:
                self_name = params[0]
        nodes = list(_own_nodes(fn))  # (walked once: the passes below read it several times)
        declared: set[str] = set()
        stored: set[str] = set(params)
        for node in nodes:
            if isinstance(node, ast.Global):
                declared.update(node.names)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                stored.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                stored.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                stored.update((a.asname or a.name).partition(".")[0] for a in node.names)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                stored.add(node.name)
        rebound = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        scope = _Scope(fn, self_name, cls_name, owner, local=(stored - declared) | (enclosing - declared),
                       declared_global=declared, defaults=self._mutable_defaults(fn, rebound))
        if self_name in rebound:
            scope.self_name = None  # ``self`` rebound to something else: nothing to say about it
        self._aliases(scope, nodes)
        for node in nodes:
            self._check_node(node, scope)
        for nested in (n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            self._check_function(nested, owner, enclosing=scope.local - {scope.self_name or ""},
                                 self_name=scope.self_name, method=False, cls_name=scope.cls_name)

    @staticmethod
    def _mutable_defaults(fn: _Function, rebound: set[str]) -> dict[str, ast.expr]:
        args = fn.args
        positional = [*args.posonlyargs, *args.args]
        pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
        return {a.arg: d for a, d in pairs if _is_container(d) and a.arg not in rebound}

    def _aliases(self, scope: _Scope, nodes: list[ast.AST]) -> None:
        """Locals bound to an object kept outside the instance (``items = ITEMS``, ``for o in
        Order.registry.values()``): changing them changes that object. Two passes follow an
        alias of an alias."""
        bindings = [n for n in nodes if isinstance(n, (ast.Assign, ast.AnnAssign, ast.For, ast.AsyncFor))]
        for _ in range(2):
            for node in bindings:
                value: ast.expr | None = None
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    value, targets = node.value, list(node.targets)
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    value, targets = node.value, [node.target]
                elif isinstance(node, (ast.For, ast.AsyncFor)):
                    value, targets = node.iter, [node.target]
                    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                            and value.func.attr in ("values", "items") and not value.args:
                        value = value.func.value  # the records of a mapping kept outside
                    elif not isinstance(value, (ast.Name, ast.Attribute, ast.Subscript)):
                        continue
                if value is None or not self._plain_reference(value):
                    continue
                origin = self._outside(value, scope, certain=True, reference=True)
                if origin is None:
                    continue
                for target in targets:
                    for name in (n for n in ast.walk(target) if isinstance(n, ast.Name)):
                        if name.id != scope.self_name:
                            scope.aliases[name.id] = origin

    @staticmethod
    def _plain_reference(value: ast.expr) -> bool:
        """``a``, ``a.b``, ``a[k]``: the same object, not a copy (no call, no slice)."""
        while isinstance(value, (ast.Attribute, ast.Subscript)):
            if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Slice):
                return False
            value = value.value
        return isinstance(value, ast.Name)

    def _check_node(self, node: ast.AST, scope: _Scope) -> None:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for t in self._store_targets(target):
                    self._check_store(node, t, scope)
        elif isinstance(node, ast.Call):
            self._check_call(node, scope)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id not in scope.local and self.kinds.get(node.id) == "iterator":
                self._add(node, node.id, "is an iterator kept at module level: what a call takes from it is not "
                          "stored with the instance", "keep a counter on `self` (e.g. `self.next_id`, set in `__init__`)")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            holder = node.value
            on_self = isinstance(holder, ast.Name) and holder.id == scope.self_name
            if on_self or self._class_ref(holder, scope) is not None:
                info = scope.owner if on_self else self._referenced_class(holder, scope)
                value = self._class_level(info, node.attr)
                if value is not False and _is_iterator(value if isinstance(value, ast.expr) else None):
                    self._add(node, _short(node), "is an iterator kept on the class: what a call takes from it is "
                              "not stored with the instance", "keep a counter on `self` (e.g. `self.next_id`, set in "
                              "`__init__`)")

    @staticmethod
    def _store_targets(target: ast.expr) -> Iterator[ast.expr]:
        if isinstance(target, (ast.Tuple, ast.List)):
            for item in target.elts:
                yield from _Checker._store_targets(item)
        elif isinstance(target, ast.Starred):
            yield from _Checker._store_targets(target.value)
        else:
            yield target

    def _check_store(self, statement: ast.stmt, target: ast.expr, scope: _Scope) -> None:
        if isinstance(target, ast.Name):
            if target.id in scope.declared_global:
                self._add(statement, _short(statement), f"writes the module-level `{target.id}` (declared global)",
                          KEEP_ON_SELF)
            elif isinstance(statement, ast.AugAssign) and target.id in scope.defaults:
                self._add(statement, _short(statement), *self._default_problem(target.id))
            return
        if isinstance(statement, ast.AugAssign) and isinstance(target, ast.Attribute):
            # ``self.items += [x]`` changes a class-level list in place before binding it on the instance
            holder = target.value
            if isinstance(holder, ast.Name) and holder.id == scope.self_name:
                value = self._class_level(scope.owner, target.attr)
                if value is not False and _is_container(value if isinstance(value, ast.expr) else None):
                    self._add(statement, _short(statement), *self._shared_problem(target.attr))
                    return
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return
        holder = target.value
        # ``Cls.attr = ...`` directly: a class attribute written, or a method replaced
        if isinstance(target, ast.Attribute) and self._class_ref(holder, scope) is not None:
            value = getattr(statement, "value", None)
            if self._is_function(value, scope):
                self._add(statement, _short(statement), "replaces a method of the class at run time",
                          "keep a flag or a value on `self` and branch on it in the method")
            else:
                self._add(statement, _short(statement),
                          "deletes a class attribute" if isinstance(statement, ast.Delete) else "writes a class attribute",
                          "keep the counter on `self`, set in `__init__`" if isinstance(statement, ast.AugAssign)
                          else KEEP_ON_SELF)
            return
        origin = self._outside(holder, scope, certain=True)
        if origin is not None:
            self._add(statement, _short(statement), *origin)

    def _check_call(self, call: ast.Call, scope: _Scope) -> None:
        func = call.func
        name = _called_name(call)
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and call.args:
            first = call.args[0]
            if self._class_ref(first, scope) is not None:
                value = call.args[2] if len(call.args) > 2 else None
                if self._is_function(value, scope):
                    self._add(call, _short(call), "replaces a method of the class at run time",
                              "keep a flag or a value on `self` and branch on it in the method")
                else:
                    self._add(call, _short(call), "writes a class attribute", KEEP_ON_SELF)
                return
            origin = self._outside(first, scope, certain=True)
            if origin is not None:
                self._add(call, _short(call), *origin)
            return
        if name in MUTATING_FUNCTIONS and call.args:
            origin = self._outside(call.args[0], scope, certain=True)
            if origin is not None:
                self._add(call, _short(call), *origin)
            return
        if isinstance(func, ast.Attribute) and func.attr in MUTATORS:
            origin = self._outside(func.value, scope, certain=False)
            if origin is not None:
                self._add(call, _short(call), *origin)

    # -- where an object lives --------------------------------------------------------------
    def _outside(self, obj: ast.expr, scope: _Scope, *, certain: bool,
                 reference: bool = False) -> tuple[str, str] | None:
        """(problem, fix) when changing ``obj`` changes state kept outside the instance, else None.

        ``certain``: the change is certain (an assignment into it); else it is a call of a method
        named like a mutator, which says nothing about an object whose type is unknown.
        ``reference``: ``obj`` is being aliased, not changed (for ``_aliases``)."""
        depth = 0
        base = obj
        first: ast.expr | None = None  # the access right on the base (``self.x`` of ``self.x[k]``)
        while isinstance(base, (ast.Attribute, ast.Subscript)):
            first = base
            base = base.value
            depth += 1
        # ``self.__class__.x`` is ``type(self).x``
        if isinstance(first, ast.Attribute) and first.attr == "__class__" and isinstance(base, ast.Name) \
                and base.id == scope.self_name:
            if depth >= 2 or reference:
                return (f"changes `{_short(obj)}`, an object kept on the class", KEEP_ON_SELF)
            return None
        if self._class_ref(base, scope) is not None:
            if depth >= 1:
                return (f"changes `{_short(obj)}`, an object kept on the class", KEEP_ON_SELF)
            return None
        if not isinstance(base, ast.Name):
            return None
        if base.id == scope.self_name:
            if depth == 0 or not isinstance(first, ast.Attribute):
                return None
            value = self._class_level(scope.owner, first.attr)
            if value is False or not _is_container(value if isinstance(value, ast.expr) else None):
                return None
            return self._shared_problem(first.attr)
        if base.id in scope.aliases:
            return scope.aliases[base.id]
        if base.id in scope.defaults:
            return self._default_problem(base.id)
        if base.id in scope.local:
            return None
        kind = self.kinds.get(base.id)
        if kind is None or kind == "class":
            return None
        if kind in ("module", "imported"):
            # Only an attribute set on a module (``pricing.RATE = 2``): what a module does with its
            # own objects (``sys.path``, ``os.environ``, ``random``) is the process's set-up, not data
            # a session keeps.
            if depth == 0 and certain and not reference:
                return (f"sets an attribute of `{base.id}`, kept outside the instance", KEEP_ON_SELF)
            return None
        if kind in ("value", "function", "iterator") and depth == 0 and not certain:
            return None  # a method of an object whose type is unknown
        return (f"changes the module-level `{base.id}`, which is not part of the instance's state",
                f"copy it onto `self` in `__init__` (e.g. `self.{base.id.lower().lstrip('_')} = "
                f"copy.deepcopy({base.id})`) and change that")

    @staticmethod
    def _shared_problem(attr: str) -> tuple[str, str]:
        return (f"changes the class-level `{attr}`, shared by every instance and never stored with one",
                f"set `self.{attr}` in `__init__` so each instance has its own")

    @staticmethod
    def _default_problem(param: str) -> tuple[str, str]:
        return (f"changes the default value of `{param}`, which outlives the call",
                f"default `{param}` to `None` and make a new one in the body")

    def _class_ref(self, node: ast.expr, scope: _Scope) -> str | None:
        """The class ``node`` refers to ('' when it is not known which), or None if not a class."""
        if isinstance(node, ast.Name):
            if node.id == scope.cls_name:
                return scope.owner.node.name if scope.owner else ""
            if node.id not in scope.local and node.id not in scope.aliases and self.kinds.get(node.id) == "class":
                return node.id
            return None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type" \
                and len(node.args) == 1 and "type" not in scope.local:
            arg = node.args[0]
            return scope.owner.node.name if scope.owner and isinstance(arg, ast.Name) and arg.id == scope.self_name else ""
        if isinstance(node, ast.Attribute) and node.attr == "__class__" and isinstance(node.value, ast.Name) \
                and node.value.id == scope.self_name:
            return scope.owner.node.name if scope.owner else ""
        return None

    def _referenced_class(self, node: ast.expr, scope: _Scope) -> _Class | None:
        name = self._class_ref(node, scope)
        return self.classes.get(name) if name else None

    def _is_function(self, value: ast.expr | None, scope: _Scope) -> bool:
        if isinstance(value, ast.Lambda):
            return True
        if isinstance(value, ast.Name):
            return self.kinds.get(value.id) == "function" or any(
                isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == value.id
                for n in _own_nodes(scope.fn))
        if isinstance(value, ast.Attribute):  # another method: ``type(self).price = type(self).sale_price``
            holder = value.value
            return self._class_ref(holder, scope) is not None or (
                isinstance(holder, ast.Name) and holder.id == scope.self_name)
        return False

    def _add(self, node: ast.AST, construct: str, problem: str, fix: str) -> None:
        self.found.append(Finding(getattr(node, "lineno", 0), construct, problem, fix))
