"""Calling a session's tools: one call, applied exactly once, committed as the session's next step.

A call runs under the store's lock on the session (``SessionStore.begin`` takes it with the meta)
or, on a session this replica committed last and whose instance the pool holds live, without
it: the commit is a compare-and-set on the step, so it refuses whatever moved meanwhile. Tool
failures (unknown tool, invalid arguments, the environment said no) are steps with an error the
agent sees, never problems; a commit also serves the steps of messages and turns' ends.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sandbox.pool.calls import CallOutcome, NeedState, Stored
from sandbox.state.view import no_diff
from sandbox.wire.answers import ToolError
from sandbox.wire.protocol import unicode_json
from service.catalog.arguments import ArgumentChecker, ArgumentLimit
from service.catalog.model import Environment
from service.catalog.registry import env_code
from service.engine import failures, idempotency, steps
from service.engine.lookup import visible
from service.engine.views import randomness
from service.errors import Conflict, LimitExceeded, NotFound
from service.stores.store import Held, LocalLocks, Snapshot, digest_of

if TYPE_CHECKING:
    from service.engine.sessions import Sessions

T = TypeVar("T")

# The lock lease outlives the longest call (see WorkerPool.longest_request) with room to commit.
LEASE_SLACK = 15.0
# Sessions whose meta this replica keeps from its own last commit, for calls made without the lock.
WARM_SESSIONS = 65536


@dataclass
class Applied:
    """A committed step record, and whether it answers an earlier request with the same key."""

    record: dict[str, Any]
    replayed: bool = False


class Calls:
    """The calls of one engine (``Sessions.calls``), and the sessions this replica may call without the lock."""

    def __init__(self, engine: Sessions) -> None:
        self.engine = engine
        self._checkers: dict[tuple[str, str], ArgumentChecker] = {}
        # Sessions this replica committed last and whose instance the pool holds live: their
        # meta as that commit left it, so their next call needs no lock and no read.
        self._warm: OrderedDict[str, Snapshot] = OrderedDict()
        # One call per session at a time in this replica, whichever way it goes: a call made
        # without the store's lock must not run beside one that read the meta under it.
        self._turns = LocalLocks()

    async def call(self, session_id: str, name: str, raw_arguments: dict[str, Any] | str, *,
                   key: str | None = None, tenant: str = "") -> Applied:
        engine = self.engine
        fingerprint = idempotency.fingerprint("call", {"name": name, "arguments": raw_arguments}) if key else ""
        async with failures.step_failures(), self._turns.hold(session_id, engine.lock_wait):
            warm = self._warm.get(session_id)
            if warm is not None and warm.meta.tenant == tenant and engine.pool.live_at(session_id, warm.meta.step):
                # No lock and no read: one round trip to the store, the commit, which refuses if
                # the session moved on, another caller holds its lock, or ``key`` was used.
                applied = await self._step(warm, name, raw_arguments, key, fingerprint, None)
                if applied is not None:
                    return applied
            return await self._locked(session_id, name, raw_arguments, key, fingerprint, tenant)

    async def _locked(self, session_id: str, name: str, raw_arguments: dict[str, Any] | str, key: str | None,
                      fingerprint: str, tenant: str) -> Applied:
        """A call under the store's lock on the session, which ``begin`` takes with the meta."""
        engine = self.engine
        lease = engine.pool.longest_request + LEASE_SLACK
        # One round trip takes the lock and reads the meta; the state is read only if no sandbox
        # worker holds the session live at this step; the commit releases the lock.
        async with engine.store.begin(session_id, engine.lock_wait, lease) as held:
            snap = visible(held.snap, session_id, tenant)
            replay = await self.replay(session_id, key, fingerprint)
            if replay is not None:
                return replay
            applied = await self._step(snap, name, raw_arguments, key, fingerprint, held)
        assert applied is not None  # (under the lock a refused commit raises)
        return applied

    async def _step(self, snap: Snapshot, name: str, raw_arguments: dict[str, Any] | str, key: str | None,
                    fingerprint: str, held: Held | None) -> Applied | None:
        """Run the call on ``snap``'s session and commit its step: under the store's lock (``held``),
        or without it, on a session this replica committed last and whose instance the pool holds
        live. None when a commit without the lock was refused: nothing is applied, and the
        caller goes the usual way (the process ran the call, so it is dropped, and the call runs
        again from the stored state)."""
        engine = self.engine
        session_id = snap.meta.session_id
        self.check_steps(snap)
        env = await engine.environment_of(snap)
        try:
            async with engine.sandbox_slot(snap.meta.tenant):
                arguments, outcome = await self._run(env, snap, name, raw_arguments)
            record = steps.call_step(snap.meta.step + 1, name, arguments, outcome)
            digest = await self.commit(snap, outcome.state, record, key=key, fingerprint=fingerprint, held=held,
                                       delta=outcome.delta, rebase=outcome.rebase, unlocked=held is None)
        except BaseException:
            self._drop_live(session_id)
            raise
        if digest is None:
            self._drop_live(session_id)
            return None
        self._keep_warm(snap, digest)
        engine.metrics.tool_call("ok" if record["ok"] else record["error"]["type"])
        return Applied(record)

    # -- the sessions called without the lock ---------------------------------------------------
    def _drop_live(self, session_id: str) -> None:
        """The session's live instance may hold a step that was not committed: never use it again."""
        self.engine.pool.forget(session_id)
        self._warm.pop(session_id, None)

    def _keep_warm(self, snap: Snapshot, digest: str) -> None:
        """Keep the meta the commit just made of ``snap``, while the pool holds the session live."""
        meta = _copied(snap.meta)
        meta.step += 1
        warm = _copied(snap)
        warm.meta, warm.state_digest = meta, digest
        self.warm_at(warm)

    def warm_at(self, snap: Snapshot) -> None:
        """This replica made ``snap`` last: its next call may go without the lock, while the pool holds it live."""
        session_id = snap.meta.session_id
        self._warm.pop(session_id, None)
        if not self.engine.pool.live_at(session_id, snap.meta.step):
            return
        self._warm[session_id] = snap
        while len(self._warm) > WARM_SESSIONS:
            self._warm.popitem(last=False)

    def forget_warm(self, session_id: str) -> None:
        """The session moves on by other than a call here (a message, a turn's end) or is gone."""
        self._warm.pop(session_id, None)

    # -- steps and their commits ----------------------------------------------------------------
    def check_steps(self, snap: Snapshot) -> None:
        """Raises LimitExceeded: the session holds as many steps as it may."""
        max_steps = self.engine.limits.max_steps
        if snap.meta.step >= max_steps:
            raise LimitExceeded(f"the session has reached {max_steps} steps, its limit; fork or start a "
                                "new session", limit="max_steps", value=max_steps)

    async def replay(self, session_id: str, key: str | None, fingerprint: str) -> Applied | None:
        """The step an earlier request with the idempotency ``key`` committed, if one did."""
        if key is None:
            return None
        engine = self.engine
        prior = await engine.stored(engine.store.idempotent(session_id, key))
        if prior is None:
            return None
        stored = json.loads(prior)
        idempotency.check_same(stored["fingerprint"], fingerprint, key)
        page = await engine.stored(engine.store.trajectory_page(session_id, stored["step"] - 1, 1))
        if not page or not page[0]:
            raise NotFound(f"session '{session_id}' no longer holds the step of this Idempotency-Key")
        return Applied(steps.public(json.loads(page[0][0])), replayed=True)

    async def commit(self, snap: Snapshot, state: str | None, record: dict[str, Any], *, key: str | None,
                     fingerprint: str, done: bool = False, held: Held | None = None,
                     delta: dict[str, Any] | None = None, rebase: bool = False, unlocked: bool = False) -> str | None:
        """Commit a step; a changed tree state comes as the ``delta`` of its parts, or as a whole
        state to ``rebase`` on (stored as a content-addressed base, see ``sandbox.state.deltas``). The
        digest of the state's base after the step ("" when it is the session's own text); None
        when an ``unlocked`` commit was refused (see ``SessionStore.commit``)."""
        engine = self.engine
        session_id = snap.meta.session_id
        remembered = (key, json.dumps({"fingerprint": fingerprint, "step": record["step"]})) if key else None
        # (hashlib lets go of the GIL: a large state is hashed on a thread beside the event loop)
        digest = await asyncio.to_thread(digest_of, state) if rebase and state is not None else ""
        stored = steps.encoded(record, engine.limits.max_record_bytes)
        committed = await engine.stored(failures.within_quota(engine.store.commit(
            session_id, snap.meta.step, state, stored, done=done, idempotency=remembered, tenant=snap.meta.tenant,
            held=held, quota=engine.limits.max_tenant_bytes, delta=delta, new_base=digest, unlocked=unlocked)))
        if not committed and unlocked:
            return None
        if not committed:
            if await engine.stored(engine.store.load(session_id)) is None:
                raise NotFound(f"session '{session_id}' was deleted or expired during the call")
            raise Conflict("the session changed during the call; nothing was applied, retry")
        steps.public(record)
        return digest if rebase else "" if state is not None else snap.state_digest

    # -- running the call in the sandbox --------------------------------------------------------
    async def _run(self, env: Environment, snap: Snapshot, name: str,
                   raw: dict[str, Any] | str) -> tuple[Any, CallOutcome]:
        engine = self.engine
        if isinstance(raw, str):
            try:
                arguments = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError as exc:
                return raw, _failed(ToolError.INVALID_ARGUMENTS, f"arguments are not valid JSON: {exc}")
        else:
            arguments = raw
        if not isinstance(arguments, dict):
            return arguments, _failed(ToolError.INVALID_ARGUMENTS, "arguments must be a JSON object")
        tool = env.tool(name)
        if tool is None:
            names = ", ".join(sorted(env.tool_names))
            return arguments, _failed(ToolError.UNKNOWN_TOOL, f"unknown tool '{name}'; available tools: {names}")
        withheld = await engine.turns.unavailable(snap, env, name)  # a tool that arrives in a later turn
        if withheld is not None:
            return arguments, _failed(ToolError.UNKNOWN_TOOL, withheld)
        problem = self._check_arguments(env, tool, arguments)
        if problem:
            return arguments, _failed(ToolError.INVALID_ARGUMENTS, f"{name}: {problem}")
        session_id = snap.meta.session_id

        async def stored_state() -> Stored:
            found = await engine.stored(engine.store.stored(session_id))
            if found is None:
                raise NotFound(f"session '{session_id}' was deleted or expired during the call")
            scenario = await engine.lookup.template_scenario(snap)
            if scenario is None or found[1] is None:
                return Stored(*found)
            # Its base is the scenario's initial state: a worker may start it from that template.
            template = engine.templates.key(snap.meta.tenant, env.code_hash, scenario.scenario_id,
                                            scenario.init_config)
            return Stored(*found, template=template, init_config=scenario.init_config, base=snap.state_digest)

        code, step, chance = env_code(env), snap.meta.step, randomness(snap.meta)
        outcome = await engine.pool.session_call(code, session_id, step, name, arguments, deltas=True, **chance)
        if isinstance(outcome, NeedState):  # no process holds the session live: rebuild it from the store
            outcome = await engine.pool.session_call(code, session_id, step, name, arguments, await stored_state(),
                                                     deltas=True, scope=snap.meta.tenant, **chance)
        assert not isinstance(outcome, NeedState)  # (a call given the state never needs it)
        return arguments, outcome

    def _check_arguments(self, env: Environment, tool: dict[str, Any], arguments: dict[str, Any]) -> str | None:
        """Raises LimitExceeded: arguments over a bound (nothing is applied)."""
        key = (env.code_hash, tool["function"]["name"])
        checker = self._checkers.get(key)
        if checker is None:
            checker = ArgumentChecker(tool["function"].get("parameters") or {"type": "object"})
            self._checkers[key] = checker
        try:
            problem = checker.problem(arguments)
        except ArgumentLimit as exc:
            raise LimitExceeded(str(exc), field="arguments", limit=exc.limit, value=exc.value) from exc
        return problem or _unicode_problem(arguments)


def _copied(value: T) -> T:
    """A shallow copy of a dataclass instance (``dataclasses.replace`` and ``copy.copy`` cost three
    times as much, and every call makes two)."""
    copied = object.__new__(type(value))
    copied.__dict__.update(value.__dict__)
    return copied


def _unicode_problem(value: Any) -> str | None:
    try:
        unicode_json(value).encode("utf-8")
    except UnicodeEncodeError:
        return "arguments contain text that is not valid Unicode (a lone surrogate)"
    return None


def _failed(kind: str, message: str) -> CallOutcome:
    return CallOutcome(False, None, {"type": kind, "message": message}, None, no_diff())
