"""Telling which parts of a tree state a call changed, without walking the parts it did not.

``pickle`` of a whole 3 MB state takes 15–30 ms and a walk of its graph 45 ms; ``marshal``
writes the same data in 6 ms, and writes it in slices of entries almost as fast, so the parts a
call changed are found by comparing slice bytes, then entry bytes within the slices that differ.

Bytes alone would miss two changes: a value of another type with the same bytes, and an object
now reached twice. The first cannot happen in a *watched* state, which holds only ``str``,
``int``, ``float``, ``bool``, ``None`` and the builtin containers (``marshal`` writes those
exactly, refuses subclasses, and would write a ``bytearray`` as ``bytes``: there are none to
confuse). The second is ruled out by reference counts. ``marshal`` flags every object it writes
that has more than one reference; when a state is first watched, every object with identity
is checked to have exactly one (the slot holding it), so its parts' bytes carry no flag on any
of them. A part whose bytes are unchanged therefore still holds each of its objects once, and
the objects of the parts that changed, and the top object of every part (which the slice
itself holds), are checked by count again. An extra reference anywhere (a tool keeping one in a
module) makes the watch say it cannot tell, and the caller falls back to walking the whole
state.

CPython only, like the rest of the sandbox. Standard library only.
"""

from __future__ import annotations

import gc
import marshal
import operator
import sys
from itertools import compress, repeat
from typing import Any

CHUNK = 64  # entries per slice: the bytes compared for a call that changed nothing
LEAVES = frozenset({str, int, float, bool, type(None)})
CONTAINERS = frozenset({dict, list, tuple, set, frozenset})
# A reference count seen through ``map(sys.getrefcount, level)`` counts the list and the call too.
_SEEN_BY_COUNT = 2


def dumps(value: Any) -> bytes | None:
    """``marshal`` bytes of a value (None when it holds something marshal does not write)."""
    try:
        return marshal.dumps(value)
    except ValueError:
        return None


def slices(values: list[Any]) -> list[bytes] | None:
    """The bytes of ``values`` a slice of ``CHUNK`` at a time."""
    try:
        return list(map(marshal.dumps, map(values.__getitem__, _ranges(len(values)))))
    except ValueError:
        return None


def entries(values: list[Any]) -> list[bytes] | None:
    try:
        return list(map(marshal.dumps, values))
    except ValueError:
        return None


def _ranges(size: int) -> list[slice]:
    return [slice(start, start + CHUNK) for start in range(0, size, CHUNK)]


def held_once(tops: list[Any], parents: int) -> bool:
    """Whether every object with identity in ``tops`` and below is reached once and held only
    by its slot (``parents`` slots for each of ``tops``: an attribute is held by the instance and
    the state mapping), and nothing but watched types is met.

    A level at a time, with the children and the counts listed in C (see ``parts.shares``)."""
    seen: set[int] = set()
    level = _identities(tops)
    expected = parents + 1 + _SEEN_BY_COUNT  # the caller's list holds the tops too
    while level:
        if not CONTAINERS.issuperset(map(type, level)):
            return False
        ids = set(map(id, level))
        if len(ids) != len(level) or not seen.isdisjoint(ids):
            return False
        seen |= ids
        if any(map(operator.ne, map(sys.getrefcount, level), repeat(expected))) or not _flat_sets(level):
            return False
        level = _identities(gc.get_referents(*level))
        expected = 1 + _SEEN_BY_COUNT
    return True


def _identities(items: list[Any]) -> list[Any]:
    """The objects with identity among ``items``: what is not a leaf or an empty singleton."""
    found = list(compress(items, map(operator.not_, map(LEAVES.__contains__, map(type, items)))))
    kinds = set(map(type, found))
    return [item for item in found if not _empty(item)] if tuple in kinds or frozenset in kinds else found


def tops_held_once(values: list[Any], parents: int) -> bool:
    """Whether each of ``values`` (listed by the caller) is held by ``parents`` slots alone."""
    counts = map(sys.getrefcount, compress(values, map(operator.not_, map(LEAVES.__contains__, map(type, values)))))
    return not any(map(operator.ne, counts, repeat(parents + _SEEN_BY_COUNT)))


def _empty(item: Any) -> bool:
    # The empty tuple and frozenset are singletons: held everywhere, and sharing them means nothing.
    return (type(item) is tuple or type(item) is frozenset) and not item


def _flat_sets(level: list[Any]) -> bool:
    """Sets may hold only leaves: ``marshal`` holds a set's members by an extra reference while it
    writes them, so a member's flag would say nothing about its other holders."""
    for item in level:
        if (type(item) is set or type(item) is frozenset) and not LEAVES.issuperset(map(type, item)):
            return False
    return True
