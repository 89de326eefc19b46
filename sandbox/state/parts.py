"""Encoding a changed state from the parts that changed.

A state in which no object is reached twice (a tree, as most environments hold) encodes part by
part: the text of each attribute, and of each entry of an attribute that is a plain dict, is
the same alone as within the whole. ``Parts`` keeps those texts with the ``pickle`` bytes of the
values they came from, so after a call only the attributes and entries whose bytes changed are
encoded again, and the diff compares only their views. The result is the same text and the
same diff as encoding and viewing the whole state (``sandbox.state.encoder.encode_state``, ``view.diff``).

States that share objects are left to the whole-state path: there an object's text depends on
where else it is reached. Standard library only.
"""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import enum
import gc
import json
import marshal
import operator
import pickle
import types
from itertools import compress
from typing import Any

from sandbox.state import view, watch
from sandbox.state.encoder import CodecError, Encoder
from sandbox.state.instances import stored_attributes
from sandbox.state.stateformat import FLAT_DEPTH, TAG, pointer
from sandbox.state.view import Diff, no_diff

_PLAIN = frozenset({str, int, float, bool, type(None), dt.datetime, dt.date, dt.time, dt.timedelta,
                    decimal.Decimal, bytes})
# (and the collections the codec writes as containers: they may hold what the state holds elsewhere)
_CONTAINERS = frozenset({dict, list, tuple, set, frozenset, collections.deque, collections.OrderedDict,
                         collections.defaultdict, collections.Counter})
_METHODS = frozenset({types.MethodType, types.BuiltinMethodType})
_STR = frozenset({str})
# A watched dict's entries that changed (key and bytes), its slices, whether its keys changed, and
# (when they did not) the slices holding the changed entries.
_EntryChanges = tuple[list[tuple[str, bytes]], list[bytes], bool, list[int]]


def blob(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def shares(value: Any, env_module: str) -> bool:
    """Whether any object is reached twice, as the codec counts objects (see ``sandbox.state.encoder.Encoder``).

    Walks the graph a level at a time, letting ``gc.get_referents`` list each level's children in
    C: a state of 400 KB is walked in about a millisecond. A state that reaches ``FLAT_DEPTH``
    levels counts as sharing too: the codec writes it with flat blocks, whose ids span the whole
    state, so it is encoded whole."""
    seen: set[int] = set()
    level = [value]
    depth = 0
    while level:
        ids = set(map(id, level))
        if len(ids) != len(level) or not seen.isdisjoint(ids) or depth >= FLAT_DEPTH:
            return True
        seen |= ids
        depth += 1
        plain = [item for item in level if type(item) in _CONTAINERS]
        children = gc.get_referents(*plain) if plain else []
        for item in level:
            kind = type(item)
            if kind in _CONTAINERS:
                continue
            if kind in _METHODS:
                children.append(item.__self__)  # (its function is the class's: not the state's)
            elif kind.__module__ == env_module and (stored := stored_attributes(item, kind)) is not None:
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


class Part:
    """An attribute, or an entry of an attribute that is a plain dict, and its encoding.

    A dict of entries writes its member text and its encoded value from its entries' when asked
    (a call that changed one entry of 20,000 need not join them all), and keeps its size in UTF-8
    bytes up to date from theirs."""

    __slots__ = ("key", "blob", "_member", "_encoded", "depth", "entries", "slices", "size", "_shown", "_positions",
                 "_order", "touched")

    def __init__(self, key: str, blob: bytes, member: str | None, encoded: Any, depth: int,
                 entries: dict[str, Part] | None = None, slices: list[bytes] | None = None,
                 size: int | None = None) -> None:
        self.key = key
        self.blob = blob  # pickle bytes, or marshal bytes while the parts are watched
        self._member = member  # the part as a member of its object: '"key":text'
        self._encoded = encoded
        self.depth = depth
        self.entries = entries  # for a plain dict: each entry's part
        self.slices = slices  # watched: its entries' bytes, ``watch.CHUNK`` at a time
        self.size = len(self.member.encode()) if size is None else size
        self._shown: Any = None
        self._positions: dict[str, int] | None = None
        self._order: list[str] | None = None
        # The entries a watched call changed in place: ``entries`` is then the previous part's
        # dict, updated (copying 20,000 entries would touch every page of a fresh fork).
        self.touched: list[str] | None = None

    def positions(self) -> dict[str, int]:
        """Each entry's place among the entries (kept by a part whose keys stay as they were)."""
        if self._positions is None:
            assert self.entries is not None
            self._positions = {key: n for n, key in enumerate(self.entries)}
        return self._positions

    def order(self) -> list[str]:
        """The entries' keys in their order (as ``positions``, the other way round)."""
        if self._order is None:
            assert self.entries is not None
            self._order = list(self.entries)
        return self._order

    @property
    def member(self) -> str:
        if self._member is None:
            assert self.entries is not None
            self._member = f"{_dumps(self.key)}:{_joined(self.entries)}"
        return self._member

    @property
    def encoded(self) -> Any:
        if self._encoded is None and self.entries is not None:
            self._encoded = {key: part.encoded for key, part in self.entries.items()}
        return self._encoded

    @encoded.setter
    def encoded(self, value: Any) -> None:
        self._encoded = value

    @property
    def shown(self) -> Any:
        if self._shown is None:
            self._shown = view.view_encoded_at(self.encoded, self.depth)
        return self._shown


def _entries_size(key: str, entries: dict[str, Part]) -> int:
    """The UTF-8 size of '"key":{entries}'."""
    return len(_dumps(key).encode()) + 3 + sum(part.size for part in entries.values()) + max(0, len(entries) - 1)


class Unwatched(Exception):
    """The watch cannot tell what a call changed: the caller encodes the whole state."""


class Parts:
    """The parts of a tree state's encoding, as of the last state they were made or updated from."""

    def __init__(self, env_module: str, state: dict[str, Any], encoded: dict[str, Any]) -> None:
        """From a state (the instance's attributes, as ``public_state`` lists them) and its encoding
        (parsed); the caller knows the state is a tree."""
        self.env_module = env_module
        tops = list(state.values())
        # Watched (see ``sandbox.state.watch``): plain data, each object held by its slot alone.
        self.watched = watch.held_once(tops, 2)
        del tops
        self.parts = {name: self._part(name, value, encoded[name], 1) for name, value in state.items()}

    def _blob(self, value: Any) -> bytes:
        data = watch.dumps(value) if self.watched else blob(value)
        if data is None:
            raise Unwatched
        return data

    def _part(self, key: str, value: Any, encoded: Any, depth: int, data: bytes | None = None) -> Part:
        if depth == 1 and _plain_dict(value) and isinstance(encoded, dict):
            values = list(value.values())
            blobs = (watch.entries(values) if self.watched else list(map(blob, values))) or []
            if len(blobs) != len(values):
                raise Unwatched
            entries = {k: Part(k, item_blob, f"{_dumps(k)}:{_dumps(encoded[k])}", encoded[k], 2)
                       for (k, item_blob) in zip(value, blobs, strict=True)}
            slices = watch.slices(values) if self.watched else None
            # (a watched dict's own bytes are never compared: its slices are)
            data = b"" if self.watched else (blob(value) if data is None else data)
            part = Part(key, data, f"{_dumps(key)}:{_dumps(encoded)}", encoded, depth, entries, slices)
            if self.watched:
                part.positions(), part.order()  # now, in the process that forks are made from
            return part
        return Part(key, self._blob(value) if data is None else data, f"{_dumps(key)}:{_dumps(encoded)}", encoded,
                    depth)

    def _encode(self, key: str, value: Any, depth: int, data: bytes) -> Part:
        encoder = Encoder(self.env_module)
        encoder.depth = depth  # the codec's depth limit counts from the root of the state
        encoded = encoder.encode(value)
        if encoder.blocks:  # grown past FLAT_DEPTH: its ids must be the whole state's (see ``shares``)
            raise Unwatched
        # Watched bytes are taken now: the encoding holds the state's strings and numbers too, and
        # marshal flags what has a second holder (see ``sandbox.state.watch``).
        return self._part(key, value, encoded, depth, None if self.watched else data)

    def _changed(self, key: str, value: Any, old: Part | None, depth: int, data: bytes, path: str,
                 diff: Diff) -> Part:
        """The part for a value whose bytes changed (or that is new), its change added to ``diff``."""
        try:
            part = self._encode(key, value, depth, data)
        except CodecError as exc:
            exc.within(key)
            raise
        if old is None:
            diff["added"].append({"path": path, "value": part.shown})
        else:
            _compare(old.shown, part.shown, path, diff)
        return part

    def update(self, state: dict[str, Any]) -> tuple[str, Diff]:
        """The encoded text of ``state`` (a tree) and its diff from the previous one (for parts that
        are not watched: watched ones are brought up to date by ``watch``).

        Raises:
            CodecError: a changed part cannot be encoded (nothing is updated then).
        """
        diff = no_diff()
        parts: dict[str, Part] = {}
        for name, value in state.items():
            old = self.parts.get(name)
            data = self._blob(value)
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

    def text(self) -> str:
        return _joined(self.parts)

    def part(self, key: str, value: str) -> Part:
        """A top-level part holding the string ``value`` (for a part to join the others, see
        ``LiveSession._join_hidden``)."""
        return self._part(key, value, value, 1)

    def size(self) -> int:
        """The UTF-8 size of ``text()``, from the parts' sizes."""
        return 2 + sum(part.size for part in self.parts.values()) + max(0, len(self.parts) - 1)

    def watch(self, state: dict[str, Any],
              footprint: dict[str, set[str] | None] | None = None) -> Diff | None:
        """The diff of ``state`` after a call, found from the parts whose bytes changed (see
        ``sandbox.state.watch``); None when nothing stored changed. The parts are updated: ``text()``
        is the new state's.

        Raises:
            Unwatched: the parts are not watched, or the call made the state something the
                watch cannot vouch for (an object held twice, a type it does not write).
            CodecError: a changed part cannot be encoded (nothing is updated then).
        """
        if not self.watched or list(state) != list(self.parts):
            raise Unwatched
        changes = self._changes(state, footprint)
        if not changes:
            return None
        # The objects of the parts that changed must be held once too (see ``sandbox.state.watch``).
        whole = [state[name] for name, change in changes.items() if change is None]
        if not watch.held_once(whole, 2) or not all(
                watch.held_once([state[name][key] for key, _ in change[0]], 1)
                for name, change in changes.items() if change is not None):
            raise Unwatched
        del whole
        diff = no_diff()
        parts = dict(self.parts)
        for name, change in changes.items():
            old = self.parts[name]
            if change is not None:
                parts[name] = self._watched_entries(name, state[name], old, change, diff)
                continue
            part = self._changed(name, state[name], old, 1, b"", pointer("", _shown_key(name)), diff)
            if part.entries is None and old.entries is None and part.member == old.member:
                old.blob, old.encoded = part.blob, part.encoded  # (as for an entry: see below)
                part = old
            parts[name] = part
        if all(parts[name] is self.parts[name] for name in changes):
            return None
        self.parts = parts
        return diff

    def _changes(self, state: dict[str, Any],
                 footprint: dict[str, set[str] | None] | None) -> dict[str, _EntryChanges | None]:
        """The attributes whose bytes changed, in the state's order: None for one to encode whole,
        else what changed among its entries. (A function of its own, so that no variable of it
        still holds a part when the counts are checked.)"""
        tops = list(state.values())
        if not watch.tops_held_once(tops, 2):
            raise Unwatched
        del tops
        changes: dict[str, _EntryChanges | None] = {}
        for name, value in state.items():
            old = self.parts[name]
            if footprint is not None and name not in footprint:
                continue  # the call cannot have changed it (``sandbox.state.footprint``)
            if footprint is not None and (old.entries is None or type(value) is not dict):
                raise Unwatched
            if old.entries is not None and type(value) is dict:
                keys = footprint.get(name) if footprint is not None else None
                found = _watch_entries(value, old) if keys is None else _footprint_entries(value, old, keys)
                if found[0] or found[2]:
                    changes[name] = found
                else:
                    old.slices = found[1]  # (slices may differ where only who holds a string did)
            elif (data := watch.dumps(value)) is None:
                raise Unwatched
            elif data != old.blob:
                changes[name] = None
        return changes

    def _watched_entries(self, name: str, value: dict[str, Any], old: Part, change: _EntryChanges,
                         diff: Diff) -> Part:
        assert old.entries is not None
        changed, slices, moved, chunks = change
        path = pointer("", _shown_key(name))
        updated: dict[str, Part] = {}
        for key, data in changed:
            before = old.entries.get(key)
            part = self._changed(key, value[key], before, 2, data, pointer(path, _shown_key(key)), diff)
            if before is not None and before.member == part.member:
                # The same text (only who holds a string changed): the part stays, for the delta,
                # holding what the new bytes were taken with.
                before.blob, before.encoded = part.blob, part.encoded
                continue
            updated[key] = part
        if moved:  # entries were added or removed: follow the dict's order
            for key, before in old.entries.items():
                if key not in value:
                    diff["removed"].append({"path": pointer(path, _shown_key(key)), "value": before.shown})
            entries = {key: updated.get(key) or old.entries[key] for key in value}
            return Part(name, b"", None, None, 1, entries, watch.slices(list(value.values())) or [],
                        _entries_size(name, entries))
        order = old.order()
        for chunk in chunks:  # the slices of the changed entries, again after their encoding
            # (found by key: listing every entry would touch all their pages in a fresh fork)
            keys = order[chunk * watch.CHUNK:(chunk + 1) * watch.CHUNK]
            slices[chunk] = marshal.dumps([value[key] for key in keys])
        if not updated:
            old.slices = slices
            return old
        size = old.size + sum(part.size - old.entries[key].size for key, part in updated.items())
        # In place: the same keys in the same places. (What the old part held is handed on, not
        # let go: in a fresh fork, freeing its encoding would touch every page the state is on.)
        old.entries.update(updated)
        part = Part(name, b"", None, old._encoded, 1, old.entries, slices, size)
        if old._encoded is not None:
            old._encoded.update((key, entry.encoded) for key, entry in updated.items())
        part._positions, part._order, part.touched = old._positions, old._order, list(updated)
        return part

    def _entries(self, name: str, value: dict[str, Any], old: Part, data: bytes, path: str,
                 diff: Diff) -> Part:
        assert old.entries is not None
        entries: dict[str, Part] = {}
        for key, item in value.items():
            before = old.entries.get(key)
            item_data = self._blob(item)
            if before is not None and before.blob == item_data:
                entries[key] = before
                continue
            entries[key] = self._changed(key, item, before, 2, item_data, pointer(path, _shown_key(key)), diff)
        for key, before in old.entries.items():
            if key not in value:
                diff["removed"].append({"path": pointer(path, _shown_key(key)), "value": before.shown})
        return Part(name, data, None, None, 1, entries, None, _entries_size(name, entries))


def _footprint_entries(value: dict[str, Any], old: Part, keys: set[str]) -> _EntryChanges:
    """As ``_watch_entries``, for a call proven to change no entry but ``keys`` (and to delete
    none): only those are looked at, unless one was added."""
    assert old.entries is not None and old.slices is not None
    if len(value) != len(old.entries) or any(key not in old.entries and key in value for key in keys):
        return _watch_entries(value, old)
    changed: list[tuple[str, bytes]] = []
    chunks: set[int] = set()
    for key in keys:
        if key not in value:
            continue
        if not watch.held_once([value[key]], 1):
            raise Unwatched
        data = watch.dumps(value[key])
        if data is None:
            raise Unwatched
        if data != old.entries[key].blob:
            changed.append((key, data))
            chunks.add(old.positions()[key] // watch.CHUNK)
    return changed, old.slices, False, sorted(chunks)  # (updated in place, once all is checked)


def _watch_entries(value: dict[str, Any], old: Part) -> _EntryChanges:
    """The entries of a watched dict whose bytes changed (or that are new), with their bytes; the
    dict's slices; and whether its keys changed (entries added, removed or moved).

    Raises:
        Unwatched: an entry is held twice, or holds what the watch does not write.
    """
    assert old.entries is not None and old.slices is not None
    if TAG in value or not _STR.issuperset(map(type, value)):
        raise Unwatched
    values = list(value.values())
    if not watch.tops_held_once(values, 1):
        raise Unwatched
    keys = list(value)
    slices = watch.slices(values)
    if slices is None:
        raise Unwatched
    changed: list[tuple[str, bytes]] = []
    chunks: list[int] = []
    if len(keys) == len(old.entries) and keys == list(old.entries):
        for index in compress(range(len(slices)), map(operator.ne, slices, old.slices)):
            start = index * watch.CHUNK
            found = len(changed)
            for key, item in zip(keys[start:start + watch.CHUNK], values[start:start + watch.CHUNK], strict=True):
                data = watch.dumps(item)
                if data is None:
                    raise Unwatched
                if data != old.entries[key].blob:
                    changed.append((key, data))
            if len(changed) > found:
                chunks.append(index)
        return changed, slices, False, chunks
    blobs = watch.entries(values)
    if blobs is None:
        raise Unwatched
    for key, data in zip(keys, blobs, strict=True):
        before = old.entries.get(key)
        if before is None or before.blob != data:
            changed.append((key, data))
    return changed, slices, True, []


def _compare(before: Any, after: Any, path: str, diff: Diff) -> None:
    found = view.diff(before, after, path)
    for kind in ("added", "removed", "changed"):
        diff[kind].extend(found[kind])


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _joined(parts: dict[str, Part]) -> str:
    """A JSON object from its members' parts, written exactly as ``json.dumps`` would."""
    return "{" + ",".join([part.member for part in parts.values()]) + "}"
