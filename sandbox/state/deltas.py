"""A tree state as a base plus the parts it changed (a *delta*), and the text they make together.

A delta is a map of *fields* to values. A field names a part of the state as a JSON array: an
attribute ``["name"]``, or an entry of an attribute that is a plain dict ``["name", "key"]`` (the
parts ``sandbox.state.parts`` encodes apart). Its value is a one-character tag and the part's encoded
JSON text:

- ``=text``       the part, at its place in the base
- ``+seq:text``   a part the base does not have, added after the base's parts (in ``seq`` order)
- ``*seq:text``   a part of the base that was removed and added again: it moved to the end
- ``-``           a part of the base that was removed

Together with the base these give exactly the text the whole state would encode to (the order of
a dict is its insertion order: kept parts stay in place, added ones come last). ``Delta`` keeps a
session's delta in its live process and says, for each call, which fields changed; ``compose``
makes the whole text again; ``problem`` checks a delta that came from a sandbox process, in time
that follows its size. Standard library only.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from itertools import compress
from typing import Any

from sandbox.state.parts import Part

TAGS = frozenset("=+*-")


class DeltaError(ValueError):
    """A delta that does not fit its base (it came from a forged answer)."""


def field(*path: str) -> str:
    return json.dumps(list(path), ensure_ascii=False, separators=(",", ":"))


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def entries_in_place(changes: dict[str, str]) -> dict[str, set[str] | None] | None:
    """The entries of a delta's fields when each is an entry of an attribute changed in place
    (``=``), as a watch's footprint; None for any other field (a whole attribute, an entry added,
    moved or removed, the session's randomness: the whole state is looked at then). A session
    kept against a template's state with such a delta is rebuilt from the template without its
    stored text (see ``sandbox.worker.resident``)."""
    found: dict[str, set[str] | None] = {}
    for name, value in changes.items():
        path = json.loads(name)
        if not (isinstance(path, list) and len(path) == 2 and all(type(p) is str for p in path)) \
                or value[:1] != "=":
            return None
        keys = found.setdefault(path[0], set())
        assert keys is not None
        keys.add(path[1])
    return found


class Base:
    """A base's parts as member texts (``"key":text``), made once per base: composing then joins
    texts, whatever the size of the parts nobody changed."""

    def __init__(self, text: str) -> None:
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise DeltaError("a base is a JSON object")
        self.size = len(text)
        self.members: dict[str, tuple[str, dict[str, str] | None]] = {}
        for name, value in parsed.items():
            entries = {key: f"{_dumps(key)}:{_dumps(item)}" for key, item in value.items()} \
                if isinstance(value, dict) else None
            self.members[name] = (f"{_dumps(name)}:{_dumps(value)}", entries)


def compose(base: Base, fields: dict[str, str]) -> str:
    """The whole state's text.

    Raises:
        DeltaError: a field names a part its tag says the base has and it does not (or the reverse).
    """
    top, nested = _by_attribute(fields)
    members = []
    for name, (member, entries) in base.members.items():
        change = top.get(name)
        if change is None and name in nested:
            if entries is None:
                raise DeltaError(f"entries of {name!r}, which is not a dict in the base")
            members.append(f"{_dumps(name)}:{{{_joined(entries, nested[name])}}}")
        elif change is None:
            members.append(member)
        elif change[0] == "=":
            members.append(f"{_dumps(name)}:{change[1:]}")
    for name in nested:
        if name in top or name not in base.members:
            raise DeltaError(f"entries of {name!r}, which the delta replaces or the base lacks")
    return "{" + _joined({k: v[0] for k, v in base.members.items()}, top, members) + "}"


def _joined(kept: dict[str, str], changed: dict[str, str], placed: list[str] | None = None) -> str:
    """Members in their order: those of the base (``placed`` when given, else made here from
    ``kept`` and ``changed``), then the added ones in their ``seq`` order."""
    if placed is None:
        placed = []
        for key, member in kept.items():
            value = changed.get(key)
            if value is None:
                placed.append(member)
            elif value[0] == "=":
                placed.append(f"{_dumps(key)}:{value[1:]}")
    tail = []
    for key, value in changed.items():
        tag = value[0]
        if (tag in "=-*") != (key in kept):
            raise DeltaError(f"part {key!r} tagged {tag!r} does not fit the base")
        if tag in "+*":
            seq, _, text = value[1:].partition(":")
            tail.append((int(seq), f"{_dumps(key)}:{text}"))
    tail.sort()
    return ",".join([*placed, *(member for _, member in tail)])


def _by_attribute(fields: dict[str, str]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Fields split into whole attributes and, per attribute, its entries."""
    top: dict[str, str] = {}
    nested: dict[str, dict[str, str]] = {}
    for name, value in fields.items():
        path = _path(name)
        if len(path) == 1:
            top[path[0]] = value
        else:
            nested.setdefault(path[0], {})[path[1]] = value
    return top, nested


def _path(name: str) -> list[str]:
    path = json.loads(name)
    if not (isinstance(path, list) and 1 <= len(path) <= 2 and all(type(p) is str for p in path)):
        raise DeltaError(f"field {name[:100]!r} is not an attribute or an attribute's entry")
    return path


def problem(changes: Any, limit: int) -> str | None:
    """Why a delta a sandbox process sent (``{"set": {field: value}, "unset": [field]}``) must not be
    stored, or None. Reads every field and value once: the time follows the delta, not the state."""
    if not isinstance(changes, dict) or not isinstance(changes.get("set"), dict) \
            or not isinstance(changes.get("unset"), list):
        return "a delta of the wrong shape"
    size = 0
    try:
        for name in changes["unset"]:
            if type(name) is not str:
                return "a delta of the wrong shape"
            _path(name)
            size += len(name)
        for name, value in changes["set"].items():
            _path(name)
            if type(value) is not str or not value or value[0] not in TAGS:
                return f"a delta value for {name[:100]} of the wrong shape"
            size += len(name) + len(value.encode("utf-8", "surrogatepass"))
            if size > limit:
                return f"a delta of more than {limit} bytes"
            if value == "-":
                continue
            text = value[1:]
            if value[0] in "+*":
                seq, colon, text = text.partition(":")
                if not colon or not seq.isdigit():
                    return f"a delta value for {name[:100]} without its order"
            json.loads(text)
    except (DeltaError, ValueError, RecursionError) as exc:
        return f"a delta that does not parse ({str(exc)[:200]})"
    return None


def apply(target: dict[str, Any], fields: dict[str, str], decode: Callable[[str], Any]) -> None:
    """Make ``target`` (an instance's attributes, holding the base) hold what ``compose`` of the
    base and ``fields`` reads back: each named part decoded (``decode``) and put where the text
    puts it, parts kept in place, added ones last in their order.

    Raises:
        DeltaError: a field names a part its tag says the base has and ``target`` does not.
    """
    top, nested = _by_attribute(fields)
    for name, changes in nested.items():
        if name not in top:  # (a whole attribute's text wins over its entries', as in ``compose``)
            entries = target.get(name)
            if type(entries) is not dict:
                raise DeltaError(f"entries of {name!r}, which is not a dict here")
            _apply_level(entries, changes, decode)
    _apply_level(target, top, decode)


def _apply_level(target: dict[str, Any], changes: dict[str, str], decode: Callable[[str], Any]) -> None:
    added: list[tuple[int, str, str]] = []
    for key, value in changes.items():
        tag, text = value[:1], value[1:]
        if tag == "=" or tag == "-":
            if key not in target:
                raise DeltaError(f"{key!r} is not a part of the base")
            if tag == "=":
                target[key] = decode(text)
            else:
                del target[key]
        else:
            seq, _, text = text.partition(":")
            added.append((int(seq), key, text))
    for _, key, text in sorted(added):
        target.pop(key, None)  # a part removed and added again moves to the end
        target[key] = decode(text)


class Delta:
    """A live session's delta against its base, kept in step with its ``Parts``."""

    def __init__(self, fields: dict[str, str] | None = None) -> None:
        self.fields: dict[str, str] = dict(fields or {})
        self.size = sum(len(k) + len(v) for k, v in self.fields.items())
        self.seq = max((int(v[1:].partition(":")[0]) for v in self.fields.values() if v[0] in "+*"), default=0)

    def step(self, before: dict[str, Part], after: dict[str, Part]) -> dict[str, Any] | None:
        """The fields a call changed, going from parts ``before`` to ``after`` (``Parts.update``
        keeps the part objects nobody changed), applied here too; None when the top level's
        order changed otherwise than by adding at the end (the caller sends the whole state)."""
        if not _in_order(before, after):
            return None
        changes: dict[str, str | None] = {}
        for name, part in after.items():
            old = before.get(name)
            if old is part:
                continue
            one = field(name)
            mine = self.fields.get(one)
            if old is None:
                self._add(changes, one, mine, _text(name, part))
            elif part.entries is not None and part.entries is old.entries and part.touched is not None \
                    and mine is None:
                for key in part.touched:  # changed in place (see ``Part.touched``)
                    one = field(name, key)
                    changes[one] = _keep_place(self.fields.get(one)) + _text(key, part.entries[key])
            elif old.entries is not None and part.entries is not None and mine is None \
                    and _in_order(old.entries, part.entries):
                self._entries(changes, name, old.entries, part.entries)
            else:
                self._drop_entries(changes, name)
                changes[one] = _keep_place(mine) + _text(name, part)
        for name in before.keys() - after.keys():
            self._remove(changes, field(name), self.fields.get(field(name)))
            self._drop_entries(changes, name)
        return self._apply(changes)

    def _entries(self, changes: dict[str, str | None], name: str, before: dict[str, Part],
                 after: dict[str, Part]) -> None:
        if len(after) == len(before) and list(after) == list(before):
            # Entries changed in place (the common case): the changed ones are found in C.
            for key in compress(after, map(operator.is_not, after.values(), before.values())):
                one = field(name, key)
                changes[one] = _keep_place(self.fields.get(one)) + _text(key, after[key])
            return
        for key, part in after.items():
            old = before.get(key)
            if old is part:
                continue
            one = field(name, key)
            mine = self.fields.get(one)
            if old is None:
                self._add(changes, one, mine, _text(key, part))
            else:
                changes[one] = _keep_place(mine) + _text(key, part)
        for key in before.keys() - after.keys():
            self._remove(changes, field(name, key), self.fields.get(field(name, key)))

    def _add(self, changes: dict[str, str | None], one: str, mine: str | None, text: str) -> None:
        """A part that was not there before: the base had it (removed since: '-') or not."""
        self.seq += 1
        changes[one] = f"{'*' if mine == '-' else '+'}{self.seq}:{text}"

    @staticmethod
    def _remove(changes: dict[str, str | None], one: str, mine: str | None) -> None:
        """A base's part gone leaves '-'; a part the base never had leaves nothing."""
        changes[one] = None if mine is not None and mine[0] == "+" else "-"

    def _drop_entries(self, changes: dict[str, str | None], name: str) -> None:
        prefix = field(name)[:-1] + ","
        for one in self.fields:
            if one.startswith(prefix):
                changes[one] = None

    def _apply(self, changes: dict[str, str | None]) -> dict[str, Any]:
        out: dict[str, Any] = {"set": {}, "unset": []}
        for one, value in changes.items():
            old = self.fields.pop(one, None)
            if old is not None:
                self.size -= len(one) + len(old)
            if value is None:
                if old is not None:
                    out["unset"].append(one)
                continue
            self.fields[one] = value
            self.size += len(one) + len(value)
            out["set"][one] = value
        return out


def _keep_place(mine: str | None) -> str:
    """The tag (and order) a changed part keeps: where it was, added or moved, or in its base place."""
    if mine is not None and mine[0] in "+*":
        return mine[: mine.index(":") + 1]
    return "="


def _text(key: str, part: Part) -> str:
    """A part's own text, without the key its member starts with."""
    return part.member[len(_dumps(key)) + 1:]


def _in_order(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether ``after`` kept ``before``'s order: the parts both have in the same order, new ones last."""
    if len(after) == len(before) and list(after) == list(before):
        return True  # (the common case, a change in place: compared in C)
    kept = [key for key in after if key in before]
    if kept != [key for key in before if key in after]:
        return False
    seen_new = False
    for key in after:
        if key not in before:
            seen_new = True
        elif seen_new:
            return False
    return True
