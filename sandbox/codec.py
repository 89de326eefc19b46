"""State codec: Python state <-> tagged JSON, and the plain JSON view clients see.

Encoded state is JSON in which values JSON cannot hold are tagged objects
``{"$ef": kind, "v": ...}``. Instances of classes from the environment's own
code are stored as their class name plus their encoded ``__dict__``; anything
else that is not JSON falls back to pickle, which only sandbox code decodes.

Object graphs round-trip exactly, as with ``deepcopy`` or pickle: an object
reached more than once (a list, dict, set, tuple, instance or pickled value
held by two attributes, or on a cycle such as a parent pointer) is written in
full once, as ``{"$ef": "id", "id": n, "v": <its encoding>}``, and everywhere
else as ``{"$ef": "ref", "id": n}``. A state in which nothing is reached twice
is written exactly as before graphs were supported, and states written then
decode unchanged. Values stored with pickle keep identity among their own
parts only.

``view_encoded`` turns encoded state into the client's JSON view without ever
unpickling, so the service can call it safely; ``view`` does the same for a
Python value. A view is a tree: an object met again is shown as
``{"$ref": pointer}``, a JSON pointer (RFC 6901) into the same view to where
it is shown in full; a key of the state's own that starts with ``$`` is shown
with one more ``$`` in front, so every key starting with a single ``$`` is the
view's; containers nested deeper than ``MAX_DEPTH``, or met after
``MAX_VIEW_NODES`` containers, are shown as ``{"$truncated": "depth"}`` or
``{"$truncated": "size"}``. Standard library only.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import enum
import json
import math
import pickle
from collections.abc import Callable
from typing import Any

TAG = "$ef"
REF = "$ref"
TRUNCATED = "$truncated"
MAX_DEPTH = 200
# Far more containers than a state under the size limit holds: the bound only stops runaway views.
MAX_VIEW_NODES = 1 << 22
# A set member's sort key is its view cut after this many containers and items: members linked into a
# large graph (a parent pointer) must not each cost a walk of the whole graph.
KEY_NODES = 256
MAX_KEY_NODES = 10_000  # a dict key's view (keys are hashable: tuples, frozensets, frozen objects)
BIG_INT_BITS = 4000  # about 1200 decimal digits, well under the 4300-digit conversion limit
# Values without identity of their own: equal ones are interchangeable, so they are never shared.
_IDENTITY_FREE = frozenset({dt.datetime, dt.date, dt.time, dt.timedelta, decimal.Decimal, bytes})
# A view's place for an object: None at the root, else (parent place, key in the view).
Where = tuple[Any, Any] | None


class CodecError(Exception):
    """A value cannot be encoded; ``path`` is a JSON pointer to it."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message, path)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        return f"{self.message} at {self.path or '/'}"

    def within(self, key: Any) -> None:
        """Errors are raised where they happen and get their path on the way out, so a healthy
        encode never builds one."""
        self.path = _pointer("", key) + self.path


def _pointer(path: str, key: Any) -> str:
    return f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _tagged(kind: str, value: Any, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {TAG: kind, "v": value}
    out.update(extra)
    return out


def _scalar(value: Any, kind: type) -> dict[str, Any]:
    if kind is dt.datetime:
        return _tagged("datetime", value.isoformat())
    if kind is dt.date:
        return _tagged("date", value.isoformat())
    if kind is dt.time:
        return _tagged("time", value.isoformat())
    if kind is dt.timedelta:
        return _tagged("timedelta", [value.days, value.seconds, value.microseconds])
    if kind is decimal.Decimal:
        return _tagged("decimal", str(value))
    return _tagged("bytes", base64.b64encode(value).decode("ascii"))


def _set_key(item: Any) -> str:
    return json.dumps(item, sort_keys=True)


class Encoder:
    """Encode values; ``env_module`` names the module whose classes are stored by name.

    Encoding is one walk when nothing is reached twice. Otherwise a second walk writes the objects
    the first one met more than once (``shared``) with an id where they first appear and as
    references after that.
    """

    def __init__(self, env_module: str | None = None, shared: frozenset[int] | None = None) -> None:
        self.env_module = env_module
        self.shared = shared
        self.seen: dict[int, Any] = {}  # first walk: every object with identity, kept alive
        self.repeated: set[int] = set()  # first walk: those met again
        self.ids: dict[int, int] = {}  # second walk: objects already written in full
        self.written: list[int] = []  # second walk: the same, in order (ids are positions + 1)
        self.building = 0  # second walk: shared tuples and frozensets being written
        self.depth = 0

    def encode(self, value: Any) -> Any:
        kind = type(value)
        if kind is str or value is None or kind is bool:
            return value
        if kind is int:
            # JSON text cannot carry ints past Python's digit limit; hex has none.
            return value if value.bit_length() < BIG_INT_BITS else _tagged("int", format(value, "x"))
        if kind is float:
            return value if math.isfinite(value) else _tagged("float", repr(value))
        if kind is not list and kind is not dict:
            if kind in _IDENTITY_FREE:
                return _scalar(value, kind)
            if (kind is tuple or kind is frozenset) and not value:
                return _tagged(kind.__name__, [])  # singletons in CPython: sharing them means nothing
            if isinstance(value, enum.Enum):  # members are singletons, rebuilt by name
                if self._is_env_class(kind):
                    return _tagged("enum", value.name, cls=kind.__qualname__, view=view(value))
                return self._pickled(value, kind)
        marker = id(value)
        if self.shared is None:
            if marker in self.seen:
                self.repeated.add(marker)
                return None  # this walk's output is thrown away
            self.seen[marker] = value
            return self._body(value, kind)
        if marker not in self.shared and not self.building:
            return self._body(value, kind)
        number = self.ids.get(marker)
        if number is not None:
            return {TAG: "ref", "id": number}
        if kind is tuple or kind is frozenset:
            if marker in self.shared:
                return self._immutable(value, kind, marker)
            return self._body(value, kind)
        # Inside a shared tuple being written every mutable object gets an id, even one met once:
        # a cycle back to the tuple then ends at a reference to it (as pickle does).
        number = self._number(marker)
        return {TAG: "id", "id": number, "v": self._body(value, kind)}

    def _number(self, marker: int) -> int:
        self.written.append(marker)
        self.ids[marker] = number = len(self.written)
        return number

    def _rollback(self, mark: int) -> None:
        for marker in self.written[mark:]:
            del self.ids[marker]
        del self.written[mark:]

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CodecError("state nests too deeply")

    def _body(self, value: Any, kind: type) -> Any:
        self._enter()
        out: Any
        if kind is list:
            out = []
            try:
                for item in value:
                    out.append(self.encode(item))
            except CodecError as exc:
                exc.within(len(out))
                raise
        elif kind is dict:
            out = self._dict(value)
        elif kind is tuple:
            out = _tagged("tuple", self._items(value, None))
        elif kind is set or kind is frozenset:
            out = _tagged(kind.__name__, self._members(list(value)))
        elif self._is_env_class(kind) and hasattr(value, "__dict__") and not hasattr(kind, "__slots__"):
            out = _tagged("object", self._dict(vars(value)), cls=kind.__qualname__)
        else:
            out = self._pickled(value, kind)
        self.depth -= 1
        return out

    def _dict(self, value: dict[Any, Any]) -> Any:
        encode = self.encode
        if all(type(k) is str for k in value) and TAG not in value:
            out: dict[str, Any] = {}
            try:
                for key, item in value.items():
                    out[key] = encode(item)
            except CodecError as exc:
                exc.within(key)
                raise
            return out
        pairs = []
        for key, item in value.items():
            encoded_key = encode(key)
            try:
                pairs.append([encoded_key, encode(item)])
            except CodecError as exc:
                exc.within(key)
                raise
        return _tagged("dict", pairs)

    def _items(self, items: Any, watch: int | None) -> list[Any]:
        """A tuple's items. With ``watch``: stops early, leaving ``watch`` in ``ids``, if the tuple
        ``watch`` names was written while its own items were."""
        out: list[Any] = []
        try:
            for item in items:
                out.append(self.encode(item))
                if watch is not None and watch in self.ids:
                    break
        except CodecError as exc:
            exc.within(len(out))
            raise
        return out

    def _members(self, members: list[Any], watch: int | None = None) -> list[Any]:
        """A set's members sorted by their JSON text (sets have no order; the text must not
        depend on it). Stops early like ``_items`` for ``watch``."""
        mark = len(self.written)
        out = []
        for item in members:
            out.append(self.encode(item))
            if watch is not None and watch in self.ids:
                return out
        if len(self.written) == mark:
            keys = [_set_key(item) for item in out]
            return [out[i] for i in sorted(range(len(out)), key=keys.__getitem__)]
        # A shared object was written in full inside this set, so the members' text depends on
        # the order they were met in. Write them again in the order of their views, which does
        # not, so that the object also comes before every reference to it.
        self._rollback(mark)
        keys = [_ValueViewer().member_key(item) for item in members]
        return [self.encode(members[i]) for i in sorted(range(len(members)), key=keys.__getitem__)]

    def _immutable(self, value: Any, kind: type, marker: int) -> dict[str, Any]:
        """A shared tuple or frozenset: it can only be rebuilt once its items are, so its id is
        given after them. If a cycle through its items wrote it meanwhile, this occurrence is a
        reference that keeps the items written on the way (the decoder needs their ids)."""
        self._enter()
        self.building += 1
        members = value if kind is tuple else list(value)
        items = self._items(members, marker) if kind is tuple else self._members(members, marker)
        self.building -= 1
        self.depth -= 1
        number = self.ids.get(marker)
        if number is not None:
            return {TAG: "ref", "id": number, "v": items}
        number = self._number(marker)
        return {TAG: "id", "id": number, "v": _tagged(kind.__name__, items)}

    def _pickled(self, value: Any, kind: type) -> dict[str, Any]:
        try:
            blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise CodecError(f"{kind.__name__} value cannot be serialized ({exc})") from exc
        return _tagged("pickle", base64.b64encode(blob).decode("ascii"), view=view(value))

    def _is_env_class(self, kind: type) -> bool:
        return self.env_module is not None and kind.__module__ == self.env_module


def encode(value: Any, env_module: str | None = None) -> Any:
    """The tagged-JSON form of ``value``. Raises CodecError with a pointer to what cannot be encoded."""
    first = Encoder(env_module)
    encoded = first.encode(value)
    if not first.repeated:
        return encoded
    return Encoder(env_module, frozenset(first.repeated)).encode(value)


class Decoder:
    """Inverse of ``Encoder``; ``resolve`` finds the environment's classes by qualified name."""

    def __init__(self, resolve: Callable[[str], Any] | None = None) -> None:
        self.resolve = resolve
        self.objects: dict[Any, Any] = {}

    def decode(self, value: Any) -> Any:
        kind = type(value)
        if kind is dict:
            tag = value.get(TAG)
            if tag is None:
                decode = self.decode
                return {k: decode(v) for k, v in value.items()}
            return self._tagged(tag, value)
        if kind is list:
            decode = self.decode
            return [decode(v) for v in value]
        return value

    def _tagged(self, kind: str, value: dict[str, Any]) -> Any:
        raw: Any = value.get("v")
        if kind == "id":
            return self._define(value.get("id"), raw)
        if kind == "ref":
            if raw is not None:
                self.decode(raw)  # items written before a cycle reached the tuple: they hold ids
            try:
                return self.objects[value.get("id")]
            except (KeyError, TypeError):
                raise ValueError(f"reference to an object never written: {value.get('id')!r}") from None
        if kind == "dict":
            return {self.decode(k): self.decode(v) for k, v in raw}
        if kind == "tuple":
            return tuple(self.decode(v) for v in raw)
        if kind == "set":
            return {self.decode(v) for v in raw}
        if kind == "frozenset":
            return frozenset(self.decode(v) for v in raw)
        if kind == "float":
            return float(raw)
        if kind == "int":
            return int(raw, 16)
        if kind == "datetime":
            return dt.datetime.fromisoformat(raw)
        if kind == "date":
            return dt.date.fromisoformat(raw)
        if kind == "time":
            return dt.time.fromisoformat(raw)
        if kind == "timedelta":
            return dt.timedelta(days=raw[0], seconds=raw[1], microseconds=raw[2])
        if kind == "decimal":
            return decimal.Decimal(raw)
        if kind == "bytes":
            return base64.b64decode(raw)
        if kind == "enum":
            return self._class(value)[raw]
        if kind == "object":
            return self._object(value, None)
        if kind == "pickle":
            return pickle.loads(base64.b64decode(raw))
        raise ValueError(f"unknown tag {kind!r}")

    def _define(self, number: Any, body: Any) -> Any:
        """An object written with an id: mutable ones are registered before their contents are
        decoded, so references inside them (cycles) find them."""
        out: Any
        kind = type(body)
        tag = body.get(TAG) if kind is dict else None
        if kind is list:
            self.objects[number] = out = []
            for item in body:
                out.append(self.decode(item))
        elif kind is dict and tag is None:
            self.objects[number] = out = {}
            for key, item in body.items():
                out[key] = self.decode(item)
        elif tag == "dict":
            self.objects[number] = out = {}
            for key, item in body["v"]:
                key = self.decode(key)
                out[key] = self.decode(item)
        elif tag == "set":
            self.objects[number] = out = set()
            for item in body["v"]:
                out.add(self.decode(item))
        elif tag == "object":
            out = self._object(body, number)
        else:  # tuples, frozensets, pickled values: built from their parts, then registered
            self.objects[number] = out = self.decode(body)
        return out

    def _object(self, value: dict[str, Any], number: Any) -> Any:
        cls = self._class(value)
        obj = cls.__new__(cls)  # restore without __init__: the state is already built
        if number is not None:
            self.objects[number] = obj
        obj.__dict__.update(self.decode(value["v"]))
        return obj

    def _class(self, value: dict[str, Any]) -> Any:
        if self.resolve is None:
            raise ValueError(f"cannot rebuild {value.get('cls')} without the environment's classes")
        return self.resolve(value["cls"])


def decode(value: Any, resolve: Callable[[str], Any] | None = None) -> Any:
    """Inverse of ``encode``, identity included. Unpickles: call only inside the sandbox."""
    return Decoder(resolve).decode(value)


class _Budget:
    """Containers a view may still show, shared by a view and the sub-views it builds."""

    def __init__(self, left: int | None = None) -> None:
        self.left = MAX_VIEW_NODES if left is None else left


class _Viewer:
    """Shows a graph as a JSON tree: each object in full at its first place, a ``$ref`` after."""

    def __init__(self, budget: _Budget | None = None, keying: bool = False) -> None:
        self.budget = budget or _Budget()
        self.keying = keying  # shows keys: values inside keys are shown by this viewer too
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
        self.budget.left -= 1 + width if self.keying else 1
        if self.budget.left < 0:
            return {TRUNCATED: "size"}
        return None

    def sub(self, budget: _Budget) -> _Viewer:
        """A viewer of the same kind that shows keys."""
        raise NotImplementedError

    def alone(self, value: Any, nodes: int) -> Any:
        """``value`` shown on its own (a dict key, a set member's sort key) within ``nodes``
        containers. Keys inside keys share one viewer, so a cycle through them ends."""
        viewer = self if self.keying else self.sub(_Budget(nodes))
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
            return _set_key(self.show(member, None, 0))  # plain values: no container, no place
        return _set_key(self.alone(member, KEY_NODES))


class _ValueViewer(_Viewer):
    def sub(self, budget: _Budget) -> _Viewer:
        return _ValueViewer(budget, keying=True)

    def show(self, value: Any, where: Where, depth: int) -> Any:
        kind = type(value)
        if kind is str or value is None or kind is bool:
            return value
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
        sized = isinstance(value, (dict, list, tuple, set, frozenset))
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
        if isinstance(value, (list, tuple)):
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


class _EncodedViewer(_Viewer):
    def __init__(self, definitions: _Definitions, budget: _Budget | None = None, keying: bool = False) -> None:
        super().__init__(budget, keying)
        self.definitions = definitions

    def sub(self, budget: _Budget) -> _Viewer:
        return _EncodedViewer(self.definitions, budget, keying=True)

    def show(self, value: Any, where: Where, depth: int) -> Any:
        kind = type(value)
        if kind is dict:
            tag = value.get(TAG)
            if tag is not None:
                try:
                    return self.tagged(tag, value, where, depth)
                except (TypeError, ValueError, KeyError, IndexError, AttributeError):
                    return {TRUNCATED: "invalid"}  # only a corrupted store holds such a value
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
        return value

    def tagged(self, tag: Any, value: dict[str, Any], where: Where, depth: int) -> Any:
        raw: Any = value.get("v")
        if tag == "id" or tag == "ref":
            number = value.get("id")
            if type(number) is not int:
                raise ValueError(number)
            if number in self.places:
                return self.ref(number)
            if tag == "ref":
                raw = self.definitions.find(number)
                if raw is _MISSING:
                    raise ValueError(number)
            if type(raw) is dict and raw.get(TAG) in ("id", "ref"):
                raise ValueError(number)  # never written so; refused, as such chains are not counted as depth
            self.places[number] = where
            return self.show(raw, where, depth)
        if tag in ("dict", "tuple", "set", "frozenset", "object"):
            marked = self.admit(depth, len(raw))
            if marked is not None:
                return marked
            if tag == "tuple":
                return [self.show(v, (where, i), depth + 1) for i, v in enumerate(raw)]
            if tag in ("set", "frozenset"):
                return self.members(list(raw), where, depth + 1)
            out: dict[str, Any] = {}
            if tag == "object":
                out["__type__"] = str(value.get("cls", "")).rsplit(".", 1)[-1]
                if type(raw) is dict and raw.get(TAG) is None:
                    for key, item in raw.items():
                        self.field(out, key, item, where, depth + 1)
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
        if tag in ("enum", "pickle"):
            return _rebase(value.get("view"), where)
        return raw  # float, datetime, date, time, decimal: already strings


def _render(where: Where) -> str:
    keys = []
    while where is not None:
        where, key = where
        keys.append(key)
    return "".join(_pointer("", key) for key in reversed(keys))


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


def view(value: Any) -> Any:
    """The JSON view of any Python value (tool results, pickled objects): see the module docstring."""
    return _ValueViewer().show(value, None, 0)


def view_encoded(value: Any) -> Any:
    """The JSON view of encoded state, equal to ``view`` of the decoded state. Never unpickles:
    safe in the service."""
    return _EncodedViewer(_Definitions(value)).show(value, None, 0)


def key_text(viewed_key: Any) -> str:
    """JSON object keys are strings: a non-string key is shown as its JSON text."""
    return viewed_key if isinstance(viewed_key, str) else json.dumps(viewed_key, sort_keys=True)


def _bytes_view(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(raw).decode("ascii")


def encode_state(state: dict[str, Any], env_module: str | None = None) -> str:
    """Encode a state dict to compact JSON text. Raises CodecError naming the attribute."""
    encoded = encode(state, env_module)
    try:
        return json.dumps(encoded, separators=(",", ":"), ensure_ascii=False)
    except ValueError as exc:  # a backstop: encode() should have tagged anything JSON refuses
        raise CodecError(f"state cannot be written as JSON ({exc})") from exc


def diff(before: Any, after: Any, path: str = "") -> dict[str, list[dict[str, Any]]]:
    """What changed between two JSON views, as JSON pointers. Views are trees (an object shown
    twice is a ``$ref`` the second time), so a change made through an alias is reported once,
    where the object is shown in full."""
    out: dict[str, list[dict[str, Any]]] = {"added": [], "removed": [], "changed": []}
    _diff(before, after, path, out)
    return out


def _marker(shown: Any) -> bool:
    return len(shown) == 1 and (REF in shown or TRUNCATED in shown)


def _diff(before: Any, after: Any, path: str, out: dict[str, list[dict[str, Any]]]) -> None:
    # A reference (or a cut) is compared whole: a moved alias is one change, not a changed string.
    if isinstance(before, dict) and isinstance(after, dict) and not (_marker(before) or _marker(after)):
        for key, value in after.items():
            if key not in before:
                out["added"].append({"path": _pointer(path, key), "value": value})
            else:
                _diff(before[key], value, _pointer(path, key), out)
        for key, value in before.items():
            if key not in after:
                out["removed"].append({"path": _pointer(path, key), "value": value})
        return
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (old, new) in enumerate(zip(before, after, strict=True)):
            _diff(old, new, _pointer(path, i), out)
        return
    # Compare with types: 1 == True and 1 == 1.0 in Python, but not in JSON.
    if type(before) is type(after) and before == after:
        return
    out["changed"].append({"path": path, "old": before, "new": after})
