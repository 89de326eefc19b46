"""A tool call, whichever transport brought it.

REST (the route and its fast path, ``service.api.fastpath``), MCP and OpenEnv (HTTP, WebSocket and
JSON-RPC) each read a call their own way, then hand the same ``CallRequest`` to ``run``: the key's
check, the engine (limits, idempotency, errors, metrics: ``Sessions.call``) and the view of the
step every transport answers with are written here once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from service.engine import idempotency
from service.engine.calls import Applied
from service.engine.sessions import Sessions
from service.errors import InvalidRequest

KEY = re.compile(idempotency.KEY_PATTERN)
# What every transport shows of a committed call step.
VIEW_FIELDS = ("step", "ok", "result", "error", "observation")


@dataclass(frozen=True)
class CallRequest:
    session_id: str
    name: str
    arguments: dict[str, Any] | str
    key: str | None = None  # an idempotency key, checked (``checked_key``)
    tenant: str = ""


def checked_key(key: Any, field: str = idempotency.HEADER) -> str | None:
    """An idempotency key as every transport accepts it, or None.

    Raises:
        InvalidRequest: the key is not 1 to 255 printable ASCII characters (named as ``field``).
    """
    if key is None:
        return None
    if not isinstance(key, str) or not KEY.fullmatch(key):
        raise InvalidRequest("the idempotency key must be 1 to 255 printable ASCII characters", field=field)
    return key


async def run(engine: Sessions, call: CallRequest) -> Applied:
    """Apply the call exactly once (see ``Sessions.call``); a tool's failure is a step, not an error."""
    return await engine.call(call.session_id, call.name, call.arguments, key=call.key, tenant=call.tenant)


def view(applied: Applied) -> dict[str, Any]:
    """The step as every transport answers it (REST's ``CallResult``)."""
    record = applied.record
    return {name: record[name] for name in VIEW_FIELDS}
