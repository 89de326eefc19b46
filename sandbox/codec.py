"""State codec: Python state <-> tagged JSON (the client's JSON view is ``sandbox.view``).

Encoded state is JSON in which values JSON cannot hold are tagged objects
``{"$ef": kind, "v": ...}``. Instances of classes from the environment's own
code are stored as their class name plus their encoded ``__dict__`` and, for a
class that also has ``__slots__`` (a pydantic v2 model keeps its fields-set, extra
and private values in slots), the slots that are set (see ``stored_attributes``);
anything else that is not JSON falls back to pickle, which only sandbox code decodes.

Object graphs round-trip exactly, as with ``deepcopy`` or pickle: an object
reached more than once (a list, dict, set, tuple, instance or pickled value
held by two attributes, or on a cycle such as a parent pointer) is written in
full once, as ``{"$ef": "id", "id": n, "v": <its encoding>}``, and everywhere
else as ``{"$ef": "ref", "id": n}``. A state in which nothing is reached twice
is written exactly as before graphs were supported, and states written then
decode unchanged. Values stored with pickle keep identity among their own
parts only.

Standard library only.
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

from sandbox.stateformat import (
    BIG_INT_BITS,
    MAX_DEPTH,
    TAG,
    pointer,
    set_key,
)
from sandbox.view import ValueViewer, view

# Values without identity of their own: equal ones are interchangeable, so they are never shared.
_IDENTITY_FREE = frozenset({dt.datetime, dt.date, dt.time, dt.timedelta, decimal.Decimal, bytes})



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
        self.path = pointer("", key) + self.path


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
        elif self._is_env_class(kind) and (stored := stored_attributes(value, kind)) is not None:
            out = _tagged("object", self._dict(stored[0]), cls=kind.__qualname__)
            if stored[1]:
                out["slots"] = self._dict(stored[1])
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
            keys = [set_key(item) for item in out]
            return [out[i] for i in sorted(range(len(out)), key=keys.__getitem__)]
        # A shared object was written in full inside this set, so the members' text depends on
        # the order they were met in. Write them again in the order of their views, which does
        # not, so that the object also comes before every reference to it.
        self._rollback(mark)
        keys = [ValueViewer().member_key(item) for item in members]
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


def slot_names(kind: type) -> tuple[str, ...]:
    """Every slot an instance of ``kind`` may hold a value in, base classes' first."""
    names: list[str] = []
    for base in reversed(kind.__mro__):
        declared = base.__dict__.get("__slots__", ())
        for name in (declared,) if isinstance(declared, str) else declared:
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return tuple(names)


def stored_attributes(value: Any, kind: type) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The ``__dict__`` and set slots an instance is stored as, or None when it must be pickled.

    It is what pickle's default protocol would carry (``copyreg.__newobj__`` with no arguments,
    then the ``(__dict__, slots)`` state), so an instance rebuilt from it by ``cls.__new__(cls)``
    and plain assignment is the instance pickled and unpickled. A class that changes that protocol
    (its own ``__reduce__``, constructor arguments, or a ``__getstate__`` returning anything but
    its attributes and slots) is pickled instead. A pydantic v2 model's ``__getstate__`` returns exactly
    those, so its models are stored as objects.
    """
    attributes = getattr(value, "__dict__", None)
    if type(attributes) is not dict:
        return None
    if not hasattr(kind, "__slots__"):
        return attributes, {}  # (written so before slots were carried; kept exactly)
    protocol: Any = kind  # (class attributes compared with object's own, which mypy reads as methods)
    if protocol.__reduce_ex__ is not object.__reduce_ex__ or protocol.__reduce__ is not object.__reduce__ \
            or hasattr(kind, "__getnewargs_ex__") or hasattr(kind, "__getnewargs__"):
        return None
    slots = {}
    for name in slot_names(kind):
        try:
            slots[name] = object.__getattribute__(value, name)
        except AttributeError:
            continue  # an unset slot: pickle leaves it unset too
    if protocol.__getstate__ is not object.__getstate__:
        state = value.__getstate__()
        if type(state) is not dict or set(state) != {"__dict__", *slots} or state["__dict__"] != attributes \
                or any(state[name] is not item and state[name] != item for name, item in slots.items()):
            return None
    return attributes, slots


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
        for name, item in self.decode(value.get("slots") or {}).items():
            object.__setattr__(obj, name, item)  # past a validating __setattr__, as the slot was set
        return obj

    def _class(self, value: dict[str, Any]) -> Any:
        if self.resolve is None:
            raise ValueError(f"cannot rebuild {value.get('cls')} without the environment's classes")
        return self.resolve(value["cls"])


def decode(value: Any, resolve: Callable[[str], Any] | None = None) -> Any:
    """Inverse of ``encode``, identity included. Unpickles: call only inside the sandbox."""
    return Decoder(resolve).decode(value)


def encode_state(state: dict[str, Any], env_module: str | None = None) -> str:
    """Encode a state dict to compact JSON text. Raises CodecError naming the attribute."""
    encoded = encode(state, env_module)
    try:
        return json.dumps(encoded, separators=(",", ":"), ensure_ascii=False)
    except ValueError as exc:  # a backstop: encode() should have tagged anything JSON refuses
        raise CodecError(f"state cannot be written as JSON ({exc})") from exc
