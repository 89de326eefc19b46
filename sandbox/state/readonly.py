"""Which tools provably change nothing, read from their source: a call to one of them on a
watched state (see ``sandbox.state.watch``) needs no look at the state afterwards at all.

The proof is deliberately narrow. On a watched state every object a tool can reach from
``self`` and its arguments is a builtin value (``str``, numbers, ``dict``, ``list``, ``tuple``,
``set``), whose behaviour is known; a tool is read-only when its code can only read them:

- it names nothing but ``self``, its parameters, its own locals and a fixed set of builtins (no
  module globals: one could hold a reference into the state, or be anything);
- it uses ``self`` only as ``self.<name>``: ``self`` itself is never an operand, an argument, a
  value or a format field (``str(self)``, ``self == x``, ``if self``, ``f"{self}"`` would run the
  class's own ``__str__``, ``__eq__``, ``__bool__``... which nothing here proves);
- every name it binds, however Python binds it (``=``, ``for``, comprehension and generator
  targets, ``:=``, ``except ... as``, lambda parameters), is a plain local: a ``for`` or
  comprehension target is never ``self.x`` or ``obj[k]`` (``for self.cursor in ...`` stores into
  the state just as ``self.cursor = ...`` does), and no local shadows ``self``, a parameter or
  one of those builtins;
- it assigns only to its locals; it stores into, deletes from, or calls a changing method
  (``append``, ``update``...) of, only locals it made itself (``[]``, ``{}``, ``dict(...)``,
  comprehensions), and calls on anything else only methods that read (``get``, ``items``,
  ``lower``...); augmented assignment only to those locals and to locals holding numbers or text;
- it calls only those builtins, those methods, lambdas checked by the same rules, and methods of
  its class that are read-only too (so no ``setattr``, ``vars``, ``exec``, ``getattr``,
  ``type``, ``object``, ``operator``: none of them is a name it may use); a method of its class
  only as ``self.m(...)``, never as a value (a bound method is ``self`` again: its ``repr`` is
  the class's ``__repr__``);
- it calls ``str.format`` only on a constant template whose fields name arguments: a field such
  as ``{0.__self__.size}`` looks attributes up as it formats;
- it reaches no dunder attribute (``__class__``, ``__dict__``, ``__setitem__``...), no property
  or other descriptor, no class attribute that is not plain data; it has no decorator, ``global``,
  ``nonlocal``, ``import``, ``with``, ``async for``, ``await``, ``yield``, ``match``, nested
  ``def`` or ``class``.

The proof is of one class: a call uses it only when the instance is of that very class (a tool
can assign ``self.__class__``, after which other methods run) and while what it relied on is
unchanged (``ReadOnly._unchanged``). Anything else, or any doubt, means "not proven", and the
call's state is looked at as usual. Standard library only.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import operator
import string
import types
from collections.abc import Iterator
from typing import Any

from sandbox.state.signatures import signature
from sandbox.state.watch import CONTAINERS, LEAVES

BUILTINS = frozenset({
    "len", "str", "int", "float", "bool", "list", "dict", "set", "frozenset", "tuple", "sorted", "reversed",
    "enumerate", "zip", "range", "min", "max", "sum", "any", "all", "abs", "round", "isinstance", "map",
    "filter", "iter", "next", "repr", "divmod", "pow", "hash", "ord", "chr", "format",
    "Exception", "ValueError", "KeyError", "TypeError", "IndexError", "LookupError", "RuntimeError",
    "PermissionError", "NotImplementedError", "AssertionError",
    "True", "False", "None",
})
# Methods of the builtin types that only read.
READING = frozenset({
    "get", "keys", "values", "items", "copy", "count", "index",
    "startswith", "endswith", "lower", "upper", "strip", "lstrip", "rstrip", "split", "rsplit", "join",
    "replace", "format", "find", "rfind", "isdigit", "isalpha", "isalnum", "isspace", "isnumeric",
    "isdecimal", "islower", "isupper", "title", "capitalize", "casefold", "zfill", "partition", "rpartition",
    "splitlines", "center", "ljust", "rjust", "removeprefix", "removesuffix", "swapcase", "expandtabs",
    "union", "intersection", "difference", "symmetric_difference", "issubset", "issuperset", "isdisjoint",
    "conjugate", "bit_length", "is_integer",
})
# Methods that change their object: allowed on a container the tool made itself.
CHANGING = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem", "sort",
    "reverse", "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update",
})
_MADE = frozenset({"dict", "list", "set", "sorted"})
# The builtins as they were before any environment code ran (this module is imported first).
GENUINE = {name: getattr(builtins, name) for name in BUILTINS if name not in ("True", "False", "None")}  # calls that return a new container
_STATEMENTS = (ast.Expr, ast.Return, ast.If, ast.For, ast.While, ast.Break, ast.Continue, ast.Pass,
               ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Try, ast.Raise, ast.Assert, ast.Delete)
# (``async for``, ``with``, ``global``, ``nonlocal``, ``import``, ``match``, nested definitions:
# none of them is there, so a tool using one is not proven.)


class ReadOnly:
    """The tools of a class proven read-only, and what the proof relied on: a call uses the proof
    only while the class, the builtins and the module still hold what they held then (code that
    ran since could have replaced a method, its code, a builtin or a class attribute)."""

    def __init__(self, module: types.ModuleType, source: str, cls: type) -> None:
        self.module = module
        self.cls = cls
        self.tools: frozenset[str] = frozenset()
        self.mro: tuple[type, ...] = ()
        # tool -> the entries it may change, and those it may delete (see ``sandbox.state.footprint``)
        self.confined: dict[str, tuple[frozenset[tuple[str, str]], frozenset[tuple[str, str]]]] = {}
        self.looked: dict[str, Any] = {}
        self.codes: list[tuple[types.FunctionType, types.CodeType]] = []  # each method's, as proven
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return
        if _custom_lookup(cls):
            return
        classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
        proof = _Proof(module, cls, classes)
        self.tools = frozenset(name for name in dir(cls) if not name.startswith("_") and proof.method(name))
        from sandbox.state.footprint import Confined  # (it builds on this module's proof)

        for name in dir(cls):
            if name.startswith("_") or name in self.tools:
                continue
            node = proof.definition(name)
            if node is not None and (confined := Confined(proof, node)).proven():
                self.confined[name] = frozenset(confined.footprint), frozenset(confined.removes)
        self.looked, self.codes = proof.looked, list(proof.codes.items())
        # What a call checks the proofs against (``_unchanged``): the names as the class's MRO
        # resolves them now (a name the metaclass alone has resolves otherwise: no proof holds).
        self.mro = cls.__mro__
        self.looked = {name: next((vars(k)[name] for k in self.mro if name in vars(k)), _MISSING)
                       if found is _MISSING or isinstance(found, types.FunctionType) or _builtin_data(found)
                       else found for name, found in self.looked.items()}

    def proven(self, name: str, kind: type | None = None) -> bool:
        """Whether a call of tool ``name`` on an instance of class ``kind`` changes nothing (None:
        of the class proven, for a caller that holds no instance)."""
        return name in self.tools and self._holds(kind)

    def footprint(self, name: str, arguments: dict[str, Any],
                  kind: type | None = None) -> dict[str, set[str] | None] | None:
        """The entries a call of tool ``name`` with ``arguments`` on an instance of class ``kind``
        (as for ``proven``) can change, when that is proven: for each attribute, their keys, or
        None when one may be deleted (and so moved)."""
        found = self.confined.get(name)
        if found is None or not self._holds(kind):
            return None
        try:
            bound = signature(getattr(self.cls, name)).bind(None, **arguments)
        except TypeError:
            return None
        bound.apply_defaults()
        out: dict[str, set[str] | None] = {}
        changes, removes = found
        for attribute, parameter in changes:
            key = bound.arguments.get(parameter)
            if type(key) is not str:
                return None  # (a watched dict's keys are strings)
            keys = out.setdefault(attribute, set())
            if keys is not None:
                keys.add(key)
        for attribute, _ in removes:
            out[attribute] = None
        return out

    def _holds(self, kind: type | None) -> bool:
        # An instance whose ``__class__`` was assigned runs another class's methods: the proofs,
        # of this class's methods, say nothing of them.
        return (kind is None or kind is self.cls) and self._unchanged()

    def _unchanged(self) -> bool:
        """Whether the class, its methods' code, the module and the builtins still hold what the
        proofs relied on (on every call: a look at a few dicts, not a walk)."""
        mro = self.cls.__mro__
        if mro is not self.mro:
            return False  # (its bases were replaced)
        found_in = [vars(klass) for klass in mro]
        if any(name in names for names in found_in[:-1] for name in _LOOKUPS):
            return False
        for name, found in self.looked.items():
            for found_at in found_in:  # (a loop, not ``next`` over a generator: this runs on every call)
                if name in found_at:
                    now = found_at[name]
                    break
            else:
                now = _MISSING
            if now is not found or not (isinstance(now, types.FunctionType) or now is _MISSING or _builtin_data(now)):
                return False
        if any(function.__code__ is not code for function, code in self.codes):
            return False
        names = vars(self.module)
        table = names.get("__builtins__", builtins)
        table = vars(table) if isinstance(table, types.ModuleType) else table
        return names.keys().isdisjoint(_GENUINE_NAMES) and \
            all(map(operator.is_, map(table.get, _GENUINE_NAMES), _GENUINE_VALUES))


_LOOKUPS = ("__getattribute__", "__getattr__")
_GENUINE_NAMES = frozenset(GENUINE)
_GENUINE_VALUES = tuple(GENUINE[name] for name in _GENUINE_NAMES)


def _custom_lookup(cls: type) -> bool:
    for name in _LOOKUPS:
        found = inspect.getattr_static(cls, name, None)
        if found is not None and found is not getattr(object, name, None):
            return True
    return False


class _Proof:
    def __init__(self, module: types.ModuleType, cls: type, classes: dict[str, ast.ClassDef]) -> None:
        self.module = module
        self.cls = cls
        self.classes = classes
        self.known: dict[str, bool] = {}
        self.looked: dict[str, Any] = {}  # class-level names looked up, and what they were
        self.codes: dict[types.FunctionType, types.CodeType] = {}

    def method(self, name: str) -> bool:
        if name not in self.known:
            self.known[name] = False  # while it is being proven: a cycle proves nothing
            self.known[name] = self._method(name)
        return self.known[name]

    def _method(self, name: str) -> bool:
        node = self.definition(name)
        return node is not None and _Body(self, node).proven()

    def definition(self, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The source of the method ``name`` (recorded as relied on), if it is plainly there."""
        owner = next((klass for klass in self.cls.__mro__ if name in vars(klass)), None)
        if owner is None or owner is object:
            return None
        function = vars(owner)[name]
        if not isinstance(function, types.FunctionType) or function.__module__ != self.module.__name__:
            return None
        self.looked[name] = function
        self.codes[function] = function.__code__
        return self._definition(owner, name, function)

    def _definition(self, owner: type, name: str,
                    function: types.FunctionType) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        klass = self.classes.get(owner.__name__)
        if klass is None or owner.__qualname__ != owner.__name__:
            return None
        found = [node for node in klass.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.name == name]
        # The one definition there is, and the function the class holds now came from it.
        if len(found) != 1 or found[0].lineno != function.__code__.co_firstlineno:
            return None
        return found[0]

    def plain_attribute(self, name: str) -> bool | None:
        """Whether ``self.name`` reads plain data: True for an instance attribute or a class
        attribute of builtin values, None for a method (the caller proves it), False otherwise."""
        found = inspect.getattr_static(self.cls, name, _MISSING)
        if found is _MISSING:
            self.looked[name] = found
            return True  # an instance attribute: part of the state
        if isinstance(found, types.FunctionType):
            return None
        if not _builtin_data(found):
            return False
        self.looked[name] = found
        return True


_MISSING = object()


def _builtin_data(value: Any, depth: int = 0) -> bool:
    kind = type(value)
    if kind in LEAVES:
        return True
    if kind not in CONTAINERS or depth > 20:
        return False
    items = list(value.items()) if kind is dict else [(item, None) for item in value]
    return all(_builtin_data(key, depth + 1) and _builtin_data(item, depth + 1) for key, item in items)


class _Body:
    """One function's proof."""

    def __init__(self, proof: _Proof, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.proof = proof
        self.node = node
        self.params = _parameters(node.args)
        self.made: set[str] = set()  # locals bound only to containers the tool made
        self.numbers: set[str] = set()  # locals bound only to numbers and strings
        self.local: set[str] = set()
        self.calls: set[int] = set()  # ids of the nodes that are called (``f`` of ``f(...)``)

    def proven(self) -> bool:
        self.calls = {id(node.func) for node in ast.walk(self.node) if isinstance(node, ast.Call)}
        args = self.node.args
        if self.node.decorator_list or not args.args or args.args[0].arg != "self":
            return False
        if any(not isinstance(default, ast.Constant) for default in args.defaults + args.kw_defaults if default):
            return False
        if not self._bindings():
            return False
        return all(self._statement(statement) for statement in self.node.body)

    def _bindings(self) -> bool:
        """Sort the locals by what they are bound to; False when one shadows a builtin or ``self``."""
        kinds: dict[str, set[str]] = {}
        for name, how in _bound(self.node):
            kinds.setdefault(name, set()).add(_binding_kind(how))
        for name, found in kinds.items():
            if name in BUILTINS or name == "self" or name in self.params:
                return False
            self.local.add(name)
            # (``made *= n`` keeps the list it made; ``n *= x``, with a number ``n``, is a copy of
            # ``x`` when ``x`` is a list: no longer a number)
            if found <= {"made", "augmented", "scaled"} and "made" in found:
                self.made.add(name)
            elif found <= {"number", "augmented"} and "number" in found:
                self.numbers.add(name)
        return True

    def _statement(self, node: ast.stmt) -> bool:
        if not isinstance(node, _STATEMENTS):
            return False
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets: list[ast.AST] = list(node.targets) if isinstance(node, ast.Assign) else [node.target]
            return all(self._target(target) for target in targets) and self._children(node, skip=targets)
        if isinstance(node, ast.AugAssign):
            target = node.target
            if not isinstance(target, ast.Name) or target.id not in self.made | self.numbers:
                return False
            return self._expression(node.value)
        if isinstance(node, ast.Delete):
            return all(isinstance(target, ast.Name) or self._store_into_made(target) for target in node.targets)
        if isinstance(node, ast.For):
            # ``for self.x in ...`` and ``for self.d[k] in ...`` store into the state: the target
            # is checked as an assignment's is.
            return self._target(node.target) and self._children(node, skip=[node.target])
        return self._children(node)

    def _children(self, node: ast.AST, skip: list[ast.AST] | None = None) -> bool:
        for child in ast.iter_child_nodes(node):
            if skip and child in skip:
                continue
            if isinstance(child, ast.stmt):
                if not self._statement(child):
                    return False
            elif isinstance(child, ast.ExceptHandler):
                if child.type is not None and not self._expression(child.type):
                    return False
                if not all(self._statement(statement) for statement in child.body):
                    return False
            elif isinstance(child, ast.expr):
                if not self._expression(child):
                    return False
        return True

    def _target(self, target: ast.AST) -> bool:
        if isinstance(target, ast.Name):
            return True
        if isinstance(target, (ast.Tuple, ast.List)):
            return all(self._target(item) for item in target.elts)
        if isinstance(target, ast.Starred):
            return self._target(target.value)
        return self._store_into_made(target)

    def _store_into_made(self, target: ast.AST) -> bool:
        """``made[key] = ...``: a store into a container the tool made itself."""
        return isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
            and target.value.id in self.made and self._expression(target.slice)

    def _expression(self, node: ast.expr) -> bool:
        owned = {id(child.value) for child in ast.walk(node) if isinstance(child, ast.Attribute)}
        for child in ast.walk(node):
            if isinstance(child, (ast.Yield, ast.YieldFrom, ast.Await)):
                return False
            # Within an expression only comprehension targets and ``:=`` bind, and they must
            # bind locals: a store into ``self.x`` or ``obj[k]`` there changes what it names.
            if isinstance(child, (ast.Attribute, ast.Subscript)) and not isinstance(child.ctx, ast.Load):
                return False
            if isinstance(child, ast.Name) and not self._name(child):
                return False
            if isinstance(child, ast.Name) and child.id == "self" and id(child) not in owned:
                return False  # ``self`` itself, whose class's dunders would run
            if isinstance(child, ast.Attribute) and not self._attribute(child):
                return False
            if isinstance(child, ast.Call) and not self._call(child):
                return False
            if isinstance(child, ast.comprehension) and not _plain_target(child.target):
                return False
            if isinstance(child, ast.Lambda) and (child.args.defaults or child.args.kw_defaults):
                return False
        return True

    def _name(self, node: ast.Name) -> bool:
        name = node.id
        if name == "self" or name in self.params or name in self.local:
            return True
        # A builtin, unless the module defines the same name.
        return name in BUILTINS and name not in vars(self.proof.module)

    def _attribute(self, node: ast.Attribute) -> bool:
        name = node.attr
        if name.startswith("__"):
            return False
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            plain = self.proof.plain_attribute(name)
            if plain is not None:
                return plain
            # A method only called: a bound method is ``self`` again (its ``repr`` runs the
            # class's ``__repr__``, its ``__self__`` is a format field away).
            return id(node) in self.calls and self.proof.method(name)
        if name in CHANGING:
            return isinstance(node.value, ast.Name) and node.value.id in self.made
        if name == "format":
            return _plain_template(node.value)
        return name in READING

    def _call(self, node: ast.Call) -> bool:
        func = node.func
        if isinstance(func, ast.Name):
            return func.id in BUILTINS or func.id in self.local  # a local can only be a lambda or a read
        return isinstance(func, ast.Attribute)  # checked as an attribute


def _parameters(args: ast.arguments) -> set[str]:
    every = args.posonlyargs + args.args + args.kwonlyargs
    names = {arg.arg for arg in every}
    for extra in (args.vararg, args.kwarg):
        if extra is not None:
            names.add(extra.arg)
    return names


def _bound(function: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Every name bound inside ``function`` (its own parameters aside), however Python binds it,
    each with how: for ``name = value`` that value (an expression), else the binding node."""
    for node in ast.walk(function):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                value = node.value if isinstance(target, ast.Name) else None
                for name in _names(target):
                    yield name, node if value is None else value
        elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension, ast.NamedExpr)):
            for name in _names(node.target):
                yield name, node
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                for name in _names(item.optional_vars) if item.optional_vars is not None else []:
                    yield name, node
        elif isinstance(node, ast.Lambda):
            for name in _parameters(node.args):
                yield name, node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not function:
            yield node.name, node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                yield (alias.asname or alias.name).split(".")[0], node
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                yield name, node
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            yield node.name, node
        elif isinstance(node, ast.MatchMapping) and node.rest:
            yield node.rest, node


def _binding_kind(how: ast.AST) -> str:
    if isinstance(how, ast.expr):
        return _value_kind(how)
    if isinstance(how, ast.AugAssign) and isinstance(how.target, ast.Name):
        number = isinstance(how.value, ast.Constant) and type(how.value.value) in (int, float)
        return "scaled" if isinstance(how.op, ast.Mult) and not number else "augmented"
    return "other"


def _plain_template(node: ast.expr) -> bool:
    """Whether ``node`` is a constant ``str.format`` template whose fields only name arguments:
    a field such as ``{0.__self__.size}`` or ``{0[k]}`` looks up attributes or items of its
    argument as it formats it (a template from the caller could reach anything)."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    try:
        return _plain_fields(node.value)
    except ValueError:
        return False  # (not a template ``format`` accepts)


def _plain_fields(template: str) -> bool:
    for _, field, spec, _ in string.Formatter().parse(template):
        if field is None:
            continue
        if not (field == "" or field.isdigit() or field.isidentifier()):
            return False
        if spec and not _plain_fields(spec):  # (a spec may hold fields too: ``{0:{1}}``)
            return False
    return True


def _plain_target(target: ast.expr) -> bool:
    """Whether a target binds locals only: names, and tuples, lists and starred of them."""
    if isinstance(target, ast.Name):
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return all(_plain_target(item) for item in target.elts)
    return isinstance(target, ast.Starred) and _plain_target(target.value)


def _value_kind(value: ast.expr | None) -> str:
    if isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return "made"
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _MADE:
        return "made"
    if isinstance(value, ast.Constant) and isinstance(value.value, (int, float, str)) \
            and not isinstance(value.value, bool):
        return "number"
    return "other"


def _names(target: ast.expr) -> list[str]:
    """The locals a target binds (a store into ``x.a`` or ``x[k]`` binds none: whether such a
    target is allowed is the caller's to check)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for item in target.elts for name in _names(item)]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return []
