"""State codec: Python state <-> tagged JSON (the client's JSON view is ``sandbox.state.view``).

Encoded state is JSON in which values JSON cannot hold are tagged objects
``{"$ef": kind, "v": ...}``. Instances of classes from the environment's own
code are stored as their class name plus their encoded ``__dict__`` and, for a
class that also has ``__slots__`` (a pydantic v2 model keeps its fields-set, extra
and private values in slots), the slots that are set (see ``stored_attributes``);
anything else that is not JSON falls back to pickle, which only sandbox code decodes.

A state rebuilt from its encoding is the state ``pickle.loads(pickle.dumps(state))`` would give,
and the stored form carries what that keeps:

- order: a dict's, and a set's or frozenset's iteration order (members are written in it and
  added back in it, as pickle does);
- time zones: an aware datetime or time keeps a ``ZoneInfo`` by its key (``zone``) and a
  ``datetime.timezone`` by its offset and, if it was given one, its name (``tzname``); ``fold``
  is kept. Other tzinfo classes are pickled;
- the collections ``deque`` (with its ``maxlen``), ``OrderedDict``, ``defaultdict`` (with its
  ``default_factory``) and ``Counter``, written as containers of the graph, not pickled apart;
- the environment instance itself (``owner``): a reference to it anywhere in its own state is
  ``{"$ef": "self"}`` and decodes to the instance being rebuilt;
- bound methods (``self.handlers = {"add": self._add}``): ``{"$ef": "method", "v": <its
  __self__>, "name": ...}``, rebound to the rebuilt object, not to a pickled copy of it.

Object graphs round-trip exactly, as with ``deepcopy`` or pickle: an object
reached more than once (a container, instance, method or pickled value
held by two attributes, or on a cycle such as a parent pointer) is written in
full once, as ``{"$ef": "id", "id": n, "v": <its encoding>}``, and everywhere
else as ``{"$ef": "ref", "id": n}``. A state in which nothing is reached twice
is written exactly as before graphs were supported, and states written then
decode unchanged. Values stored with pickle keep identity among their own
parts only.

Depth has no limit, yet the JSON never nests deeply (JSON parsers, and recursive code, have a
stack): below ``FLAT_DEPTH`` containers the rest of a value is written as a *flat block*,
``{"$ef": "flat", "v": [{"$ef": "id", "id": n, "v": <body>}, ...]}``, one entry per object, each
body holding its objects as references. The block stands for its first entry's object. Both
directions walk a block with a loop, so a linked list of 100,000 nodes is fine.

Tags added since the format's first version (``self``, ``method``, ``flat``, ``deque``,
``odict``, ``defaultdict``, ``counter``, and the ``zone``/``tzname``/``fold`` fields) are
additive: older states never hold them and decode as they always did.

Standard library only.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import decimal
import enum
import json
import math
import pickle
import types
import zoneinfo
from collections.abc import Callable
from typing import Any

from sandbox.state.stateformat import (
    BIG_INT_BITS,
    FLAT_DEPTH,
    TAG,
    pointer,
)
from sandbox.state.view import bound_method, method_view, view

# Values without identity of their own: equal ones are interchangeable, so they are never shared.
_IDENTITY_FREE = frozenset({dt.datetime, dt.date, dt.time, dt.timedelta, decimal.Decimal, bytes})
# Values rebuilt only once their parts are: a shared one gets its id after them (see ``_immutable``).
_IMMUTABLE = frozenset({tuple, frozenset, types.MethodType, types.BuiltinMethodType})
# Builtin containers: an environment's subclass of one is pickled, not stored by its attributes.
_BUILTIN_CONTAINERS = (dict, list, set, frozenset, tuple, bytearray, collections.deque)
# Collections written as containers of the graph, by exact type (a subclass is pickled, as before).
_COLLECTIONS: dict[type, str] = {collections.deque: "deque", collections.OrderedDict: "odict",
                collections.defaultdict: "defaultdict", collections.Counter: "counter"}


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


def _scalar(value: Any, kind: type) -> dict[str, Any] | None:
    """A value without identity, tagged; None for an aware datetime or time whose tzinfo is
    neither a ``ZoneInfo`` nor a ``datetime.timezone`` (it is pickled)."""
    if kind is dt.datetime or kind is dt.time:
        out = _tagged(kind.__name__, value.isoformat())
        if value.tzinfo is not None and not _zoned(out, value.tzinfo):
            return None
        if value.fold:
            out["fold"] = 1  # (isoformat leaves it out: the second 01:30 of a DST change)
        return out
    if kind is dt.date:
        return _tagged("date", value.isoformat())
    if kind is dt.timedelta:
        return _tagged("timedelta", [value.days, value.seconds, value.microseconds])
    if kind is decimal.Decimal:
        return _tagged("decimal", str(value))
    return _tagged("bytes", base64.b64encode(value).decode("ascii"))


def _zoned(out: dict[str, Any], zone: Any) -> bool:
    """Add what the isoformat's offset leaves out of ``zone``: a named zone's key (its offsets
    after arithmetic follow its rules), a fixed zone's name. False for a zone that cannot be."""
    kind = type(zone)
    if kind is dt.timezone:
        arguments = zone.__getinitargs__()  # (offset,) or (offset, name): the name only if given
        if len(arguments) == 2:
            out["tzname"] = arguments[1]
        return True
    if kind is zoneinfo.ZoneInfo and type(zone.key) is str:
        try:
            cached = zoneinfo.ZoneInfo(zone.key)
        except (ValueError, OSError):
            return False
        if cached is zone:  # (one made with no_cache, or from a file, is pickled: pickle keeps that)
            out["zone"] = zone.key
            return True
    return False


def _method_name(value: Any) -> str | None:
    """The attribute that gives ``value`` back from its ``__self__``, as pickle looks it up, with a
    private (mangled) name found too; None when no attribute does."""
    name: str = value.__name__
    owner = value.__self__
    names = [name]
    if name.startswith("__") and not name.endswith("__"):
        home = value.__qualname__.rpartition(".")[0].rpartition(".")[2].lstrip("_")
        names.append(f"_{home}{name}")
    for candidate in names:
        try:
            if getattr(owner, candidate) == value:
                return candidate
        except Exception:
            continue
    return None


class Encoder:
    """Encode values; ``env_module`` names the module whose classes are stored by name, ``owner``
    is the environment instance whose state this is (written as ``{"$ef": "self"}``).

    Encoding is one walk when nothing is reached twice. Otherwise a second walk writes the objects
    the first one met more than once (``shared``) with an id where they first appear and as
    references after that.
    """

    def __init__(self, env_module: str | None = None, shared: frozenset[int] | None = None,
                 owner: Any = None) -> None:
        self.env_module = env_module
        self.shared = shared
        self.owner = owner
        self.seen: dict[int, Any] = {}  # first walk: every object with identity, kept alive
        self.repeated: set[int] = set()  # first walk: those met again
        self.ids: dict[int, int] = {}  # second walk: objects already written in full
        self.written: list[int] = []  # second walk: the same, in order (ids are positions + 1)
        self.building = 0  # second walk: shared tuples and frozensets being written
        self.depth = 0
        self.queue: list[tuple[Any, type, int]] | None = None  # while a flat block is written
        self.blocks = 0  # flat blocks written

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
                scalar = _scalar(value, kind)
                return self._pickled(value, kind) if scalar is None else scalar
            if value is self.owner and value is not None:
                return self._self()
            if (kind is tuple or kind is frozenset) and not value:
                return _tagged(kind.__name__, [])  # singletons in CPython: sharing them means nothing
            if isinstance(value, enum.Enum):  # members are singletons, rebuilt by name
                if self._is_env_class(kind):
                    return _tagged("enum", value.name, cls=kind.__qualname__, view=view(value))
                return self._pickled(value, kind)
            if isinstance(value, type):  # classes are pickled by name: nothing of theirs is stored
                return self._pickled(value, kind)
        marker = id(value)
        if self.depth >= FLAT_DEPTH:
            return self._flat(value, kind, marker)
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
        if kind in _IMMUTABLE:
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

    def _flat(self, value: Any, kind: type, marker: int) -> Any:
        """``value``, met ``FLAT_DEPTH`` containers deep, as a flat block: its objects are listed
        one after the other, each with an id, and hold each other as references. Written by a
        loop: the depth of the graph costs no stack."""
        if self.queue is not None:  # inside a block: the object is listed, this is a reference
            return self._listed(value, kind, marker)
        if self.shared is None and marker in self.seen:
            self.repeated.add(marker)
            return None
        if self.shared is not None and marker in self.ids:
            return {TAG: "ref", "id": self.ids[marker]}
        queue: list[tuple[Any, type, int]] = []
        self.queue = queue
        entries: list[dict[str, Any]] = []
        try:
            self._listed(value, kind, marker)
            while queue:
                item, item_kind, number = queue.pop()
                entries.append({TAG: "id", "id": number, "v": self._body(item, item_kind)})
        finally:
            self.queue = None
        self.blocks += 1
        return _tagged("flat", entries)

    def _listed(self, value: Any, kind: type, marker: int) -> Any:
        """An object met inside a flat block: listed once (with an id), a reference everywhere."""
        assert self.queue is not None
        if self.shared is None:  # (numbered too: with nothing met twice, the first walk's output is kept)
            if marker in self.seen:
                self.repeated.add(marker)
                return None
            self.seen[marker] = value
        number = self.ids.get(marker)
        if number is None:
            number = self._number(marker)
            self.queue.append((value, kind, number))
        return {TAG: "ref", "id": number}

    def _body(self, value: Any, kind: type) -> Any:
        self.depth += 1
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
            out = _tagged(kind.__name__, self._members(value))
        elif kind in _COLLECTIONS:
            out = self._collection(value, kind)
        elif (kind is types.MethodType or kind is types.BuiltinMethodType) and bound_method(value) \
                and (name := _method_name(value)) is not None:
            out = self._method(value, name, self.encode(value.__self__))
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
        return _tagged("dict", self._pairs(value))

    def _pairs(self, value: dict[Any, Any]) -> list[list[Any]]:
        pairs = []
        encode = self.encode
        for key, item in value.items():
            encoded_key = encode(key)
            try:
                pairs.append([encoded_key, encode(item)])
            except CodecError as exc:
                exc.within(key)
                raise
        return pairs

    def _collection(self, value: Any, kind: type) -> dict[str, Any]:
        tag = _COLLECTIONS[kind]
        if tag == "deque":
            out = _tagged(tag, self._items(value, None))
            if value.maxlen is not None:
                out["maxlen"] = value.maxlen
            return out
        if tag == "defaultdict":
            factory = self.encode(value.default_factory)  # first: it is rebuilt before the items
            return _tagged(tag, self._pairs(value), factory=factory)
        return _tagged(tag, self._pairs(value))

    def _self(self) -> dict[str, Any]:
        """The environment instance, with its class: a decoder without the instance makes one."""
        kind = type(self.owner)
        return {TAG: "self", "cls": kind.__qualname__} if self._is_env_class(kind) else {TAG: "self"}

    @staticmethod
    def _method(value: Any, name: str, target: Any) -> dict[str, Any]:
        return _tagged("method", target, name=name, view=method_view(value))

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

    def _members(self, members: Any, watch: int | None = None) -> list[Any]:
        """A set's members in its iteration order (pickle's: adding them back in it gives the
        order again). Stops early like ``_items`` for ``watch``."""
        out = []
        for item in members:
            out.append(self.encode(item))
            if watch is not None and watch in self.ids:
                break
        return out

    def _immutable(self, value: Any, kind: type, marker: int) -> dict[str, Any]:
        """A shared tuple, frozenset or method: it can only be rebuilt once its items are (a
        method's item is its ``__self__``), so its id is given after them. If a cycle through its
        items wrote it meanwhile, this occurrence is a reference that keeps the items written on
        the way (the decoder needs their ids)."""
        name = None
        if kind is types.MethodType or kind is types.BuiltinMethodType:
            name = _method_name(value) if bound_method(value) else None
            if name is None:
                return self._pickled(value, kind)  # a value of its own
        self.depth += 1
        self.building += 1
        if kind is frozenset:
            items = self._members(value, marker)
        else:
            items = self._items(value if kind is tuple else (value.__self__,), marker)
        self.building -= 1
        self.depth -= 1
        number = self.ids.get(marker)
        if number is not None:
            return {TAG: "ref", "id": number, "v": items}
        number = self._number(marker)
        body = _tagged(kind.__name__, items) if name is None else self._method(value, name, items[0])
        return {TAG: "id", "id": number, "v": body}

    def _pickled(self, value: Any, kind: type) -> dict[str, Any]:
        try:
            blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise CodecError(f"{kind.__name__} value cannot be serialized ({exc})") from exc
        return _tagged("pickle", base64.b64encode(blob).decode("ascii"), view=view(value))

    def _is_env_class(self, kind: type) -> bool:
        return self.env_module is not None and kind.__module__ == self.env_module


def encode(value: Any, env_module: str | None = None, owner: Any = None) -> Any:
    """The tagged-JSON form of ``value``; ``owner``, the environment instance, is written as
    ``{"$ef": "self"}`` wherever the value reaches it. Raises CodecError with a pointer to what
    cannot be encoded."""
    first = Encoder(env_module, owner=owner)
    encoded = first.encode(value)
    if not first.repeated:
        return encoded
    return Encoder(env_module, frozenset(first.repeated), owner).encode(value)


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
    if type(attributes) is not dict or (len(kind.__mro__) > 2 and issubclass(kind, _BUILTIN_CONTAINERS)):
        return None  # (a subclass of dict or list holds items its attributes do not: pickle keeps both)
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
    """Inverse of ``Encoder``; ``resolve`` finds the environment's classes by qualified name, and
    ``{"$ef": "self"}`` decodes to ``owner``."""

    def __init__(self, resolve: Callable[[str], Any] | None = None, owner: Any = None) -> None:
        self.resolve = resolve
        self.owner = owner
        self.objects: dict[Any, Any] = {}
        self.pending: dict[Any, Any] = {}  # a flat block's immutable objects not built yet
        self.classes: dict[str, Any] = {}

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
            return self._object_of(value.get("id"))
        if kind == "object":
            obj = self._shell(kind, value)
            self._fill(obj, kind, value)
            return obj
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
            return self._aware(dt.datetime.fromisoformat(raw), value)
        if kind == "date":
            return dt.date.fromisoformat(raw)
        if kind == "time":
            return self._aware(dt.time.fromisoformat(raw), value)
        if kind == "timedelta":
            return dt.timedelta(days=raw[0], seconds=raw[1], microseconds=raw[2])
        if kind == "decimal":
            return decimal.Decimal(raw)
        if kind == "bytes":
            return base64.b64decode(raw)
        if kind == "enum":
            return self._class(value)[raw]
        if kind == "pickle":
            return pickle.loads(base64.b64decode(raw))
        if kind == "self":
            if self.owner is None:  # no instance given: one is made, and filled with the state decoded
                cls = self._class(value) if self.resolve is not None and "cls" in value else None
                self.owner = types.SimpleNamespace() if cls is None else cls.__new__(cls)
            return self.owner
        if kind == "method":
            return getattr(self.decode(raw), value["name"])
        if kind == "flat":
            return self._flat(raw)
        shell = self._shell(kind, value)
        if shell is None:
            raise ValueError(f"unknown tag {kind!r}")
        self._fill(shell, kind, value)
        return shell

    @staticmethod
    def _aware(moment: Any, value: dict[str, Any]) -> Any:
        if "zone" in value:
            moment = moment.replace(tzinfo=zoneinfo.ZoneInfo(value["zone"]))  # the same wall time
        elif "tzname" in value:
            moment = moment.replace(tzinfo=dt.timezone(moment.utcoffset(), value["tzname"]))
        if value.get("fold"):
            moment = moment.replace(fold=1)
        return moment

    def _object_of(self, number: Any) -> Any:
        try:
            return self.objects[number]
        except KeyError:
            if number in self.pending:
                return self._build(number)
        except TypeError:
            pass
        raise ValueError(f"reference to an object never written: {number!r}")

    def _shell(self, tag: Any, body: Any) -> Any:
        """An empty object for a mutable body (``tag``: its tag, None for JSON's own list and
        object), that references can reach before it is filled; None for any other body."""
        if tag is None:
            kind = type(body)
            return [] if kind is list else {} if kind is dict else None
        if tag == "object":
            cls = self._class(body)
            return cls.__new__(cls)  # restore without __init__: the state is already built
        if tag == "dict":
            return {}
        if tag == "set":
            return set()
        if tag == "deque":
            return collections.deque(maxlen=body.get("maxlen"))
        if tag == "odict":
            return collections.OrderedDict()
        if tag == "defaultdict":
            return collections.defaultdict()
        if tag == "counter":
            return collections.Counter()
        return None

    def _fill(self, shell: Any, tag: Any, body: Any) -> None:
        decode = self.decode
        if tag is None:
            if type(shell) is list:
                for item in body:
                    shell.append(decode(item))
            else:
                for key, item in body.items():
                    shell[key] = decode(item)
            return
        raw = body["v"]
        if tag == "object":
            shell.__dict__.update(decode(raw))
            slots = body.get("slots")
            if slots:
                for name, item in decode(slots).items():
                    object.__setattr__(shell, name, item)  # past a validating __setattr__, as the slot was set
        elif tag == "set":
            for item in raw:
                shell.add(decode(item))
        elif tag == "deque":
            for item in raw:
                shell.append(decode(item))
        else:
            if tag == "defaultdict":
                shell.default_factory = decode(body.get("factory"))
            for key, item in raw:
                key = decode(key)
                shell[key] = decode(item)

    def _define(self, number: Any, body: Any) -> Any:
        """An object written with an id: mutable ones are registered before their contents are
        decoded, so references inside them (cycles) find them."""
        tag = body.get(TAG) if type(body) is dict else None
        shell = self._shell(tag, body)
        if shell is None:  # tuples, frozensets, methods, pickled values: built from their parts, then registered
            self.objects[number] = out = self.decode(body)
            return out
        self.objects[number] = shell
        self._fill(shell, tag, body)
        return shell

    def _flat(self, entries: list[Any]) -> Any:
        """A flat block: every mutable object is made empty first, so that any entry may
        reference any other; then they are filled, last listed first (an object's parts are
        listed after it: keys and members are then filled before the dicts and sets that hash
        them), and the immutable ones are built when first needed (see ``_build``)."""
        if type(entries) is not list or not entries or any(type(entry) is not dict for entry in entries):
            raise ValueError("a flat block that is not a list of objects")
        listed = []
        for entry in entries:
            number, body = entry["id"], entry["v"]
            if entry.get(TAG) != "id" or number in self.objects or number in self.pending:
                raise ValueError(f"a flat block entry that is not a new object: {number!r}")
            tag = body.get(TAG) if type(body) is dict else None
            shell = self._shell(tag, body)
            if shell is None:
                self.pending[number] = body
            else:
                self.objects[number] = shell
                listed.append((shell, tag, body))
        for shell, tag, body in reversed(listed):
            self._fill(shell, tag, body)
        for entry in entries:
            if entry["id"] in self.pending:
                self._build(entry["id"])
        return self.objects[entries[0]["id"]]

    def _build(self, number: Any) -> Any:
        """A flat block's immutable object, once the ones it references are built: with a stack,
        not recursion (a chain of nested tuples may be long). Immutable objects cannot form a
        cycle among themselves; a block in which they do is refused."""
        stack = [number]
        waiting = set()
        while stack:
            top = stack[-1]
            if top in self.objects:
                stack.pop()
                continue
            missing = [n for n in _references(self.pending[top]) if n not in self.objects]
            for needed in missing:
                if needed not in self.pending or needed in waiting:
                    raise ValueError(f"reference to an object never written: {needed!r}")
            if missing and top not in waiting:
                waiting.add(top)
                stack.extend(missing)
                continue
            if missing:
                raise ValueError(f"reference to an object never written: {missing[0]!r}")
            self.objects[top] = self.decode(self.pending.pop(top))
            waiting.discard(top)
            stack.pop()
        return self.objects[number]

    def _class(self, value: dict[str, Any]) -> Any:
        if self.resolve is None:
            raise ValueError(f"cannot rebuild {value.get('cls')} without the environment's classes")
        name = value["cls"]
        cls = self.classes.get(name)
        if cls is None:
            cls = self.classes[name] = self.resolve(name)
        return cls


def _references(body: Any) -> list[Any]:
    """The ids a flat block's entry references (walked with a stack: the entry is untrusted)."""
    found = []
    stack = [body]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            if node.get(TAG) == "ref":
                found.append(node.get("id"))
            stack.extend(node.values())
        elif type(node) is list:
            stack.extend(node)
    return found


def decode(value: Any, resolve: Callable[[str], Any] | None = None, owner: Any = None) -> Any:
    """Inverse of ``encode``, identity included. Unpickles: call only inside the sandbox.

    ``owner`` is the environment instance being rebuilt (the caller fills its ``__dict__`` with
    what this returns). Without one (a check reads the state as a dict), a reference to it
    decodes to an instance of its class made here, holding the decoded state's attributes."""
    decoder = Decoder(resolve, owner)
    out = decoder.decode(value)
    if owner is None and decoder.owner is not None and type(out) is dict:
        decoder.owner.__dict__.update(out)
    return out


def encode_state(state: dict[str, Any], env_module: str | None = None, owner: Any = None) -> str:
    """Encode a state dict to compact JSON text. Raises CodecError naming the attribute."""
    encoded = encode(state, env_module, owner)
    try:
        return json.dumps(encoded, separators=(",", ":"), ensure_ascii=False)
    except ValueError as exc:  # a backstop: encode() should have tagged anything JSON refuses
        raise CodecError(f"state cannot be written as JSON ({exc})") from exc
