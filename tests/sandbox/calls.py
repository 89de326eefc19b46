"""A session call as the engine makes it: the live process first, the stored state only when asked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sandbox.pool.calls import CallOutcome, NeedState, Stored
from sandbox.pool.requests import WorkerPool


async def session_call(pool: WorkerPool, env: Any, session: str, step: int,
                       load: Callable[[], Awaitable[str | Stored]], name: str, arguments: dict[str, Any],
                       **options: Any) -> CallOutcome:
    """``pool.session_call``, reading the stored state (``load``) only when the pool answers it needs it."""
    outcome = await pool.session_call(env, session, step, name, arguments, **options)
    if isinstance(outcome, NeedState):
        outcome = await pool.session_call(env, session, step, name, arguments, await load(), **options)
    assert isinstance(outcome, CallOutcome)
    return outcome
