"""What of an environment's instance is stored: its ``__dict__`` and the slots that are set, as
pickle's default protocol carries them (see ``stored_attributes``). Standard library only.
"""

from __future__ import annotations

import collections
from typing import Any

# Builtin containers: an environment's subclass of one is pickled, not stored by its attributes.
_BUILTIN_CONTAINERS = (dict, list, set, frozenset, tuple, bytearray, collections.deque)


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

