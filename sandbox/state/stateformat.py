"""The state format: Python state <-> tagged JSON (the client's JSON view is ``sandbox.state.view``).

Encoded state is JSON in which values JSON cannot hold are tagged objects
``{"$ef": kind, "v": ...}``. Instances of classes from the environment's own
code are stored as their class name plus their encoded ``__dict__`` and, for a
class that also has ``__slots__`` (a pydantic v2 model keeps its fields-set, extra
and private values in slots), the slots that are set (see ``sandbox.state.instances``);
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

This module holds the format's names and bounds, shared by the encoder (``sandbox.state.encoder``),
the decoder (``sandbox.state.decoder``) and the view. Standard library only: this runs inside the
sandbox too.
"""

from __future__ import annotations

import json
from typing import Any

TAG = "$ef"
REF = "$ref"
TRUNCATED = "$truncated"
MAX_DEPTH = 200
# Below this many containers the codec writes the rest of a value as a flat block (see
# ``sandbox.state.encoder``): the JSON, and the recursion that reads it, stay this shallow however deep
# the state's graph goes.
FLAT_DEPTH = 64
# Far more containers than a state under the size limit holds: the bound only stops runaway views.
MAX_VIEW_NODES = 1 << 22
# A set member's sort key is its view cut after this many containers and items: members linked into a
# large graph (a parent pointer) must not each cost a walk of the whole graph.
KEY_NODES = 256
MAX_KEY_NODES = 10_000  # a dict key's view (keys are hashable: tuples, frozensets, frozen objects)
BIG_INT_BITS = 4000  # about 1200 decimal digits, well under the 4300-digit conversion limit
# A view's place for an object: None at the root, else (parent place, key in the view).
Where = tuple[Any, Any] | None


def pointer(path: str, key: Any) -> str:
    return f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"


def set_key(item: Any) -> str:
    return json.dumps(item, sort_keys=True)
