"""The state after a past step, added up from what the steps recorded, with nothing run again.

Each call's step record says what it did to the state (``_state``): nothing (``same``), changed
fields of the state's delta (``parts``, with the fields it set and unset in ``_parts``, exactly as
committed), or stored a whole state (``whole``: a rebase, or a state that is not a tree). For a
session whose base is its initial state, the state after step k is that base plus the fields
the first k steps left; a fork at step k then shares the base and holds those fields, like any
session, in time and bytes that follow them, and ``GET /state?step=k`` composes them. A ``whole``
step, or a record older than these marks, leaves nothing to add up: the steps are run again
(``service.engine.rewind``). The marks are the service's own (``service.engine.steps``): clients never see them.
"""

from __future__ import annotations

import json


def fields_at(records: list[str]) -> dict[str, str] | None:
    """The delta fields the state has after ``records`` (a session's first steps), against its
    initial state; None when a step left nothing to add up."""
    fields: dict[str, str] = {}
    for text in records:
        record = json.loads(text)
        if record.get("kind", "call") != "call":
            continue  # a message to the simulated user changes no state
        kind = record.get("_state")
        if kind == "same":
            continue
        parts = record.get("_parts")
        if kind != "parts" or not isinstance(parts, dict):
            return None
        for name in parts.get("unset", []):
            fields.pop(name, None)
        fields.update(parts.get("set", {}))
    return fields
