"""Tagged JSON -> Python state: the inverse of ``sandbox.state.encoder``, object identity included.
It unpickles, so only sandbox code calls it. Standard library only.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import decimal
import pickle
import types
import zoneinfo
from collections.abc import Callable
from typing import Any

from sandbox.state.stateformat import TAG


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

