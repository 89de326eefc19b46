"""Names and bounds of the state format, shared by the codec (``sandbox.state.codec``) and the view
(``sandbox.state.view``). Standard library only: this runs inside the sandbox too."""

from __future__ import annotations

import json
from typing import Any

TAG = "$ef"
REF = "$ref"
TRUNCATED = "$truncated"
MAX_DEPTH = 200
# Below this many containers the codec writes the rest of a value as a flat block (see
# ``sandbox.state.codec``): the JSON, and the recursion that reads it, stay this shallow however deep
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
