"""Calls of sessions a full worker has no room to keep live.

Once a worker's live sessions fill the memory it may give them (or ``max_residents``), a call
that must rebuild its session does not end another session's process to make room for its own:
it goes to its environment's *transit* process, a fork of the environment's host kept for the
purpose, which builds the instance from the stored state the call brings, runs the call, answers
as a rebuilt session's process would, and drops the instance. The next such call, of any session
of the same environment and tenant, reuses the process: no fork, no exit, no eviction.

What a call leaves behind in that process is what the environment keeps outside its instances,
which registration refuses (``state_outside_instance``); randomness is set from each call's own
stored stream (``randomness.Stream.begin``). A transit process serves the sessions of one tenant
only (the request's ``scope``), so code that keeps data across calls on purpose reaches nothing
of another tenant's. It ends like a live session when a call fails in a way that may have
changed it (the tool raised, timed out, ran out of memory or printed too much).

Standard library only.
"""

from __future__ import annotations

import types
from typing import Any

from sandbox.state.readonly import ReadOnly
from sandbox.wire.answers import TRANSIT
from sandbox.worker.resident import LiveSession

# The request field that asks a host's fork to serve as a transit process, and the prefix of the
# key the worker keeps one under among its live sessions (no session id holds a NUL).
FLAG = TRANSIT
PREFIX = "\x00transit\x00"


def key(scope: str, env: str) -> str:
    """Where a worker keeps the transit process of ``env`` for tenant ``scope``."""
    return f"{PREFIX}{scope}\x00{env}"


def is_transit(name: str) -> bool:
    return name.startswith(PREFIX)


class Transit:
    """A session call at a time, each on an instance built from the state it brings."""

    def __init__(self, module: types.ModuleType, cls: type, readonly: ReadOnly | None) -> None:
        self.module = module
        self.cls = cls
        self.readonly = readonly

    def handle(self, request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        # (a fresh LiveSession each time: nothing of the last call's session is looked at again)
        return LiveSession(self.module, self.cls, self.readonly).handle(request)
