"""The read-only and confined proofs are sound: a tool proven to change nothing changes nothing,
and one proven to change only named entries changes no other, when it simply runs in one Python
process. Tool bodies are generated from a grammar of the ways Python binds and mutates (loop and
comprehension targets, ``:=``, augmented assignment, ``del``, destructuring, aliases of methods,
``setattr`` and its kin, the class's own dunders, ``__class__``...), run on a fresh instance, and
the state before and after compared exactly (types, order and sharing included).

The property test is reproducible: ``derandomize=True`` (the examples come from a fixed seed)
and no example database, 400 examples, no deadline.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from sandbox.state.readonly import ReadOnly
from sandbox.worker.resident import LiveSession

HEADER = '''
import contextlib
import operator

KEPT = []


def helper(env):
    env.log.clear()


class Env:
    LIMITS = {"max": 3, "names": ["x"]}

    def __init__(self, config=None):
        self.items = {"a": {"tags": [1, 2], "n": 1}, "b": {"tags": [3], "n": 2}, "c": {"tags": [], "n": 0}}
        self.log = ["x", "y"]
        self.queue = ["p", "q", "r"]
        self.cursor = 0
        self.seen = {"last": "", "count": 0}
        self.scores = [3, 9, 4]
        self.best = 0
        self.flag = False
        self._hidden = [0]

    @property
    def size(self):
        self.log.append("size")
        return len(self.items)

    def __str__(self):
        self.log.append("str")
        return "env"

    def __eq__(self, other):
        self.seen["count"] += 1
        return other is self

    __hash__ = object.__hash__

    def __len__(self):
        self.log.append("len")
        return 1

    def __iter__(self):
        self.log.append("iter")
        return iter(list(self.queue))

    def __contains__(self, value):
        self.log.append("in")
        return False

    def __format__(self, spec):
        self.log.append("format")
        return "env"

    def __repr__(self):
        self.log.append("repr")
        return "Env()"

    def _look(self, key):
        return self.items.get(key)

    def _lookup(self, table, key):
        """The bundled catalog's helper."""
        return table.get(key) if isinstance(key, str) else None

    def _first(self, table, key):
        found = table.get(key)
        return found

    def _require(self, key):
        if key not in self.items:
            raise KeyError(key)
        return self.items[key]

    def _found(self, key):
        found = None
        if key in self.items:
            found = self.items[key]
        return found

    def _stray(self, key):
        found = self.items.get(key)
        if found is None:
            return self.log
        return found

    def _rebound(self, key):
        found = self.items.get(key)
        for found in self.log:
            pass
        return found

    def _either(self, key, other):
        if key == other:
            return self.items.get(other)
        return self.items.get(key)

    def _fallback(self, key):
        return self.items.get(key, self.log)

    def _peek(self):
        return self.log

    def _touch(self):
        self.log.append("touched")
'''

OTHER = '''

class Other(Env):
    def _look(self, key):
        self.seen["count"] += 1
        return None
'''

# -- the grammar -----------------------------------------------------------------------------

PLACES = [
    "self.items", "self.items[key]", "self.items[key]['tags']", "self.items[other]", "self.items['a']['tags']",
    "self.log", "self.queue", "self.queue[self.cursor]", "self.cursor", "self.seen", "self.seen['last']",
    "self.scores", "self.best", "self.flag", "self._hidden", "self.LIMITS", "self.LIMITS['names']",
    "self._look(key)", "self._peek()", "x", "y", "made", "n", "key", "other", "r", "r['tags']",
]
CONSTANTS = ["0", "1", "'s'", "key", "[]", "{}", "[1, 2]", "(1, 2)", "{'k': 1}", "None", "True"]
ARGUMENTS = ["0", "1", "'x'", "key", "[1]", "x", "made", "n", "self.log", "r"]
FRESH = ["0", "1", "'x'", "key", "[1]", "n", "[key, 1]", "{'k': key}", "len(self.log)", "str(self.cursor)"]
# (list, dict and str methods, reading and changing, with arguments that fit them often enough)
READING = ["index({a})", "count({a})", "copy()", "get({a})", "keys()", "values()", "items()", "lower()",
           "join([])", "startswith('x')"]
CHANGING = ["append({a})", "extend([{a}])", "insert(0, {a})", "pop()", "remove({a})", "clear()", "sort()",
            "reverse()", "update({{{a}: 1}})", "setdefault(key, [])", "pop(key, None)", "popitem()", "add({a})",
            "discard({a})", "difference_update([])"]
ITERABLES = [
    "range(3)", "range(self.cursor + 1, len(self.queue))", "[key, other]", "list(self.log)", "sorted(self.scores)",
    "self.items", "self.items.values()", "self.seen", "self.scores", "self.queue", "self.items[key]['tags']",
    "[self.log, self.scores]", "list(self.items.values())", "made", "x", "r",
]
LOCALS = ["x", "y", "made[0]", "made[key]"]
# Stores into the state (and into what a local holds, which may be the state).
STORES = [
    "x[0]", "r['n']", "r['tags']", "self.best", "self.cursor", "self.flag", "self.log", "self.new", "self._hidden[0]",
    "self.items[key]", "self.items[key]['n']", "self.items[key]['tags']", "self.items[other]['n']",
    "self.seen['last']", "self.log[0]", "self.LIMITS['max']", "self.items['a']['n']",
]
ENTRY_STORES = ["self.items[key]", "self.items[key]['n']", "self.items[key]['tags']", "r['n']", "r['tags']",
                "self.items[key]['new']"]
# Changes of the entry ``self.items[key]`` alone, one of which a tool drawn for them makes.
ENTRY_WRITES = ["self.items[key]['n'] = 0", "r['tags'].append(key)", "self.items[key]['tags'] += [1]",
                "del self.items[key]['tags']", "r['n'] += 1", "self.items[key] = {'tags': [key], 'n': 0}",
                "del self.items[key]", "self.items[key]['tags'].sort()", "r['tags'].extend([n, key])",
                "r.setdefault('log', []).append(n)", "r.get('tags', []).append(key)",
                "self.items[key].setdefault('seen', {})['k'] = n", "self.items.setdefault(key, {'tags': []})['tags'].append(1)"]
# How a tool names the entry ``self.items[key]`` (or another) before it changes it through ``r``.
ENTRIES = ["self.items[key]", "self.items[key]", "self.items.get(key)", "self.items.get(key, None)",
           "self.items.get(other)", "self.items.get(key, self.seen)", "self.items.get(key, {})",
           "self.items.get(key, 'none')", "self.items.get(key)['tags']", "self._look(key)", "self._lookup(self.items, key)",
           "self._lookup(self.items, other)", "self._lookup(self.seen, key)", "self._lookup(y, key)",
           "self._first(self.items, key)", "self._lookup(self.items, key)['tags']", "self._require(key)",
           "self._found(key)", "self._stray(key)", "self._rebound(key)", "self._either(key, other)", "self._fallback(key)",
           "self.items.setdefault(key, {'tags': [], 'n': 0})", "self.items.setdefault(key, self.seen)",
           "self.items.get(key, [self.log])", "self.items.get(key, {'tags': []})", "self.items[key].get('tags')"]
LOOP_LOCALS = ["t", "(t, u)", "[t, *u]", "made[0]"]
LOOP_STORES = ["self.cursor", "self.best", "self.seen['last']", "self.items[key]['n']", "(t, self.best)", "x[0]",
               "[t, *self.log]", "r['n']"]
DELETES = ["x", "made[0]", "made[key]", "self.items[key]", "self.items[key]['tags']", "self.seen['last']",
           "self.best", "self.log[0]", "self.items[other]", "x[0]", "r['tags']"]
# Every spelling of a change this grammar does not build from parts.
SPECIALS = [
    "str(self)", "self == 1", "len(self)", "f'{self}'", "self.size", "key in self", "list(self)", "bool(self)",
    "self._touch()", "helper(self)", "setattr(self, 'best', 7)", "delattr(self, 'flag')",
    "getattr(self.log, 'clear')()", "getattr(self, 'best')", "vars(self).update(best=3)",
    "self.__dict__.update(best=3)", "object.__setattr__(self, 'best', 4)",
    "operator.setitem(self.seen, 'last', 'op')", "operator.iadd(self.log, [1])", "list.append(self.log, 1)",
    "list.__setitem__(self.log, 0, 'z')", "dict.update(self.seen, last='d')", "exec('self.best = 5')",
    "eval('self.log.append(1)')", "type(self).LIMITS.update(max=9)", "KEPT.append(self.log)",
    "list(map(self.log.append, [1, 2]))", "self.items.get(key, {}).update(n=5)", "self.__class__.__name__",
    "(lambda v: v.append(1))(self.log)", "sorted(self.log, key=lambda v: v)", "self.items[key].get('tags').append(1)",
    "'{0.size}'.format(self)", "[self] + []", "list(map(made.append, [1, 2]))", "(lambda r: r.append(1))(self.log)",
    "[r.clear() for r in [self.log]]", "repr(self._look)", "f'{self._peek}'", "str([self._peek])",
    "'{0.__self__.size}'.format(self._look)", "'{0.__self__.log[0]}'.format(self._peek)", "key.format(self._peek)",
    "'{.__closure__}'.format(lambda: self.log)", "list(map(self._look, [key]))",
    "r.setdefault('tags', self.log).append(1)", "r.get('tags', self.log).append(1)", "r.get(*['tags', self.log]).append(1)",
    "r.setdefault(*['tags', self.log]).append(1)", "self.items.setdefault(key, self.log).append(1)",
    "self.LIMITS.setdefault(key, []).append(1)", "self.items.setdefault('a', {}).update(n=1)",
]
SAFE_SPECIALS = ["max(self.scores, default=0)", "list(map(lambda v: len(v), [self.log]))", "sorted(self.log, key=lambda v: v)",
                 "list(map(made.append, [1, 2]))", "f'{self.cursor}'", "self._look(key)", "self.items.get(key, {})"]


class Grammar:
    """What a tool's statements are drawn from: everything, or reads and changes of what the tool
    made (``reads``), or those and changes of the entry ``self.items[key]`` (``entry``)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        free = mode == "free"
        self.methods = READING + CHANGING
        self.targets = LOCALS + (STORES if free else ENTRY_STORES if mode == "entry" else [])
        self.loop_targets = LOOP_LOCALS + (LOOP_STORES if free else [])
        self.deletes = DELETES if free else ["x", "made[0]", "made[key]"] + (["r['tags']"] if mode == "entry" else [])
        self.specials = SPECIALS + SAFE_SPECIALS if free else SAFE_SPECIALS
        self.kinds = ["assign", "assign", "local", "local", "augment", "for", "for", "delete", "expression",
                      "expression", "if", "try", "alias"] + (["swap", "global", "with", "unpack"] if free else [])

    def values(self) -> list[str]:
        return FRESH if self.mode == "entry" else PLACES + CONSTANTS


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]


@st.composite
def expressions(draw: st.DrawFn, grammar: Grammar, depth: int = 2) -> str:
    if depth <= 0:
        return draw(st.sampled_from(PLACES + CONSTANTS))
    inner = expressions(grammar, depth - 1)
    kind = draw(st.sampled_from(["place", "place", "constant", "call", "method", "method", "comprehension",
                                 "comprehension", "walrus", "builtin", "compare", "special", "lambda"]))
    if kind == "place":
        return draw(st.sampled_from(PLACES))
    if kind == "constant":
        return draw(st.sampled_from(CONSTANTS))
    if kind == "method":
        place = draw(st.sampled_from(PLACES))
        methods = grammar.methods if grammar.mode == "free" or place.startswith("made") else READING
        if grammar.mode == "entry" and place in ("self.items[key]['tags']", "r['tags']"):
            methods = READING + CHANGING
        argument = draw(st.sampled_from(ARGUMENTS if methods is READING else ARGUMENTS + FRESH))
        return f"{place}.{draw(st.sampled_from(methods)).format(a=argument)}"
    if kind == "comprehension":
        target = draw(st.sampled_from(grammar.loop_targets))
        source = draw(st.sampled_from(ITERABLES))
        value = draw(inner)
        condition = f" if {draw(inner)}" if draw(st.booleans()) else ""
        shape = draw(st.sampled_from(["[{v} for {t} in {s}{c}]", "{{{v} for {t} in {s}{c}}}",
                                      "{{str({v}): 1 for {t} in {s}{c}}}", "sum(1 for {t} in {s}{c})",
                                      "max([{v} for {t} in {s}{c}], default=0)", "any({v} for {t} in {s}{c})"]))
        return shape.format(v=value, t=target, s=source, c=condition)
    if kind == "walrus":
        return f"(w := {draw(inner)})"
    if kind == "builtin":
        name = draw(st.sampled_from(["len", "str", "sorted", "list", "dict", "set", "bool", "repr"]))
        return f"{name}({draw(inner)})"
    if kind == "compare":
        return f"({draw(inner)} == {draw(inner)})"
    if kind == "lambda":
        shape = "(lambda v: {})({})" if grammar.mode == "free" else "sorted({1}, key=lambda v: {0})"
        return shape.format(draw(inner), draw(inner))
    if kind == "call":
        return f"{draw(st.sampled_from(['f', 'g']))}({draw(inner)})"
    return draw(st.sampled_from(grammar.specials))


@st.composite
def statements(draw: st.DrawFn, grammar: Grammar, depth: int = 2) -> list[str]:
    kinds = grammar.kinds if depth > 0 else [kind for kind in grammar.kinds if kind not in ("for", "if", "try", "with")]
    kind = draw(st.sampled_from(kinds))
    value = expressions(grammar)
    body = st.lists(statements(grammar, depth - 1), min_size=1, max_size=2).map(lambda found: sum(found, []))
    if kind == "assign":
        target = draw(st.sampled_from(grammar.targets))
        stored = draw(st.sampled_from(grammar.values())) if target not in LOCALS else draw(value)
        return [f"{target} = {stored}"]
    if kind == "local":
        name = draw(st.sampled_from(["x", "y", "made", "n", "r"] if grammar.mode == "free" else ["x", "y", "made", "n"]))
        if name == "made" and grammar.mode != "free":
            return [f"made = {draw(st.sampled_from(['[]', '{}', 'list(self.log)', 'dict(self.seen)', 'sorted(r)']))}"]
        if name == "n" and grammar.mode != "free":
            return [f"n = {draw(st.sampled_from(['0', '1', '2.5', repr('s')]))}"]
        return [f"{name} = {draw(value)}"]
    if kind == "unpack":
        first, second = draw(st.sampled_from(grammar.targets)), draw(st.sampled_from(grammar.targets))
        shape = draw(st.sampled_from(["{a}, {b} = 1, 2", "[{a}, *{b}] = [1, 2, 3]", "{a} = {b} = []"]))
        return [shape.format(a=first, b=second)]
    if kind == "augment":
        target = draw(st.sampled_from(grammar.targets + ["made", "n"]))
        change = draw(st.sampled_from(["+= 1", "-= 1", "+= 's'", "+= [1]", "+= x", "+= self.scores", "*= 2",
                                       "*= self.scores", "|= {'k': 1}", "+= self.items[key]['tags']", "+= n"]))
        return [f"{target} {change}"]
    if kind == "for":
        loop = [f"for {draw(st.sampled_from(grammar.loop_targets))} in {draw(st.sampled_from(ITERABLES))}:"]
        inside = draw(body) + (["break"] if draw(st.booleans()) else [])
        return loop + _indent(inside)
    if kind == "delete":
        return [f"del {draw(st.sampled_from(grammar.deletes))}"]
    if kind == "expression":
        return [draw(value)]
    if kind == "if":
        return [f"if {draw(value)}:"] + _indent(draw(body))
    if kind == "try":
        return ["try:"] + _indent(draw(body)) + ["except Exception:", "    pass"]
    if kind == "alias":
        method = draw(st.sampled_from(["append", "pop", "clear", "get", "update", "sort", "copy", "keys"]))
        place = draw(st.sampled_from(PLACES if grammar.mode == "free" else ["made", "x", "self.log", "self.items"]))
        return [f"f = {place}.{method}", f"f({draw(st.sampled_from(ARGUMENTS))})"]
    if kind == "swap":
        return ["self.__class__ = Other"]
    if kind == "global":
        return ["global KEPT", f"KEPT = {draw(st.sampled_from(PLACES))}"]
    return [f"with contextlib.nullcontext({draw(value)}) as {draw(st.sampled_from(grammar.targets))}:", "    pass"]


def _between(lines: list[str], start: int) -> list[int]:
    """Where a statement can go at the top level: before an unindented line, or at the end."""
    return [at for at in range(start, len(lines)) if not lines[at].startswith(" ")] + [len(lines)]


@st.composite
def tools(draw: st.DrawFn) -> str:
    """A tool's body: statements mostly of reads (or of changes to one entry), with now and then
    one statement drawn from everything spliced in; then most often a ``return``."""
    mode = draw(st.sampled_from(["reads", "reads", "reads", "entry", "entry", "free"]))
    grammar = Grammar(mode)
    # (the alias of an entry, by subscript or by ``get``: with a default, or none, or a key that is missing)
    entry = draw(st.sampled_from(ENTRIES))
    prelude = [f"r = {entry}", "made = []", "n = 0", "f = self.items.get", "g = len", "x = self.items[other]['tags']", "y = self.seen"] if mode != "free" or draw(st.booleans()) else []
    lines = prelude + sum(draw(st.lists(statements(grammar), min_size=1, max_size=4)), [])
    if mode == "entry":
        at = draw(st.sampled_from(_between(lines, len(prelude))))
        lines.insert(at, draw(st.sampled_from(ENTRY_WRITES)))
    if mode != "free" and draw(st.booleans()):
        at = draw(st.sampled_from(_between(lines, 0)))
        lines[at:at] = draw(statements(Grammar("free"), depth=1))
    if draw(st.booleans()):
        lines.append(f"return {draw(expressions(grammar))}")
    return "\n".join(lines)


# -- running a tool, and what it changed -----------------------------------------------------


class Budget(BaseException):
    """A generated tool ran too long or grew too much (a loop over a list it extends)."""


def _source(body: str) -> str:
    code = "\n".join("        " + line for line in body.splitlines())
    return HEADER + f"\n    def tool(self, key='a', other='b'):\n{code}\n" + OTHER


def _compiled(source: str, name: str = "proofsoundenv") -> types.ModuleType | None:
    module = types.ModuleType(name)
    try:
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    except SyntaxError:
        return None
    return module


def snapshot(value: Any) -> Any:
    """``value`` exactly: types, order, and which objects are the same object (a shared one is a
    reference to where it was first met). Anything but a builtin value stands for itself."""
    seen: dict[int, int] = {}

    def walk(item: Any) -> Any:
        kind = type(item)
        if kind in (str, int, float, bool, type(None)):
            return kind.__name__, repr(item)
        if id(item) in seen:
            return "same", seen[id(item)]
        seen[id(item)] = len(seen)
        if kind is dict:
            return "dict", [(walk(key), walk(found)) for key, found in item.items()]
        if kind in (list, tuple):
            return kind.__name__, [walk(found) for found in item]
        if kind in (set, frozenset):
            return kind.__name__, sorted(repr(walk(found)) for found in item)
        return "object", id(item)

    return walk(value)


def run(tool: Callable[..., Any], instance: Any, arguments: dict[str, Any]) -> None:
    """Call ``tool``, stopped after a few thousand lines or once it holds a large container or
    number (its exceptions are part of what it does)."""
    lines = 0

    def too_big(values: Any) -> bool:
        for value in values:
            if isinstance(value, (list, dict, set, str, tuple)) and len(value) > 2000:
                return True
            if isinstance(value, int) and abs(value) > 10 ** 6:
                return True
            if isinstance(value, dict) and too_big(value.values()):
                return True
        return False

    def trace(frame: Any, event: str, argument: Any) -> Any:
        nonlocal lines
        lines += 1
        if lines > 3000 or too_big(vars(instance).values()) or too_big(frame.f_locals.values()):
            raise Budget
        return trace

    before = sys.gettrace()
    sys.settrace(trace)
    try:
        tool(**arguments)
    except (Exception, Budget):
        pass
    finally:
        sys.settrace(before)


def world(module: types.ModuleType) -> Any:
    """What lies outside the instance that a tool could change."""
    return snapshot([module.KEPT, module.Env.LIMITS, sorted(vars(module.Env)), sorted(vars(module))])


def unsound(body: str, key: str, other: str, note: Callable[[str], None] = lambda verdict: None) -> str | None:
    """Why the proofs of the tool ``body`` are wrong for a call with ``key`` and ``other``; None
    when they hold (or the body does not compile). ``note`` hears the verdict."""
    source = _source(body)
    module = _compiled(source)
    if module is None:
        return None
    proof = ReadOnly(module, source, module.Env)
    arguments = {"key": key, "other": other}
    readonly = proof.proven("tool")
    footprint = proof.footprint("tool", arguments)
    note("proven read-only" if readonly else "confined" if footprint is not None else "unproven")
    if not readonly and footprint is None:
        return None
    instance = module.Env()
    state, outside = snapshot(vars(instance)), world(module)
    before = {name: snapshot(value) for name, value in vars(instance).items()}
    olds = {name: list(value) if type(value) is dict else None for name, value in vars(instance).items()}
    entries = {name: {k: snapshot(v) for k, v in value.items()} for name, value in vars(instance).items()
               if type(value) is dict}
    run(instance.tool, instance, arguments)
    if type(instance) is not module.Env:
        return "the instance's class changed"
    if world(module) != outside:
        return "a class attribute or a module global changed"
    if readonly:
        return None if snapshot(vars(instance)) == state else "proven read-only, but the state changed"
    assert footprint is not None
    after = vars(instance)
    if list(after) != list(before):
        return "confined, but attributes were added or removed"
    for name, value in after.items():
        if name not in footprint:
            if snapshot(value) != before[name]:
                return f"confined, but {name} changed"
            continue
        keys = footprint[name]
        if keys is None or olds[name] is None or type(value) is not dict:
            continue  # the whole attribute is looked at (or the watch cannot tell, and falls back)
        for entry, found in entries[name].items():
            if entry not in keys and (entry not in value or snapshot(value[entry]) != found):
                return f"confined to {name}{sorted(keys)}, but {name}[{entry!r}] changed"
        # (the watch looks at the named entries alone only when none was added and the size held)
        if len(value) == len(olds[name]) and not any(k in value and k not in olds[name] for k in keys) \
                and list(value) != olds[name]:
            return f"confined to {name}{sorted(keys)}, but its entries moved"
    return None


@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          phases=(Phase.explicit, Phase.generate, Phase.shrink),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body=tools(), key=st.sampled_from(["a", "b", "zz"]), other=st.sampled_from(["a", "b", "c"]))
def test_a_proven_tool_changes_no_more_than_its_proof_says(body: str, key: str, other: str) -> None:
    problem = unsound(body, key, other, event)
    assert problem is None, f"{problem}:\n{body}"


# -- the constructs of the issue, one by one ----------------------------------------------------

WRITES = {
    "for_attribute": "for self.cursor in range(self.cursor + 1, len(self.queue)):\n    break\nreturn self.queue[self.cursor]",
    "for_entry": "for self.seen['last'] in [key]:\n    pass\nreturn key",
    "list_comprehension": "return max([self.best for self.best in self.scores])",
    "set_comprehension": "return len({self.best for self.best in self.scores})",
    "dict_comprehension": "return {t: 1 for t, self.seen['last'] in [(1, key)]}",
    "generator": "return sum(1 for self.cursor in range(2))",
    "nested_target": "for t, self.best in [(1, 2)]:\n    pass",
    "starred_target": "for *self.log, in [[1]]:\n    pass",
    "str_self": "return str(self)",
    "compare_self": "return self == 1",
    "format_self": "return f'{self}'",
    "truth_of_self": "if self:\n    return 1",
    "iterate_self": "return list(self)",
    "format_field": "return '{0.size}'.format(self)",
    "repr_of_a_method": "return repr(self._look)",
    "format_through_a_method": "return '{0.__self__.size}'.format(self._look)",
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_every_write_of_the_issue_leaves_the_tool_unproven(name: str) -> None:
    body = WRITES[name]
    module = _compiled(_source(body))
    assert module is not None
    instance = module.Env()
    state = snapshot(vars(instance))
    run(instance.tool, instance, {"key": "a", "other": "b"})
    assert snapshot(vars(instance)) != state, "the construct changes the state"
    proof = ReadOnly(module, _source(body), module.Env)
    assert not proof.proven("tool") and proof.footprint("tool", {"key": "a", "other": "b"}) is None
    assert unsound(body, "a", "b") is None


def test_a_lambda_parameter_is_not_an_alias_of_an_entry() -> None:
    body = "r = self.items[key]\nf = lambda r: r.append(1)\nf(self.log)\nr['n'] = 2"
    module = _compiled(_source(body))
    assert module is not None
    assert ReadOnly(module, _source(body), module.Env).footprint("tool", {"key": "a", "other": "b"}) is None


def test_a_number_scaled_by_a_list_is_no_longer_fresh() -> None:
    body = "n = 1\nn *= self.items['a']['tags']\nself.items[key]['copy'] = n"
    module = _compiled(_source(body))
    assert module is not None
    assert ReadOnly(module, _source(body), module.Env).footprint("tool", {"key": "b", "other": "b"}) is None


def test_reads_of_every_kind_stay_proven() -> None:
    """The same constructs binding locals only are as proven as before."""
    reads = {
        "for_local": "for t in range(self.cursor + 1, len(self.queue)):\n    break\nreturn self.queue[self.cursor]",
        "comprehensions": "return [t for t in self.scores], {t for t in self.scores}, {t: 1 for t in self.log}",
        "generator": "return sum(t for t in self.scores) + max((t for t in self.scores), default=0)",
        "destructuring": "for name, (t, *u) in [('a', self.log)]:\n    pass\nreturn name",
        "walrus": "if (w := self.items.get(key)):\n    return w['n']",
        "attribute_of_self": "return self.best, self._look(key), f'{self.cursor}'",
        "made": "found = []\nfor t in self.scores:\n    found.append(t)\nfound[0] = 1\nfound *= 2\nreturn found",
    }
    for name, body in reads.items():
        module = _compiled(_source(body))
        assert module is not None
        assert ReadOnly(module, _source(body), module.Env).proven("tool"), name


FREEZE = '''

class FrozenEnv(Env):
    def balance_of(self):
        self.seen["count"] += 1
        return self.best

    def withdraw(self):
        return "account frozen"
'''


def test_a_proof_is_of_its_class_and_not_of_the_class_an_instance_was_given() -> None:
    source = HEADER + '''
    def tool(self, key='a', other='b'):
        return key

    def balance_of(self):
        return self.best

    def withdraw(self):
        self.best -= 1
        return self.best

    def freeze(self):
        self.__class__ = FrozenEnv

    def close(self, key='a'):
        self.items[key]['n'] = 0
''' + OTHER + FREEZE
    module = _compiled(source)
    assert module is not None
    proof = ReadOnly(module, source, module.Env)
    assert proof.proven("balance_of") and "freeze" not in proof.tools
    assert proof.footprint("close", {"key": "a"}) == {"items": {"a"}}
    instance = module.Env()
    instance.freeze()
    assert type(instance) is module.FrozenEnv
    assert not proof.proven("balance_of", type(instance))
    assert proof.footprint("close", {"key": "a"}, type(instance)) is None
    assert proof.proven("balance_of", module.Env)


def test_a_live_session_looks_at_the_state_after_a_read_on_an_instance_given_another_class() -> None:
    source = HEADER + '''
    def tool(self, key='a', other='b'):
        return key

    def balance_of(self):
        return self.best

    def freeze(self):
        self.__class__ = FrozenEnv
''' + OTHER + FREEZE
    module = _compiled(source, "proofsoundlive")
    assert module is not None
    sys.modules[module.__name__] = module
    try:
        session = LiveSession(module, module.Env, ReadOnly(module, source, module.Env))
        session.handle({"op": "init", "init_config": {}})
        assert session.parts is not None and session.parts.watched
        session.handle({"op": "call", "name": "freeze", "arguments": {}})
        answer, kept = session.handle({"op": "call", "name": "balance_of", "arguments": {}})
        assert kept and answer["ok"]
        assert answer["state"] is not None and json.loads(answer["state"])["seen"]["count"] == 1
    finally:
        del sys.modules[module.__name__]
