"""Python state -> tagged JSON: the stored form of a session's state, described in
``sandbox.state.stateformat``; ``sandbox.state.decoder`` reads it back. Standard library only.
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
from typing import Any

from sandbox.state.instances import stored_attributes
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


def encode_state(state: dict[str, Any], env_module: str | None = None, owner: Any = None) -> str:
    """Encode a state dict to compact JSON text. Raises CodecError naming the attribute."""
    encoded = encode(state, env_module, owner)
    try:
        return json.dumps(encoded, separators=(",", ":"), ensure_ascii=False)
    except ValueError as exc:  # a backstop: encode() should have tagged anything JSON refuses
        raise CodecError(f"state cannot be written as JSON ({exc})") from exc
