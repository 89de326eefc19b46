"""Sessions a full worker keeps live together, in one process per environment and tenant.

A live session of its own process holds about 3 MB that it does not share, so a worker's memory
keeps a few thousand of them; an RL batch keeps ten thousand open. Once a worker keeps as many
such processes as it may (``max_residents``, or its memory leaves no room for another), a session
that must be rebuilt does not end another's process to make room for its own: it is rebuilt in
its environment's *lodge*, a fork of the environment's host kept for one tenant, which holds the
instances of many sessions (each as a ``LiveSession``, by session id) and serves each one's calls
as that session's own process would. A lodged session then costs what its instance holds.

A lodge sets the process's randomness to each session's own before its call
(``randomness.Stream.resume``). What sessions of one lodge could share is what the environment
keeps outside its instances, which registration refuses (``state_outside_instance``); a lodge
serves one tenant only (the request's ``scope``), so code written to carry data across sessions
reaches nothing of another tenant's. A call that fails in a way that may have changed its
instance drops that session's instance (its next call rebuilds it); one that may have changed
the process (a timeout, memory, output) ends the lodge, and its sessions go cold.

Standard library only.
"""

from __future__ import annotations

import types
from typing import Any

from sandbox.state.readonly import ReadOnly
from sandbox.wire.answers import LODGED, NEED_STATE, error
from sandbox.worker.resident import LiveSession

# The request field that makes a host's fork a lodge (and names it on each request), the field of
# the sessions a lodge must drop before serving one, the field of the memory it may hold beyond one
# call's (its first request's), and the prefix of the key a worker keeps a lodge under among its
# live processes (no session id holds a NUL).
FLAG = LODGED
FORGET = "forget"
HOLDS = "lodge_bytes"
# The address space a lodge may take beyond one call's, at most, whatever the worker's room.
LODGE_SPACE = 16 << 30
PREFIX = "\x00lodge\x00"


def key(scope: str, env: str, template: str | None = None) -> str:
    """Where a worker keeps the lodge of ``env`` for tenant ``scope``, or the lodge of the template
    (its key among the worker's templates) that ``sandbox.worker.templatelodge`` describes."""
    return f"{PREFIX}{scope}\x00{env}" + ("" if template is None else f"\x00{template}")


def template_of(name: str) -> str | None:
    """The template key of a template lodge's ``name`` (None for a lodge of an environment)."""
    parts = name.removeprefix(PREFIX).split("\x00")
    return parts[2] if len(parts) == 3 else None


def is_lodge(name: str) -> bool:
    return name.startswith(PREFIX)


class Lodging:
    """What every kind of lodge does with the worker's requests before serving a session's."""

    def __init__(self, first: dict[str, Any]) -> None:
        self.sessions: dict[str, Any] = {}
        holds = first.get(HOLDS)
        self.holds = max(0, holds) if type(holds) is int else 0

    def address_space(self, limits: Any) -> int:
        """One call's limit above what the sessions may hold, as the first request said (the worker's
        room for live sessions): set once, it cannot go back up (``forks._set_call_limits``)."""
        return int(limits.memory_bytes) + min(self.holds, LODGE_SPACE)

    def served(self, request: dict[str, Any]) -> str | None:
        """Drop the sessions the worker let go; the session ``request`` is for, or None when it is
        for none (a ``forget``: then answer ``FORGOTTEN``)."""
        for gone in request.get(FORGET) or ():
            self.sessions.pop(gone, None)
        session = request.get("session")
        return None if request.get("op") == "forget" or type(session) is not str else session


FORGOTTEN = {"ok": True, "stays": True}  # (the answer to a forget)


class Lodge(Lodging):
    """The live instances of many sessions of one environment, by session id."""

    def __init__(self, module: types.ModuleType, cls: type, readonly: ReadOnly | None, first: dict[str, Any]) -> None:
        super().__init__(first)
        self.module = module
        self.cls = cls
        self.readonly = readonly
        self.sessions: dict[str, LiveSession] = {}

    def handle(self, request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The answer to ``request``, with ``stays`` when this process may serve on (any failure
        of a call ends only that session's instance here)."""
        session = self.served(request)
        if session is None:
            return dict(FORGOTTEN), True
        live = self.sessions.pop(session, None)
        if "state" in request or request.get("op") == "init":
            live = None  # (rebuilt from what the request brings: whatever was here is older)
        if live is None:
            if "state" not in request:
                return {"error": error(NEED_STATE, "this process holds no live instance of the session"),
                        "stays": True}, True
            live = LiveSession(self.module, self.cls, self.readonly)
        else:
            live.stream.resume()
        answer, kept = live.handle(request)
        if kept:
            self.sessions[session] = live
        return {**answer, "stays": True}, True
