"""Where what a method changes lives: the walk over every method of an environment module, and
every module function a method reaches, that finds each change to state kept outside the instance
(see ``service.catalog.outside_state`` for what is refused and why). Standard library only: it runs
in the analysis child (``python -S``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from service.catalog.module_bindings import (
    ClassBindings,
    Function,
    ModuleBindings,
    called_name,
    decorator_name,
    is_container,
    is_iterator,
    own_nodes,
    short,
)

# Method names that change the container they are called on.
MUTATORS = frozenset({
    "append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault", "add",
    "discard", "sort", "reverse", "appendleft", "extendleft", "popleft", "rotate", "move_to_end",
    "difference_update", "intersection_update", "symmetric_difference_update", "__setitem__", "__delitem__",
})  # fmt: skip
# Functions that change their first argument in place.
MUTATING_FUNCTIONS = frozenset({"heappush", "heappop", "heapify", "heapreplace", "heappushpop", "shuffle",
                                "insort", "insort_left", "insort_right"})
_CACHES = frozenset({"lru_cache", "cache"})

KEEP_ON_SELF = "keep it on `self`, set in `__init__`"


@dataclass(frozen=True)
class Finding:
    line: int
    construct: str
    problem: str
    fix: str

    def message(self) -> str:
        return f"line {self.line}: `{self.construct}` {self.problem}; {self.fix}"


@dataclass
class _Scope:
    fn: Function
    self_name: str | None  # the instance parameter of a method (or of the method a nested function is in)
    cls_name: str | None  # the class parameter of a classmethod
    owner: ClassBindings | None
    local: set[str]
    declared_global: set[str]
    defaults: dict[str, ast.expr]  # mutable default values of parameters never rebound
    aliases: dict[str, tuple[str, str]] = field(default_factory=dict)  # local -> (problem, fix) of what it aliases


class WriteChecker:
    """The findings in one module's methods and the module functions they reach."""

    def __init__(self, module: ModuleBindings) -> None:
        self.module = module
        self.found: list[Finding] = []

    def run(self) -> list[Finding]:
        methods = self.module.methods()
        for fn, info in methods:
            self._check_cache(fn)
            self._check_function(fn, info, enclosing=set(), self_name=None, method=True)
        for fn in self.module.reachable([fn for fn, _ in methods]):
            self._check_function(fn, None, enclosing=set(), self_name=None, method=False)
        return self.found

    # -- one function --------------------------------------------------------------------
    def _check_cache(self, fn: Function) -> None:
        for decorator in fn.decorator_list:
            if decorator_name(decorator) in _CACHES:
                self._add(decorator, f"@{short(decorator)} on method {fn.name}",
                          "caches results outside the instance: after the state changes the live process serves "
                          "the old result, and a rebuilt session computes a new one",
                          "drop the cache and compute the result each time")

    def _check_function(self, fn: Function, owner: ClassBindings | None, *, enclosing: set[str], self_name: str | None,
                        method: bool, cls_name: str | None = None) -> None:
        args = fn.args
        params = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
        params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
        decorators = {decorator_name(d) for d in fn.decorator_list}
        if method and params and "staticmethod" not in decorators:
            if "classmethod" in decorators:
                cls_name, self_name = params[0], None
            else:
                self_name = params[0]
        nodes = list(own_nodes(fn))  # (walked once: the passes below read it several times)
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
    def _mutable_defaults(fn: Function, rebound: set[str]) -> dict[str, ast.expr]:
        args = fn.args
        positional = [*args.posonlyargs, *args.args]
        pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
        return {a.arg: d for a, d in pairs if is_container(d) and a.arg not in rebound}

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
            if node.id not in scope.local and self.module.kinds.get(node.id) == "iterator":
                self._add(node, node.id, "is an iterator kept at module level: what a call takes from it is not "
                          "stored with the instance", "keep a counter on `self` (e.g. `self.next_id`, set in `__init__`)")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            holder = node.value
            on_self = isinstance(holder, ast.Name) and holder.id == scope.self_name
            if on_self or self._class_ref(holder, scope) is not None:
                info = scope.owner if on_self else self._referenced_class(holder, scope)
                value = self.module.class_level(info, node.attr)
                if value is not False and is_iterator(value if isinstance(value, ast.expr) else None):
                    self._add(node, short(node), "is an iterator kept on the class: what a call takes from it is "
                              "not stored with the instance", "keep a counter on `self` (e.g. `self.next_id`, set in "
                              "`__init__`)")

    @staticmethod
    def _store_targets(target: ast.expr) -> Iterator[ast.expr]:
        if isinstance(target, (ast.Tuple, ast.List)):
            for item in target.elts:
                yield from WriteChecker._store_targets(item)
        elif isinstance(target, ast.Starred):
            yield from WriteChecker._store_targets(target.value)
        else:
            yield target

    def _check_store(self, statement: ast.stmt, target: ast.expr, scope: _Scope) -> None:
        if isinstance(target, ast.Name):
            if target.id in scope.declared_global:
                self._add(statement, short(statement), f"writes the module-level `{target.id}` (declared global)",
                          KEEP_ON_SELF)
            elif isinstance(statement, ast.AugAssign) and target.id in scope.defaults:
                self._add(statement, short(statement), *self._default_problem(target.id))
            return
        if isinstance(statement, ast.AugAssign) and isinstance(target, ast.Attribute):
            # ``self.items += [x]`` changes a class-level list in place before binding it on the instance
            holder = target.value
            if isinstance(holder, ast.Name) and holder.id == scope.self_name:
                value = self.module.class_level(scope.owner, target.attr)
                if value is not False and is_container(value if isinstance(value, ast.expr) else None):
                    self._add(statement, short(statement), *self._shared_problem(target.attr))
                    return
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return
        holder = target.value
        # ``Cls.attr = ...`` directly: a class attribute written, or a method replaced
        if isinstance(target, ast.Attribute) and self._class_ref(holder, scope) is not None:
            value = getattr(statement, "value", None)
            if self._is_function(value, scope):
                self._add(statement, short(statement), "replaces a method of the class at run time",
                          "keep a flag or a value on `self` and branch on it in the method")
            else:
                self._add(statement, short(statement),
                          "deletes a class attribute" if isinstance(statement, ast.Delete) else "writes a class attribute",
                          "keep the counter on `self`, set in `__init__`" if isinstance(statement, ast.AugAssign)
                          else KEEP_ON_SELF)
            return
        origin = self._outside(holder, scope, certain=True)
        if origin is not None:
            self._add(statement, short(statement), *origin)

    def _check_call(self, call: ast.Call, scope: _Scope) -> None:
        func = call.func
        name = called_name(call)
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and call.args:
            first = call.args[0]
            if self._class_ref(first, scope) is not None:
                value = call.args[2] if len(call.args) > 2 else None
                if self._is_function(value, scope):
                    self._add(call, short(call), "replaces a method of the class at run time",
                              "keep a flag or a value on `self` and branch on it in the method")
                else:
                    self._add(call, short(call), "writes a class attribute", KEEP_ON_SELF)
                return
            origin = self._outside(first, scope, certain=True)
            if origin is not None:
                self._add(call, short(call), *origin)
            return
        if name in MUTATING_FUNCTIONS and call.args:
            origin = self._outside(call.args[0], scope, certain=True)
            if origin is not None:
                self._add(call, short(call), *origin)
            return
        if isinstance(func, ast.Attribute) and func.attr in MUTATORS:
            origin = self._outside(func.value, scope, certain=False)
            if origin is not None:
                self._add(call, short(call), *origin)

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
                return (f"changes `{short(obj)}`, an object kept on the class", KEEP_ON_SELF)
            return None
        if self._class_ref(base, scope) is not None:
            if depth >= 1:
                return (f"changes `{short(obj)}`, an object kept on the class", KEEP_ON_SELF)
            return None
        if not isinstance(base, ast.Name):
            return None
        if base.id == scope.self_name:
            if depth == 0 or not isinstance(first, ast.Attribute):
                return None
            value = self.module.class_level(scope.owner, first.attr)
            if value is False or not is_container(value if isinstance(value, ast.expr) else None):
                return None
            return self._shared_problem(first.attr)
        if base.id in scope.aliases:
            return scope.aliases[base.id]
        if base.id in scope.defaults:
            return self._default_problem(base.id)
        if base.id in scope.local:
            return None
        kind = self.module.kinds.get(base.id)
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
            if node.id not in scope.local and node.id not in scope.aliases and self.module.kinds.get(node.id) == "class":
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

    def _referenced_class(self, node: ast.expr, scope: _Scope) -> ClassBindings | None:
        name = self._class_ref(node, scope)
        return self.module.classes.get(name) if name else None

    def _is_function(self, value: ast.expr | None, scope: _Scope) -> bool:
        if isinstance(value, ast.Lambda):
            return True
        if isinstance(value, ast.Name):
            return self.module.kinds.get(value.id) == "function" or any(
                isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == value.id
                for n in own_nodes(scope.fn))
        if isinstance(value, ast.Attribute):  # another method: ``type(self).price = type(self).sale_price``
            holder = value.value
            return self._class_ref(holder, scope) is not None or (
                isinstance(holder, ast.Name) and holder.id == scope.self_name)
        return False

    def _add(self, node: ast.AST, construct: str, problem: str, fix: str) -> None:
        self.found.append(Finding(getattr(node, "lineno", 0), construct, problem, fix))
