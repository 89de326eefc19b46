"""Go back to any step: a session's state after step k, rebuilt from its initial state.

The store keeps each session's initial state and a record of every step: the call, the
arguments it ran with, its result, error and state diff. The state after step k is rebuilt by
running the first k recorded calls again, in order, on a fresh instance made from the initial
state in the sandbox (messages to a simulated user change no state and are not sent again).
Every replayed call must answer what its record says (the same success, result, error type and
diff), so an environment that does not repeat itself (randomness, the clock) is refused, naming
the step that went another way, and never rebuilt wrong. The replay runs in a session of its own
that nobody else sees and that ends with it.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sandbox.pool import CallOutcome, EnvCode, WorkerPool


class NotReplayable(Exception):
    """A recorded step could not be run again to the same answer."""

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"step {step} {reason}")
        self.step = step
        self.reason = reason


class RewindBudget(Exception):
    """Replaying took longer than the budget allows."""


async def state_at(pool: WorkerPool, env: EnvCode, initial: str, records: list[str], budget: float, *,
                   stream: str | None = None, seed: int | None = None) -> str:
    """The encoded state after ``records`` (the session's first steps), replayed from ``initial``
    with the session's randomness (``stream``, ``seed``: see ``sandbox.randomness``).

    Raises:
        NotReplayable: a call answered otherwise than its record, or its record kept no arguments.
        RewindBudget: the replay took longer than ``budget`` seconds.
    """
    replay = f"rewind-{secrets.token_hex(12)}"
    deadline = time.monotonic() + budget
    state, version = initial, 0
    try:
        for text in records:
            record = json.loads(text)
            if record.get("kind", "call") != "call":
                continue
            if time.monotonic() > deadline:
                raise RewindBudget(f"replaying the steps took longer than {budget:g} s")
            arguments = record.get("arguments")
            if not isinstance(arguments, dict) or _cut(arguments):
                raise NotReplayable(int(record["step"]), "kept no arguments to run it again (they were too large)")
            outcome = await pool.session_call(env, replay, version, _constant(state), str(record["name"]), arguments,
                                              stream=stream, seed=seed)
            version += 1
            difference = _difference(record, outcome)
            if difference:
                raise NotReplayable(int(record["step"]), difference)
            if outcome.state is not None:
                state = outcome.state
        return state
    finally:
        pool.end_session(replay)


def _constant(state: str) -> Callable[[], Awaitable[str]]:
    async def load() -> str:
        return state

    return load


def _cut(value: Any) -> bool:
    return isinstance(value, dict) and any(key.startswith("$truncated") for key in value)


def _difference(record: dict[str, Any], outcome: CallOutcome) -> str | None:
    """How ``outcome`` differs from what ``record`` says the call did, or None."""
    if bool(record.get("ok")) != outcome.ok:
        return "answered otherwise when run again (it " + ("failed" if record.get("ok") else "succeeded") + \
            " only the first time): the environment does not repeat itself"
    if not outcome.ok:
        recorded = (record.get("error") or {}).get("type")
        got = (outcome.error or {}).get("type")
        return None if recorded == got else f"failed with {got} when run again, {recorded} the first time"
    result = record.get("result")
    if not _cut(result) and result != outcome.result:
        return "returned another result when run again: the environment does not repeat itself"
    diff = record.get("diff") or {}
    if not diff.get("truncated") and diff != outcome.diff:
        return "changed the state otherwise when run again: the environment does not repeat itself"
    return None
