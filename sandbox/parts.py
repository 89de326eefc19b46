"""Encoding a changed state from the parts that changed.

A state in which no object is reached twice (a tree, as most environments hold) encodes part by
part: the text of each attribute, and of each entry of an attribute that is a plain dict, is
the same alone as within the whole. ``Parts`` keeps those texts with the ``pickle`` bytes of the
values they came from, so after a call only the attributes and entries whose bytes changed are
encoded again, and the diff compares only their views. The result is the same text and the
same diff as encoding and viewing the whole state (``codec.encode_state``, ``view.diff``).

States that share objects are left to the whole-state path: there an object's text depends on
where else it is reached. Standard library only.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import gc
import json
import operator
import pickle
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

from sandbox import codec, view
from sandbox.stateformat import TAG, pointer

_PLAIN = frozenset({str, int, float, bool, type(None), dt.datetime, dt.date, dt.time, dt.timedelta,
                    decimal.Decimal, bytes})
_CONTAINERS = frozenset({dict, list, tuple, set, frozenset})


def blob(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def shares(value: Any, env_module: str) -> bool:
    """Whether any object is reached twice, as the codec counts objects (see ``codec.Encoder``).

    Walks the graph a level at a time, letting ``gc.get_referents`` list each level's children in
    C: a state of 400 KB is walked in about a millisecond."""
    seen: set[int] = set()
    level = [value]
    while level:
        ids = set(map(id, level))
        if len(ids) != len(level) or not seen.isdisjoint(ids):
            return True
        seen |= ids
        plain = [item for item in level if type(item) in _CONTAINERS]
        children = gc.get_referents(*plain) if plain else []
        for item in level:
            kind = type(item)
            if kind not in _CONTAINERS and kind.__module__ == env_module \
                    and (stored := codec.stored_attributes(item, kind)) is not None:
                children.extend(stored[0].values())
                children.extend(stored[1].values())
        # (filtered in C first: most children are strings and numbers)
        others = compress(children, map(operator.not_, map(_PLAIN.__contains__, map(type, children))))
        level = [child for child in others if _has_identity(child)]
    return False


def _has_identity(item: Any) -> bool:
    kind = type(item)
    if (kind is tuple or kind is frozenset) and not item:
        return False
    return not isinstance(item, enum.Enum) and not isinstance(item, type)


def _plain_dict(value: Any) -> bool:
    return type(value) is dict and TAG not in value and all(type(k) is str for k in value)


def _shown_key(key: str) -> str:
    return "$" + key if key[:1] == "$" else key  # as the view shows keys


@dataclass
class Part:
    blob: bytes
    member: str  # the part as a member of its object: '"key":text'
    encoded: Any
    depth: int
    entries: dict[str, Part] | None = None  # for a plain dict: each entry's part
    _shown: Any = field(default=None, repr=False)

    @property
    def shown(self) -> Any:
        if self._shown is None:
            self._shown = view.view_encoded_at(self.encoded, self.depth)
        return self._shown


class Parts:
    """The parts of a tree state's encoding, as of the last state they were made or updated from."""

    def __init__(self, env_module: str, state: dict[str, Any], encoded: dict[str, Any]) -> None:
        """From a state and its encoding (parsed); the caller knows the state is a tree."""
        self.env_module = env_module
        self.parts = {name: self._part(name, value, encoded[name], 1) for name, value in state.items()}

    def _part(self, key: str, value: Any, encoded: Any, depth: int, data: bytes | None = None) -> Part:
        part = Part(blob(value) if data is None else data, f"{_dumps(key)}:{_dumps(encoded)}", encoded, depth)
        if depth == 1 and _plain_dict(value) and isinstance(encoded, dict):
            part.entries = {k: self._part(k, item, encoded[k], 2) for k, item in value.items()}
        return part

    def _encode(self, key: str, value: Any, depth: int, data: bytes) -> Part:
        encoder = codec.Encoder(self.env_module)
        encoder.depth = depth  # the codec's depth limit counts from the root of the state
        return self._part(key, value, encoder.encode(value), depth, data)

    def _changed(self, key: str, value: Any, old: Part | None, depth: int, data: bytes, path: str,
                 diff: dict[str, list[dict[str, Any]]]) -> Part:
        """The part for a value whose bytes changed (or that is new), its change added to ``diff``."""
        try:
            part = self._encode(key, value, depth, data)
        except codec.CodecError as exc:
            exc.within(key)
            raise
        if old is None:
            diff["added"].append({"path": path, "value": part.shown})
        else:
            _compare(old.shown, part.shown, path, diff)
        return part

    def update(self, state: dict[str, Any]) -> tuple[str, dict[str, list[dict[str, Any]]]]:
        """The encoded text of ``state`` (a tree) and its diff from the previous one.

        Raises:
            codec.CodecError: a changed part cannot be encoded (nothing is updated then).
        """
        diff: dict[str, list[dict[str, Any]]] = {"added": [], "removed": [], "changed": []}
        parts: dict[str, Part] = {}
        for name, value in state.items():
            old = self.parts.get(name)
            data = blob(value)
            if old is not None and old.blob == data:
                parts[name] = old
                continue
            path = pointer("", _shown_key(name))
            if old is not None and old.entries is not None and _plain_dict(value):
                parts[name] = self._entries(name, value, old, data, path, diff)
            else:
                parts[name] = self._changed(name, value, old, 1, data, path, diff)
        for name, old in self.parts.items():
            if name not in state:
                diff["removed"].append({"path": pointer("", _shown_key(name)), "value": old.shown})
        self.parts = parts
        return _joined(parts), diff

    def _entries(self, name: str, value: dict[str, Any], old: Part, data: bytes, path: str,
                 diff: dict[str, list[dict[str, Any]]]) -> Part:
        assert old.entries is not None
        entries: dict[str, Part] = {}
        for key, item in value.items():
            before = old.entries.get(key)
            item_data = blob(item)
            if before is not None and before.blob == item_data:
                entries[key] = before
                continue
            entries[key] = self._changed(key, item, before, 2, item_data, pointer(path, _shown_key(key)), diff)
        for key, before in old.entries.items():
            if key not in value:
                diff["removed"].append({"path": pointer(path, _shown_key(key)), "value": before.shown})
        encoded = {key: part.encoded for key, part in entries.items()}
        return Part(data, f"{_dumps(name)}:{_joined(entries)}", encoded, 1, entries)


def _compare(before: Any, after: Any, path: str, diff: dict[str, list[dict[str, Any]]]) -> None:
    found = view.diff(before, after, path)
    for kind in ("added", "removed", "changed"):
        diff[kind].extend(found[kind])


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _joined(parts: dict[str, Part]) -> str:
    """A JSON object from its members' parts, written exactly as ``json.dumps`` would."""
    return "{" + ",".join([part.member for part in parts.values()]) + "}"
