"""Where the engine turns its lower layers' errors into the service's (``service.errors``), once each.

    StoreError              -> Unavailable         the store is down or answered oddly: retry
    LockTimeout             -> SessionBusy         another call held the session for too long
    BytesQuota              -> QuotaExceeded       the write would pass the tenant's stored bytes
    SandboxBusy             -> Unavailable         no sandbox worker came free in time
    RequestFailed at init   -> InvalidEnvironment  the code, or its init_config, failed (else Unavailable)
    a replay's failures     -> Conflict, Unavailable or LimitExceeded (see ``service.engine.rewind``)

A session whose environment was deleted is ``EnvironmentGone``, a NotFound as clients see it. A
read answers it and leaves the session stored; a write to the session removes it
(``Sessions.writing``), and the store's TTL removes the rest.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from sandbox.errors import RequestFailed, SandboxBusy, SandboxError
from sandbox.wire.answers import ToolError
from service.engine import rewind
from service.errors import (
    Conflict,
    InvalidEnvironment,
    LimitExceeded,
    NotFound,
    QuotaExceeded,
    ServiceError,
    SessionBusy,
    Unavailable,
)
from service.stores.store import BytesQuota, LockTimeout, SessionMeta, StoreError

T = TypeVar("T")

# What a sandbox worker reports when the environment's code itself did not load.
LOAD_FAILURES = frozenset({"syntax_error", "import_error", "load_error", "load_timeout", "missing_class"})


class EnvironmentGone(NotFound):
    """That registration of the session's environment was deleted (the id may have been added
    again since, with other code or the same): the session can do nothing more."""

    def __init__(self, meta: SessionMeta) -> None:
        super().__init__(f"session '{meta.session_id}' not found: its environment '{meta.env_id}' was deleted")
        self.meta = meta


async def within_quota(write: Awaitable[T]) -> T:
    """A store write that counts against the tenant's stored-bytes quota; refused whole past it."""
    try:
        return await write
    except BytesQuota as exc:
        raise QuotaExceeded(f"{exc}; nothing was stored. Delete sessions (or environments and scenarios) this "
                            "tenant no longer needs, or wait for idle sessions to expire",
                            quota="max_tenant_bytes", value=exc.quota, used=exc.used, needed=exc.needed,
                            retry_after=60) from None


class step_failures:  # noqa: N801  (used as the function it was: ``async with step_failures():``)
    """Around a step (a call, a message, a turn's end), whose lock and store calls are not wrapped one
    by one. (A class: every tool call enters one, and a generator costs more.)"""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, LockTimeout):
            raise SessionBusy(str(exc)) from exc
        if isinstance(exc, StoreError):
            raise Unavailable(str(exc)) from exc
        if isinstance(exc, SandboxBusy):
            raise Unavailable(exc.message) from exc


def init_failure(exc: SandboxError) -> ServiceError:
    """An environment that could not be started: its own fault (its code, this init_config) or the sandbox's."""
    if not isinstance(exc, RequestFailed):
        return Unavailable(exc.message)
    if exc.kind == ToolError.SANDBOX_ERROR:
        return Unavailable(f"the sandbox failed: {exc.message}")
    if exc.kind in LOAD_FAILURES:
        return InvalidEnvironment(f"the environment's code failed to load: {exc.message}", reason=exc.kind)
    return InvalidEnvironment(f"the environment failed to start from this init_config: {exc.message}",
                              reason=exc.kind)


ReplayError = rewind.NotReplayable | rewind.SandboxFailed | rewind.RewindBudget | SandboxError
REPLAY_FAILURES = (rewind.NotReplayable, rewind.SandboxFailed, rewind.RewindBudget, SandboxError)


def replay_failure(exc: ReplayError, step: int, budget: float) -> ServiceError:
    """Why the state after ``step`` could not be rebuilt."""
    if isinstance(exc, rewind.NotReplayable):
        return Conflict(f"the state after step {step} cannot be rebuilt: {exc}", field="step")
    if isinstance(exc, rewind.SandboxFailed):
        return Unavailable(f"{exc}; the steps are as recorded, retry")
    if isinstance(exc, rewind.RewindBudget):
        return LimitExceeded(f"{exc}: fork at a later step, or raise the budget", limit="rewind_budget", value=budget)
    return Unavailable(f"the sandbox could not replay the steps: {exc.message}")
