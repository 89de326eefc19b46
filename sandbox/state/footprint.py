"""Which entries a tool can change, read from its source: after a call to a tool proven to change
only ``self.<attribute>[<parameter>]`` (and what is below it), on a watched state, only those
entries are looked at, whatever the size of the rest.

The proof extends the read-only one (``sandbox.state.readonly``): besides what a read-only tool may
do, such a tool may store into, delete from, or call a changing method (``append``,
``update``...) of an entry ``self.A[p]`` of an instance attribute, where ``p`` is one of its
parameters (never rebound), directly or through a local bound only to a path below that entry
(every binding of its name counts: a lambda parameter, a loop, comprehension or ``except``
target of the same name makes it no alias). ``self.A.get(p)`` is that entry too, or ``None`` (or
the default) when there is none: on a watched state ``A`` is a builtin container, and of those
only a ``dict`` has ``get``, so ``a = self.accounts.get(p); a["note"] = x`` is confined as
``self.accounts[p]["note"] = x`` is. The default must be a literal (a constant, ``{}``, ``[]``,
displays of those): a new object at each call, which nothing of the state holds; any other
could be another part of the state, and leaves the tool unproven. Below an entry, ``x.get(k)``
(a literal default again) and ``x.setdefault(k, d)`` are within it; ``self.A.setdefault(p, d)``
is the entry ``A[p]``, added when missing (the watch then looks at all of ``A``). So is what a
read-only helper of the class gives back when each of its ``return`` gives one such entry of
what it is given or of its own attribute (or a constant), directly, as one side of a test with a
constant, or through a local bound only to it: ``self._lookup(self.accounts, p)`` with ``return
table.get(key) if isinstance(key, str) else None``, ``self._find(p)`` with ``return
self.accounts.get(key)``, or a helper that checks, raises, and returns ``self.accounts[key]``.
A loop or comprehension target is never a place in the state: ``for self.A[p] in ...`` leaves
the tool unproven, as the read-only proof does.
What it stores, and the arguments of those methods, must be *fresh*: constants, its parameters
(each call gets a copy of its arguments), numbers and strings it computed (a number scaled by
anything but a constant, ``n *= x``, may be a copy of a list: it is not one), and containers of
those, so no object of the state ends up reached twice. The footprint is the set of
``(A, p)``; the caller finds each key from the call's arguments. Standard library only.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

from sandbox.state.readonly import _MISSING, BUILTINS, CHANGING, _Body, _bound

# Builtins whose result holds nothing of their arguments.
_IMMUTABLE = frozenset({"str", "int", "float", "bool", "len", "round", "abs", "repr", "format", "ord", "chr"})
_CONTAINER_BUILDERS = frozenset({"dict", "list", "tuple", "set", "frozenset"})

Footprint = frozenset[tuple[str, str]]


class Confined(_Body):
    """One function's proof that it changes only entries named by its parameters."""

    def __init__(self, proof: Any, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        super().__init__(proof, node)
        self.roots: dict[str, tuple[str, str]] = {}  # local -> the entry it is (a path below)
        self.footprint: set[tuple[str, str]] = set()
        self.removes: set[tuple[str, str]] = set()  # entries it may delete (and so move, re-added)
        self.called: dict[int, ast.Call] = {}  # the calls, by the id of what is called

    def proven(self) -> bool:
        self.called = {id(node.func): node for node in ast.walk(self.node) if isinstance(node, ast.Call)}
        self._find_roots()
        return super().proven() and bool(self.footprint)

    def _find_roots(self) -> None:
        """Locals bound only to a path below one entry (``r = self.A[p]``, ``t = r["tags"]``).

        Every binding of the name counts (``readonly._bound``): a lambda parameter, a loop or
        comprehension target, an ``except ... as`` of the same name is bound to something else."""
        for _ in range(3):  # aliases of aliases, a few levels deep
            bound: dict[str, set[tuple[str, str] | None]] = {}
            for name, how in _bound(self.node):
                bound.setdefault(name, set()).add(self._root(how) if isinstance(how, ast.expr) else None)
            self.roots = {name: next(iter(found)) for name, found in bound.items()  # type: ignore[misc]
                          if len(found) == 1 and None not in found}

    def _bindings(self) -> bool:
        if not super()._bindings():
            return False
        for name in self.roots:  # an alias is neither a made container nor a number
            self.made.discard(name)
            self.numbers.discard(name)
        return True

    def _root(self, node: ast.AST | None) -> tuple[str, str] | None:
        """The entry ``node`` is, or is below: ``self.A[p]...`` or an alias of one."""
        chain = node
        while isinstance(chain, ast.Subscript):
            inner = chain.value
            if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id == "self":
                return self._entry(inner.attr, chain.slice)
            chain = inner
        if isinstance(chain, ast.Name) and chain.id in self.roots:
            return self.roots[chain.id]
        if isinstance(chain, ast.Call):
            return self._got(chain) or self._helped(chain) or self._below(chain) or self._added(chain)
        return None

    def _got(self, node: ast.Call) -> tuple[str, str] | None:
        """``self.A.get(p)``, with no default or a literal one: the entry ``A[p]`` when there is
        one (else the default, a new object that holds nothing of the state)."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "get" and _lookup(node)):
            return None
        owner = func.value
        if not (isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self"):
            return None
        return self._entry(owner.attr, node.args[0])

    def _helped(self, node: ast.Call) -> tuple[str, str] | None:
        """``self.m(...)``, where ``m`` is proven read-only and only returns an entry named by what
        it is given (see ``_returned``): the entry of this call's arguments."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
                and not node.keywords and not any(isinstance(arg, ast.Starred) for arg in node.args)):
            return None
        if not self.proof.method(func.attr):  # (read-only, and relied on from now: see ``ReadOnly``)
            return None
        definition = self.proof.definition(func.attr)
        found = None if definition is None else _returned(definition)
        if found is None:
            return None
        params, table, key = found
        given = dict(zip(params, node.args, strict=False)) if len(params) == len(node.args) else None
        if given is None or key not in given:
            return None
        if table.startswith("."):  # the helper's own ``self.A``
            return self._entry(table[1:], given[key])
        owner = given.get(table)  # the helper's parameter: this call must give it ``self.A``
        if not (isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self"):
            return None
        return self._entry(owner.attr, given[key])

    def _below(self, node: ast.Call) -> tuple[str, str] | None:
        """``x.get(k)`` (no default or a literal one) or ``x.setdefault(k, d)`` of an ``x`` that is
        an entry or below one: that entry, or what is below it, or the default, which is a new
        object (``get``) or now stored below the entry (``setdefault``, whose arguments ``_call``
        checks are fresh). On a watched state ``x`` is a builtin container: only a ``dict`` has
        these methods, and they do no more than that."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr in ("get", "setdefault")):
            return None
        if func.attr == "get" and not _lookup(node):
            return None
        if func.attr == "setdefault" and not _settable(node):
            return None
        return self._root(func.value)

    def _added(self, node: ast.Call) -> tuple[str, str] | None:
        """``self.A.setdefault(p, d)``: the entry ``A[p]``, which the call adds (``d``, checked fresh
        by ``_call``) when there is none (an entry added makes the watch look at the whole of
        ``A``: see ``parts._footprint_entries``)."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "setdefault" and _settable(node)):
            return None
        owner = func.value
        if not (isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self"):
            return None
        return self._entry(owner.attr, node.args[0])

    def _entry(self, attribute: str, key: ast.AST) -> tuple[str, str] | None:
        if attribute.startswith("_") or not isinstance(key, ast.Name) or key.id not in self.params:
            return None
        # An instance attribute: nothing of that name on the class (no property, no method).
        if inspect.getattr_static(self.proof.cls, attribute, _MISSING) is not _MISSING:
            return None
        return attribute, key.id

    def _changes(self, target: ast.AST) -> bool:
        """A store into (or delete of) an entry, or something below one: it joins the footprint."""
        if not isinstance(target, ast.Subscript):
            return False
        root = self._root(target)
        if root is None or not self._expression(target.slice):
            return False
        if not (isinstance(target.value, ast.Attribute) or self._expression(target.value)):
            return False
        self.footprint.add(root)
        return True

    def _statement(self, node: ast.stmt) -> bool:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript) \
                and self._root(node.targets[0]) is not None:
            return self._changes(node.targets[0]) and self._fresh(node.value)
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Subscript) \
                and self._root(node.target) is not None:
            return self._changes(node.target) and self._fresh(node.value)
        if isinstance(node, ast.Delete) and any(self._root(target) is not None for target in node.targets):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute):
                    root = self._root(target)
                    if root is not None:
                        self.removes.add(root)
            return all(isinstance(target, ast.Name) or self._store_into_made(target) or self._changes(target)
                       for target in node.targets)
        return super()._statement(node)

    def _attribute(self, node: ast.Attribute) -> bool:
        if node.attr in CHANGING and id(node) in self.calls:
            call = self.called.get(id(node))
            root = self._root(node.value) or (None if call is None else self._added(call))
            if root is not None:
                self.footprint.add(root)
                return True
        return super()._attribute(node)

    def _call(self, node: ast.Call) -> bool:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in CHANGING \
                and (self._root(func.value) is not None or self._added(node) is not None):
            return all(self._fresh(arg) for arg in node.args) and all(self._fresh(k.value) for k in node.keywords)
        return super()._call(node)

    def _fresh(self, node: ast.AST) -> bool:
        """Whether a value holds no object of the state (it may be stored into it)."""
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.params or node.id in self.numbers
        if isinstance(node, (ast.JoinedStr, ast.Compare, ast.UnaryOp)):
            return self._expression(node)  # a string, a bool, a number: never a container
        if isinstance(node, ast.BinOp):
            return self._fresh(node.left) and self._fresh(node.right)
        if isinstance(node, ast.BoolOp):
            return all(self._fresh(value) for value in node.values)
        if isinstance(node, ast.IfExp):
            return self._expression(node.test) and self._fresh(node.body) and self._fresh(node.orelse)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return all(self._fresh(item) for item in node.elts)
        if isinstance(node, ast.Dict):
            return all(key is None or self._fresh(key) for key in node.keys) and all(map(self._fresh, node.values))
        if isinstance(node, ast.Starred):
            return self._fresh(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BUILTINS \
                and node.func.id not in vars(self.proof.module):
            if node.func.id in _IMMUTABLE:
                return self._expression(node)
            if node.func.id in _CONTAINER_BUILDERS:
                return all(self._fresh(arg) for arg in node.args) and all(self._fresh(k.value) for k in node.keywords)
        return False


def _returned(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], str, str] | None:
    """A helper (proven read-only by the caller) each of whose ``return`` gives back one entry, or a
    constant: ``t.get(k)``, ``t.get(k, <literal>)`` or ``t[k]``, alone or as one side of a test
    whose other side is a constant, or a local bound only to such an entry (and to constants),
    where ``k`` is one of its parameters and ``t`` another or ``self.<attribute>`` (then ``t`` is
    that attribute's name, marked by a leading dot); falling off its end gives back None. So
    ``found = self.accounts.get(key); if found is None: raise KeyError(key); return found`` is
    one. Its parameters after ``self``, ``t`` and ``k``; else None."""
    arguments = node.args
    if isinstance(node, ast.AsyncFunctionDef) or node.decorator_list or arguments.posonlyargs or arguments.vararg \
            or arguments.kwonlyargs or arguments.kwarg or arguments.defaults or not arguments.args:
        return None
    params = [arg.arg for arg in arguments.args[1:]]
    owner = arguments.args[0].arg == "self"
    # The locals bound only to one entry (a constant now and then aside), by every binding of
    # their name (``readonly._bound``: a loop target or ``:=`` of the same name makes none).
    bound: dict[str, set[tuple[str, str] | None]] = {}
    for name, how in _bound(node):
        if name in params:
            return None  # (the read-only proof allows no such binding either)
        found = bound.setdefault(name, set())
        if not isinstance(how, ast.Constant):  # (a constant holds nothing of the state)
            found.add(_entry_of(how, params, owner) if isinstance(how, ast.expr) else None)
    aliases = {name: {entry for entry in found if entry is not None} for name, found in bound.items()
               if None not in found and len(found) <= 1}
    given: set[tuple[str, str]] = set()
    for statement in ast.walk(node):
        if not isinstance(statement, ast.Return) or statement.value is None \
                or isinstance(statement.value, ast.Constant):
            continue
        value = statement.value
        if any(isinstance(part, (ast.NamedExpr, ast.Lambda)) for part in ast.walk(value)):
            return None  # nothing in it rebinds a name
        if isinstance(value, ast.Name) and value.id in aliases:
            given |= aliases[value.id]
            continue
        entry = _entry_of(value, params, owner)
        if entry is None:
            return None
        given.add(entry)
    if len(given) != 1:
        return None
    table, key = given.pop()
    return params, table, key


def _entry_of(value: ast.expr, params: list[str], owner: bool) -> tuple[str, str] | None:
    """The entry ``value`` gives back, as ``_returned`` names it: ``(t, k)``; else None."""
    if isinstance(value, ast.IfExp):
        if isinstance(value.orelse, ast.Constant):
            value = value.body
        elif isinstance(value.body, ast.Constant):
            value = value.orelse
        else:
            return None
    if isinstance(value, ast.Subscript):
        table, key = value.value, value.slice
    elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "get" \
            and _lookup(value):
        table, key = value.func.value, value.args[0]
    else:
        return None
    if not (isinstance(key, ast.Name) and key.id in params):
        return None
    if isinstance(table, ast.Name) and table.id in params and table.id != key.id:
        return table.id, key.id
    if isinstance(table, ast.Attribute) and isinstance(table.value, ast.Name) and table.value.id == "self" and owner:
        return "." + table.attr, key.id
    return None


def _lookup(node: ast.Call) -> bool:
    """The arguments of a ``get`` that gives back an entry or a new object: a key, and no default
    or a literal one."""
    return not node.keywords and 1 <= len(node.args) <= 2 and not isinstance(node.args[0], ast.Starred) \
        and all(_literal(arg) for arg in node.args[1:])


def _settable(node: ast.Call) -> bool:
    """The arguments of a ``setdefault``: a key and a default, none unpacked (``*args`` could
    carry a default ``_call`` does not see)."""
    return not node.keywords and 1 <= len(node.args) <= 2 and not any(isinstance(arg, ast.Starred) for arg in node.args)


def _literal(node: ast.expr) -> bool:
    """A constant, or a display of literals (``{}``, ``[]``, ``{"tags": []}``): a new object at
    each run, which nothing else holds."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_literal(item) for item in node.elts)
    if isinstance(node, ast.Dict):
        return all(key is not None and _literal(key) for key in node.keys) and all(map(_literal, node.values))
    return False
