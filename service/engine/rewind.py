"""Go back to any step: a session's state after step k, rebuilt from its initial state.

The store keeps each session's initial state and a record of every step: the call, the
arguments it ran with, its result, error and state diff. The state after step k is rebuilt by
running the first k recorded calls again, in order, on a fresh instance made from the initial
state in the sandbox (messages to a simulated user change no state and are not sent again).
Every replayed call must answer what its record says (the same success, result, error type and
diff), so an environment that does not repeat itself (randomness, the clock) is refused, naming
the step that went another way and how, and never rebuilt wrong. A call the sandbox could not run
(its worker was lost, it could not start a process, a resource limit of the worker) says nothing
about the environment: that is ``SandboxFailed``, to retry, not a refusal. The replay runs in a
session of its own that nobody else sees and that ends with it.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from sandbox.errors import SandboxError
from sandbox.pool.calls import CallOutcome, EnvCode
from sandbox.pool.requests import WorkerPool
from sandbox.wire.answers import ToolError

# Error types of a replayed call that the sandbox answers, not the environment: a call that did
# not fail so the first time failed now for want of a worker, a process or memory.
SANDBOX_FAILURES = frozenset({ToolError.SANDBOX_ERROR, ToolError.RESOURCE_LIMIT})
SHOWN = 200  # characters of a result or diff a refusal quotes


class NotReplayable(Exception):
    """A recorded step could not be run again to the same answer."""

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"step {step} {reason}")
        self.step = step
        self.reason = reason


class SandboxFailed(Exception):
    """The sandbox could not run a recorded step again (nothing is known of the environment)."""

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"the sandbox could not replay step {step}: {reason}")
        self.step = step
        self.reason = reason


class RewindBudget(Exception):
    """Replaying took longer than the budget allows."""


async def state_at(pool: WorkerPool, env: EnvCode, initial: str, records: list[str], budget: float, *,
                   stream: str | None = None, seed: int | None = None) -> str:
    """The encoded state after ``records`` (the session's first steps), replayed from ``initial``
    with the session's randomness (``stream``, ``seed``: see ``sandbox.worker.randomness``).

    Raises:
        NotReplayable: a call answered otherwise than its record, or its record kept no arguments.
        SandboxFailed: the sandbox could not run a call (a sandbox error it did not answer the first time).
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
            step = int(record["step"])
            try:
                outcome = await pool.held_call(env, replay, version, str(record["name"]), arguments, state,
                                               stream=stream, seed=seed)
            except SandboxError as exc:
                raise SandboxFailed(step, exc.message) from exc
            version += 1
            failure = _sandbox_failure(record, outcome)
            if failure:
                raise SandboxFailed(step, failure)
            difference = _difference(record, outcome)
            if difference:
                raise NotReplayable(step, difference)
            if outcome.state is not None:
                state = outcome.state
        return state
    finally:
        pool.end_session(replay)


def _cut(value: Any) -> bool:
    return isinstance(value, dict) and any(key.startswith("$truncated") for key in value)


def _sandbox_failure(record: dict[str, Any], outcome: CallOutcome) -> str | None:
    """The sandbox's error that ``outcome`` carries and ``record`` does not, or None."""
    got = (outcome.error or {}).get("type")
    if outcome.ok or got not in SANDBOX_FAILURES:
        return None
    if not record.get("ok") and (record.get("error") or {}).get("type") == got:
        return None  # the first run failed so too: the replay repeats it
    return f"{got}: {(outcome.error or {}).get('message', '')}"[:1000]


def _difference(record: dict[str, Any], outcome: CallOutcome) -> str | None:
    """How ``outcome`` (the call run again) differs from ``record`` (the first run), or None."""
    if record.get("ok") and not outcome.ok:
        return f"failed when run again ({_error(outcome.error)}), succeeded the first time: the environment " \
            "does not repeat itself"
    if not record.get("ok") and outcome.ok:
        return f"succeeded when run again, failed the first time ({_error(record.get('error'))}): the " \
            "environment does not repeat itself"
    if not outcome.ok:
        recorded = (record.get("error") or {}).get("type")
        got = (outcome.error or {}).get("type")
        return None if recorded == got else f"failed with {got} when run again, {recorded} the first time"
    result = record.get("result")
    if not _cut(result) and result != outcome.result:
        return f"answered {_shown(outcome.result)} when run again, {_shown(result)} the first time: the " \
            "environment does not repeat itself"
    diff = record.get("diff") or {}
    if not diff.get("truncated") and diff != outcome.diff:
        return f"changed the state by {_shown(outcome.diff)} when run again, by {_shown(diff)} the first time: " \
            "the environment does not repeat itself"
    return None


def _error(error: dict[str, Any] | None) -> str:
    error = error or {}
    return f"{error.get('type')}: {str(error.get('message', ''))[:SHOWN]}"


def _shown(value: Any) -> str:
    """``value`` as JSON, cut to ``SHOWN`` characters."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."
