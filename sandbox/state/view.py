"""The client's JSON view of state: of Python values (``view``) and of encoded state
(``view_encoded``, which never unpickles, so the service may call it), and diffs between views.

A view is a tree: an object met again is shown as ``{"$ref": pointer}``, a JSON pointer
(RFC 6901) into the same view to where it is shown in full; a key of the state's own that starts
with ``$`` is shown with one more ``$`` in front, so every key starting with a single ``$`` is the
view's; containers nested deeper than ``MAX_DEPTH``, or met after ``MAX_VIEW_NODES`` containers,
are shown as ``{"$truncated": "depth"}`` or ``{"$truncated": "size"}``. The environment instance
itself, met in its own state (a back-reference), is ``{"$ref": ""}``: the pointer to the view's
root. A ``deque`` is shown as a list, an ``OrderedDict``, ``defaultdict`` or ``Counter`` as an
object, a bound method as the text ``<bound method Class.name>``, and a set in the order of its
members' views (not its own). Standard library only.

One budget bounds the whole view: a container costs one, and what a dict key or a set member's
sort key shows (each is shown on its own, so an object shared by many keys is shown in full under
every one of them) costs its items and long strings, every time, against the same budget.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import decimal
import enum
import json
import math
import types
from typing import Any, NotRequired, TypedDict

from sandbox.state.stateformat import (
    BIG_INT_BITS,
    KEY_NODES,
    MAX_DEPTH,
    MAX_KEY_NODES,
    MAX_VIEW_NODES,
    REF,
    TAG,
    TRUNCATED,
    Where,
    pointer,
    set_key,
)


class _Budget:
    """What a view may still show, shared by a view and the sub-views it builds (a sub-view, for a
    key, has a smaller budget of its own and spends its parent's too)."""

    def __init__(self, left: int | None = None, parent: _Budget | None = None) -> None:
        self.left = MAX_VIEW_NODES if left is None else left
        self.parent = parent

    def take(self, cost: int) -> bool:
        """Spend ``cost``; False once this budget or a parent's has run out."""
        self.left -= cost
        if self.parent is not None and not self.parent.take(cost):
            return False
        return self.left >= 0

    @property
    def exhausted(self) -> bool:
        return self.left < 0


class _Viewer:
    """Shows a graph as a JSON tree: each object in full at its first place, a ``$ref`` after."""

    def __init__(self, budget: _Budget | None = None, keying: bool = False) -> None:
        self.budget = budget or _Budget()
        self.keying = keying  # shows keys: values inside keys are shown by this viewer too
        self.owner: Any = None  # (ValueViewer) the environment instance, shown as the root
        self.places: dict[Any, Where] = {}
        self.pointers: dict[Any, str] = {}

    def show(self, value: Any, where: Where, depth: int) -> Any:
        raise NotImplementedError

    def ref(self, key: Any) -> dict[str, Any]:
        pointer = self.pointers.get(key)
        if pointer is None:
            pointer = self.pointers[key] = _render(self.places[key])
        return {REF: pointer}

    def admit(self, depth: int, width: int) -> dict[str, str] | None:
        """None if one more container, of ``width`` items, may be shown at ``depth``, else the
        marker shown instead. Keys count items too: a key is cut rather than walk a large graph."""
        if depth >= MAX_DEPTH:
            return {TRUNCATED: "depth"}
        if not self.budget.take(1 + width if self.keying else 1):
            return {TRUNCATED: "size"}
        return None

    def spend_text(self, text: str) -> None:
        """A long string shown inside a key costs by its length (a key may show it many times)."""
        if self.keying and len(text) > 64:
            self.budget.take(len(text) >> 6)

    def sub(self, budget: _Budget) -> _Viewer:
        """A viewer of the same kind that shows keys."""
        raise NotImplementedError

    def alone(self, value: Any, nodes: int) -> Any:
        """``value`` shown on its own (a dict key, a set member's sort key) within ``nodes``
        containers. Keys inside keys share one viewer, so a cycle through them ends."""
        viewer = self if self.keying else self.sub(_Budget(nodes, self.budget))
        return viewer.show(value, None, 0)

    def field(self, out: dict[str, Any], key: Any, value: Any, where: Where, depth: int) -> None:
        text = key if type(key) is str else key_text(self.alone(key, MAX_KEY_NODES))
        if text[:1] == "$":
            text = "$" + text  # keys starting with a single "$" are the view's own ($ref, $truncated)
        out[text] = self.show(value, (where, text), depth)

    def members(self, members: list[Any], where: Where, depth: int) -> list[Any]:
        """Sets have no order: members are shown sorted by the JSON text each has on its own (cut
        at ``KEY_NODES`` containers), so the view depends neither on iteration order nor on where
        shared objects land."""
        keys = [self.member_key(m) for m in members]
        order = sorted(range(len(members)), key=keys.__getitem__)
        return [self.show(members[j], (where, i), depth) for i, j in enumerate(order)]

    def member_key(self, member: Any) -> str:
        if member is None or type(member) in (str, int, float, bool):
            return set_key(self.show(member, None, 0))  # plain values: no container, no place
        return set_key(self.alone(member, KEY_NODES))


class ValueViewer(_Viewer):
    def sub(self, budget: _Budget) -> _Viewer:
        viewer = ValueViewer(budget, keying=True)
        viewer.owner = self.owner
        return viewer

    def show(self, value: Any, where: Where, depth: int) -> Any:
        kind = type(value)
        if kind is str:
            if self.keying:
                self.spend_text(value)
            return value
        if value is None or kind is bool:
            return value
        if value is self.owner:
            return {REF: ""}
        if isinstance(value, enum.Enum):
            return _rebase(view(value.value), where)  # as stored: shown on its own, like the encoder
        if isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return value if value.bit_length() < BIG_INT_BITS else hex(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else repr(value)
        if isinstance(value, (dt.datetime, dt.date, dt.time)):
            return value.isoformat()
        if isinstance(value, dt.timedelta):
            return value.total_seconds()
        if isinstance(value, decimal.Decimal):
            return str(value)
        if kind is bytes:
            return _bytes_view(value)
        if (kind is tuple or kind is frozenset) and not value:
            return []
        marker = id(value)
        if marker in self.places:
            return self.ref(marker)
        if (kind is types.MethodType or kind is types.BuiltinMethodType) and bound_method(value):
            self.places[marker] = where  # (a method held twice is a "$ref" the second time, as stored)
            return method_view(value)
        sized = isinstance(value, (dict, list, tuple, set, frozenset, collections.deque))
        marked = self.admit(depth, len(value) if self.keying and sized else 0)
        if marked is not None:
            return marked
        self.places[marker] = where
        depth += 1
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, item in value.items():
                self.field(out, key, item, where, depth)
            return out
        if isinstance(value, (list, tuple, collections.deque)):
            return [self.show(v, (where, i), depth) for i, v in enumerate(value)]
        if isinstance(value, (set, frozenset)):
            return self.members(list(value), where, depth)
        if isinstance(value, (bytes, bytearray)):
            return _bytes_view(bytes(value))
        if hasattr(value, "__dict__") and not callable(value):
            out = {"__type__": type(value).__name__}
            for key, item in vars(value).items():
                self.field(out, key, item, where, depth)
            return out
        text = repr(value)
        return text if len(text) <= 1000 else text[:1000] + "..."


class _Definitions:
    """Where each id of an encoded state is written in full, indexed when first needed: a
    reference can come before its definition in view order (sets, cycles through tuples)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.index: dict[int, Any] | None = None

    def find(self, number: int) -> Any:
        if self.index is None:
            self.index = {}
            stack = [self.root]
            while stack:
                node = stack.pop()
                if type(node) is dict:
                    if node.get(TAG) == "id" and type(node.get("id")) is int:
                        self.index.setdefault(node["id"], node.get("v"))
                    stack.extend(node.values())
                elif type(node) is list:
                    stack.extend(node)
        return self.index.get(number, _MISSING)


_MISSING = object()


class InvalidEncoding(ValueError):
    """A tagged value the codec never writes (only a strict view raises it)."""


class _EncodedViewer(_Viewer):
    def __init__(self, definitions: _Definitions, budget: _Budget | None = None, keying: bool = False,
                 strict: bool = False) -> None:
        super().__init__(budget, keying)
        self.definitions = definitions
        self.strict = strict

    def sub(self, budget: _Budget) -> _Viewer:
        return _EncodedViewer(self.definitions, budget, keying=True, strict=self.strict)

    def show(self, value: Any, where: Where, depth: int) -> Any:
        kind = type(value)
        if kind is dict:
            tag = value.get(TAG)
            if tag is not None:
                try:
                    if tag == "id" or tag == "ref" or tag == "flat":
                        # Followed here, not by recursion: a deep state's view passes a reference at
                        # every level, and each level must cost as few frames as a plain dict's.
                        value, shown = self.link(tag, value, where)
                        if shown is not None:
                            return shown
                        kind = type(value)
                        tag = value.get(TAG) if kind is dict else None
                    if tag is not None:
                        return self.tagged(tag, value, where, depth)
                except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
                    if self.strict:
                        raise InvalidEncoding(f"unreadable tagged value {tag!r}") from exc
                    return {TRUNCATED: "invalid"}  # only a corrupted store holds such a value
        if kind is dict:
            marked = self.admit(depth, len(value))
            if marked is not None:
                return marked
            out: dict[str, Any] = {}
            show = self.show
            depth += 1
            for key, item in value.items():  # JSON keys are strings: the hot path of field()
                if key[:1] == "$":
                    key = "$" + key
                out[key] = show(item, (where, key), depth)
            return out
        if kind is list:
            marked = self.admit(depth, len(value))
            if marked is not None:
                return marked
            return [self.show(v, (where, i), depth + 1) for i, v in enumerate(value)]
        if kind is str and self.keying:
            self.spend_text(value)
        return value

    def link(self, tag: str, value: dict[str, Any], where: Where) -> tuple[Any, Any]:
        """An object written with an id, referenced, or a flat block standing for its first object:
        (what to show in its place, None), or (None, its view) when it was shown already."""
        raw: Any = value.get("v")
        if tag == "flat":
            value = raw[0]  # (a block holds objects with ids, the first standing for the block)
            if type(value) is not dict or value.get(TAG) != "id":
                raise ValueError(tag)
            raw = value.get("v")
        number = value.get("id")
        if type(number) is not int:
            raise ValueError(number)
        if number in self.places:
            return None, self.ref(number)
        if tag == "ref":
            raw = self.definitions.find(number)
            if raw is _MISSING:
                raise ValueError(number)
        if type(raw) is dict and raw.get(TAG) in ("id", "ref", "flat"):
            raise ValueError(number)  # never written so; refused, as such chains are not counted as depth
        self.places[number] = where
        return raw, None

    def tagged(self, tag: Any, value: dict[str, Any], where: Where, depth: int) -> Any:
        raw: Any = value.get("v")
        if tag == "self":
            return {REF: ""}
        if (tag == "tuple" or tag == "frozenset") and raw == []:
            return []  # empty ones are shown without a place, at any depth (as ``ValueViewer`` does)
        if tag in ("dict", "tuple", "set", "frozenset", "object", "deque", "odict", "defaultdict", "counter"):
            marked = self.admit(depth, len(raw))
            if marked is not None:
                return marked
            if tag == "tuple" or tag == "deque":
                return [self.show(v, (where, i), depth + 1) for i, v in enumerate(raw)]
            if tag in ("set", "frozenset"):
                return self.members(list(raw), where, depth + 1)
            out: dict[str, Any] = {}
            if tag == "object":
                out["__type__"] = str(value.get("cls", "")).rsplit(".", 1)[-1]
                if type(raw) is dict and raw.get(TAG) is None:
                    show = self.show
                    depth += 1
                    for key, item in raw.items():  # (``field`` inlined: string keys, one frame less a level)
                        if key[:1] == "$":
                            key = "$" + key
                        out[key] = show(item, (where, key), depth)
                    return out
                raw = raw["v"]  # attributes with a key named like the tag: written as pairs
            for key, item in raw:
                self.field(out, key, item, where, depth + 1)
            return out
        if tag == "int":
            return hex(int(raw, 16))
        if tag == "timedelta":
            return dt.timedelta(days=raw[0], seconds=raw[1], microseconds=raw[2]).total_seconds()
        if tag == "bytes":
            return _bytes_view(base64.b64decode(raw))
        if tag in ("enum", "pickle", "method"):
            return _rebase(value.get("view"), where)
        return raw  # float, datetime, date, time, decimal: already strings


def _render(where: Where) -> str:
    keys = []
    while where is not None:
        where, key = where
        keys.append(key)
    return "".join(pointer("", key) for key in reversed(keys))


def _rebase(shown: Any, where: Where, depth: int = 0) -> Any:
    """A view made on its own (an enum's value, a pickled value) placed at ``where``: its
    references pointed into itself and now point to where it is."""
    if where is None or depth > MAX_DEPTH:
        return shown if depth <= MAX_DEPTH else {TRUNCATED: "depth"}
    if type(shown) is dict:
        if len(shown) == 1 and type(shown.get(REF)) is str:
            return {REF: _render(where) + shown[REF]}
        return {k: _rebase(v, where, depth + 1) for k, v in shown.items()}
    if type(shown) is list:
        return [_rebase(v, where, depth + 1) for v in shown]
    return shown


def view(value: Any, owner: Any = None) -> Any:
    """The JSON view of any Python value (tool results, pickled objects): see the module docstring.
    ``owner``: the environment instance, when ``value`` is its state."""
    if owner is None:
        try:
            return _plain(value, 0, set())
        except _NotPlain:
            pass
    viewer = ValueViewer()
    viewer.owner = owner
    return viewer.show(value, None, 0)


class _NotPlain(Exception):
    pass


def _plain(value: Any, depth: int, seen: set[int]) -> Any:
    """``value`` as ``ValueViewer`` shows it, for the usual tool result: a tree of dicts with text
    keys, lists, text, ints, finite floats, booleans and None, each container met once and within
    the view's bounds. Anything else raises ``_NotPlain`` (the viewer then shows it). A third of
    the viewer's cost: one test of the exact type per value instead of the viewer's chain."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if value.bit_length() < BIG_INT_BITS:
            return value
        raise _NotPlain
    if kind is float:
        if math.isfinite(value):
            return value
        raise _NotPlain
    if kind is not dict and kind is not list:
        raise _NotPlain
    marker = id(value)
    if depth >= MAX_DEPTH or marker in seen or len(seen) >= MAX_VIEW_NODES:
        raise _NotPlain  # (a truncation or a ``$ref``: the viewer's)
    seen.add(marker)
    depth += 1
    if kind is list:
        return [_plain(item, depth, seen) for item in value]
    out = {}
    for key, item in value.items():
        if type(key) is not str or key[:1] == "$":
            raise _NotPlain
        out[key] = _plain(item, depth, seen)
    return out


def bound_method(value: Any) -> bool:
    """Whether a method (or builtin method) is bound to an object: not to a class or a module."""
    target = value.__self__
    return target is not None and not isinstance(target, (types.ModuleType, type))


def method_view(method: Any) -> str:
    """A bound method as the view shows it: its class and name (its object is shown where it is)."""
    return f"<bound method {method.__qualname__}>"


def view_encoded(value: Any, *, strict: bool = False) -> Any:
    """The JSON view of encoded state, equal to ``view`` of the decoded state. Never unpickles:
    safe in the service. ``strict``: raise InvalidEncoding on a value the codec never writes,
    instead of showing it as ``{"$truncated": "invalid"}`` (for checking what a sandbox sends)."""
    return _EncodedViewer(_Definitions(value), strict=strict).show(value, None, 0)


def view_encoded_within(value: Any, budget: int) -> Any:
    """``view_encoded`` if it fits in ``budget`` (containers, and what keys show), else ``OVER``:
    the caller builds it elsewhere with the full budget (see ``service/engine/offload.py``)."""
    spent = _Budget(budget)
    shown = _EncodedViewer(_Definitions(value), spent).show(value, None, 0)
    return OVER if spent.exhausted else shown


OVER = object()


def view_encoded_at(value: Any, depth: int) -> Any:
    """``view_encoded`` of a part of a state in which no object is reached twice, found ``depth``
    containers below its root: the same as that part of the whole state's view."""
    return _EncodedViewer(_Definitions(value)).show(value, None, depth)


def key_text(viewed_key: Any) -> str:
    """JSON object keys are strings: a non-string key is shown as its JSON text."""
    return viewed_key if isinstance(viewed_key, str) else json.dumps(viewed_key, sort_keys=True)


def _bytes_view(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(raw).decode("ascii")


class Diff(TypedDict):
    """What a call changed, as JSON pointers: ``{"path", "value"}`` entries (``changed`` ones have
    ``before`` and ``after``). A diff past its byte bound is cut to ``truncated`` and its ``bytes``."""

    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    changed: list[dict[str, Any]]
    truncated: NotRequired[bool]
    bytes: NotRequired[int]


def no_diff() -> Diff:
    """A diff of nothing (a new one each time: callers may append to it)."""
    return {"added": [], "removed": [], "changed": []}


def cut_diff(size: int) -> Diff:
    """What is kept of a diff whose JSON takes ``size`` bytes, past its bound."""
    return {"added": [], "removed": [], "changed": [], "truncated": True, "bytes": size}


def diff(before: Any, after: Any, path: str = "") -> Diff:
    """What changed between two JSON views, as JSON pointers. Views are trees (an object shown
    twice is a ``$ref`` the second time), so a change made through an alias is reported once,
    where the object is shown in full."""
    out = no_diff()
    _diff(before, after, path, out)
    return out


def _marker(shown: Any) -> bool:
    return len(shown) == 1 and (REF in shown or TRUNCATED in shown)


def _diff(before: Any, after: Any, path: str, out: Diff) -> None:
    # A reference (or a cut) is compared whole: a moved alias is one change, not a changed string.
    if isinstance(before, dict) and isinstance(after, dict) and not (_marker(before) or _marker(after)):
        for key, value in after.items():
            if key not in before:
                out["added"].append({"path": pointer(path, key), "value": value})
            else:
                _diff(before[key], value, pointer(path, key), out)
        for key, value in before.items():
            if key not in after:
                out["removed"].append({"path": pointer(path, key), "value": value})
        return
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (old, new) in enumerate(zip(before, after, strict=True)):
            _diff(old, new, pointer(path, i), out)
        return
    # Compare with types: 1 == True and 1 == 1.0 in Python, but not in JSON.
    if type(before) is type(after) and before == after:
        return
    out["changed"].append({"path": path, "old": before, "new": after})
