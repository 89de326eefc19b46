"""The typed requests the service makes of the pool: validate, init, call (of a session or not), score.

A session's call goes straight to its process when the service holds it (see ``sandbox.lane``),
else to the worker holding it live, else with the stored state to any worker, which rebuilds
the instance (from a template's, when it holds one).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import OrderedDict
from typing import Any

from sandbox import lane
from sandbox.errors import RequestFailed, WorkerLost
from sandbox.pool.calls import NEED_STATE_ANSWER, CallOutcome, EnvCode, NeedState, Stored, outcome, randomness
from sandbox.pool.worker import GUARD_MARGIN, LOST, Backend, Worker
from sandbox.pool.workers import WITH_CONFIG, Workers
from sandbox.state.deltas import entries_in_place
from sandbox.wire import answers, frames
from sandbox.wire.answers import CALL_ERRORS, NEED_CONFIG, NEED_STATE
from sandbox.wire.limits import Limits
from sandbox.worker.forks import decode_answer

# A call its session's lent process could serve waits longer: elsewhere it rebuilds that process
# (a fork and a decode, milliseconds of CPU), which under load only adds to the queue it left.
LANE_STEAL_AFTER = 1.0
# A lent process's answer up to this size is decoded and checked on the event loop; a larger one
# by the process's worker (see ``WorkerPool._checked``).
INLINE_ANSWER_BYTES = 64 * 1024
# How long a rebuild sends the stored text it could leave to a template, once a worker had to ask
# for it (seconds).
SEND_STATE_FOR = 1.0
# Encoded initial states kept by template (least recently used out first), in characters.
INITIAL_CACHE_BYTES = 64 << 20


class WorkerPool(Workers):
    def __init__(self, backend: Backend, size: int, limits: Limits, *, max_requests: int = 5000,
                 acquire_timeout: float = 60.0) -> None:
        super().__init__(backend, size, limits, max_requests=max_requests, acquire_timeout=acquire_timeout)
        self.live_calls = 0  # session calls served by a live instance
        self.lane_calls = 0  # of ``live_calls``, those made straight
        self.rebuilt_calls = 0  # and those that rebuilt it from the stored state
        self.lodged_calls = 0  # session calls served by a lodge (see ``sandbox.worker.lodge``), live or rebuilt
        self._send_state_until = 0.0  # (``_asking``) until then a rebuild sends the stored text it could withhold
        self._initial: OrderedDict[str, tuple[str, str]] = OrderedDict()  # template -> (digest, state)
        self._initial_bytes = 0

    async def validate(self, env: EnvCode) -> dict[str, Any] | None:
        """Compile and instantiate ``env`` with ``{}`` in a throwaway fork; return the error or None."""
        answer = await self.request(
            {"op": "validate", "env_id": env.env_id, "class_name": env.class_name, "code": env.code,
             "layers": list(env.layers), "timeout": self.limits.load_timeout},
            None,
            self.limits.load_timeout,
        )
        if answer.get("ok") is True:
            return None
        failure = answer.get("failure")
        if isinstance(failure, dict) and isinstance(failure.get("kind"), str) and isinstance(failure.get("message"), str):
            return {"kind": failure["kind"], "message": failure["message"]}
        return {"kind": "sandbox_error", "message": "the validation sent an answer of the wrong shape"}

    async def init_state(self, env: EnvCode, init_config: dict[str, Any], session: str | None = None,
                         template: str | None = None, *, deltas: bool = False, stream: str | None = None,
                         seed: int | None = None) -> str:
        """The encoded initial state; with ``session``, the worker keeps the instance live for its calls.

        With ``template`` (a key the caller makes for one initial state: same environment code,
        same ``init_config``, same tenant), each worker builds that instance once and starts later
        sessions as forks of it, and the encoded state it made is kept here by its digest, so a
        session made from it costs neither building nor encoding the state, whatever its size.
        ``stream`` and ``seed``: the session's randomness (see ``sandbox.worker.randomness``).
        """
        if self.limits.rebuild_every_call:  # nothing kept live, nothing forked from a template
            session = template = None
        message = {"op": "init", "env": env.key, "init_config": init_config, "timeout": self.limits.call_timeout,
                   "max_state_bytes": self.limits.state_bytes, **randomness(stream, seed)}
        cached = self._initial.get(template) if template is not None else None
        if template is not None:  # (sent without its config where the worker asks for it: ``_roundtrip``)
            message["template"] = template
            if cached is not None:
                message["known"] = cached[0]
        if session is not None:
            message.update(session=session, next_version=0)
            if deltas:  # the state is the session's base: its calls answer what they changed
                message["deltas"] = True
            message["lend"] = True
            self._unhome(session)
        try:  # (a copy each time: a request gathers what its worker must hear, for that worker alone)
            answer, slot = await self._request(dict(message), env, self.limits.call_timeout, None)
        except RequestFailed as exc:
            if exc.kind != NEED_CONFIG:
                raise
            answer, slot = await self._request({**message, WITH_CONFIG: True}, env, self.limits.call_timeout, None)
        state, digest = answer.get("state"), answer.get("digest")
        if state is None and cached is not None and digest == cached[0] and template is not None:
            state = cached[1]
            self._initial.move_to_end(template)
        else:
            if not isinstance(state, str):  # (the worker checked its size: ``answers.checked``)
                raise RequestFailed("sandbox_error", "the init process sent an answer of the wrong shape")
            if template is not None and isinstance(digest, str):
                self._keep_initial(template, digest, state)
        if session is not None:
            self._home(session, slot, 0, answer.get("lane"))
        return state

    def _keep_initial(self, template: str, digest: str, state: str) -> None:
        self._initial.pop(template, None)
        self._initial[template] = (digest, state)
        self._initial_bytes = sum(len(text) for _, text in self._initial.values())
        while self._initial_bytes > INITIAL_CACHE_BYTES and len(self._initial) > 1:
            _, (_, dropped) = self._initial.popitem(last=False)
            self._initial_bytes -= len(dropped)

    async def call(self, env: EnvCode, state: str, name: str, arguments: dict[str, Any]) -> CallOutcome:
        """Run one tool call. Tool-level failures come back as an outcome, not an exception."""
        return await self._call(env, self._call_message(env, name, arguments, False), state, None)

    async def session_call(self, env: EnvCode, session: str, step: int, name: str, arguments: dict[str, Any],
                           state: str | Stored | None = None, *, deltas: bool = False, stream: str | None = None,
                           seed: int | None = None, scope: str | None = None) -> CallOutcome | NeedState:
        """A call on ``session`` at ``step``: straight to its process when this service holds it at
        that step (see ``sandbox.lane``), else on the worker holding it live at that step if there
        is one, else with ``state``, the stored state. Without ``state`` and with no live process to
        serve the call, the answer is ``NEED_STATE``: read the stored state and call again with it
        (a live session's call never reads it). The caller must ``forget`` the session if the step
        the call makes is not committed. With ``deltas`` the caller stores a changed tree state as
        a base plus a delta: the outcome may carry the ``delta`` instead of the state. ``stream``
        and ``seed``: the session's randomness, for a rebuild (see ``sandbox.worker.randomness``).
        ``scope``: the session's tenant; with it a full worker rebuilds the session in the lodge of
        its environment and tenant (see ``sandbox.worker.lodge``), else it makes room for it."""
        message = self._call_message(env, name, arguments, deltas, stream, seed)
        if scope is not None:
            message["scope"] = scope
        if self.limits.rebuild_every_call:
            return NEED_STATE_ANSWER if state is None else await self._rebuilt_call(message, env, state)
        if state is None:
            home = self._homes.get(session)
            held = self._lanes.get(session)
            if home is not None and home[1] == step and held is not None:
                outcome = await self._on_lane(session, step, home[0], held, message)
                if outcome is not None:
                    self.live_calls += 1
                    self.lane_calls += 1
                    return outcome
                home = None  # its process is gone: the stored state rebuilds it
            if home is None or home[1] != step:
                return NEED_STATE_ANSWER
            outcome = await self._call(env, message, None, (session, step, home[0]))
            if outcome.error is not None and outcome.error.get("type") == NEED_STATE:
                return NEED_STATE_ANSWER
            self.live_calls += 1
            return outcome
        # A worker holding the session at an older step rebuilds it in place; one holding it at this
        # step has just answered that it cannot (NEED_STATE), so any worker may.
        home = self._homes.get(session)
        outcome = await self._call(env, message, state, (session, step, home[0] if home and home[1] != step else None))
        self.rebuilt_calls += 1
        return outcome

    async def held_call(self, env: EnvCode, session: str, step: int, name: str, arguments: dict[str, Any],
                        state: str | Stored, **options: Any) -> CallOutcome:
        """``session_call`` for a caller that holds the stored state already: the session's live
        process serves the call if there is one, else ``state`` rebuilds it."""
        outcome = await self.session_call(env, session, step, name, arguments, **options)
        if isinstance(outcome, NeedState):
            outcome = await self.session_call(env, session, step, name, arguments, state, **options)
        assert isinstance(outcome, CallOutcome)  # (a call given the state never needs it)
        return outcome

    async def _rebuilt_call(self, message: frames.Call, env: EnvCode, state: str | Stored) -> CallOutcome:
        """A session call with ``rebuild_every_call``: its instance rebuilt from the stored state by a
        fork of the environment's host, not of a template, and not kept after the call."""
        if isinstance(state, Stored) and state.template is not None:
            state = Stored(state.text, state.delta)
        outcome = await self._call(env, message, state, None)
        self.rebuilt_calls += 1
        return outcome

    def _call_message(self, env: EnvCode, name: str, arguments: dict[str, Any], deltas: bool,
                      stream: str | None = None, seed: int | None = None) -> frames.Call:
        message: frames.Call = {"op": "call", "env": env.key, "name": name, "arguments": arguments,
                                **self.limits.call_fields(), **randomness(stream, seed)}  # type: ignore[typeddict-item]
        if deltas:
            message["deltas"] = True
        return message

    async def _on_lane(self, session: str, step: int, slot: int, held: lane.Lane,
                       message: frames.Call) -> CallOutcome | None:
        """The call straight to the session's process, holding its worker meanwhile; None if that
        process can no longer serve it (the caller rebuilds it from the stored state)."""
        worker = await self._acquire(slot, LANE_STEAL_AFTER)
        healthy = True
        try:
            if worker.slot != slot or self._lanes.get(session) is not held or held.version != step:
                return None  # another worker was free first, or the process moved on while we waited
            worker.touched.add(session)
            cap = answers.answer_cap(message)
            started = asyncio.get_running_loop().time()
            try:
                body, how = await lane.call(held, message, self.limits.call_timeout, cap)
            except BaseException:  # cancelled: its process is ended (see ``lane.call``)
                self._unhome(session)
                raise
            if how == "done" and body is not None:
                try:
                    checked = await self._checked(worker, body, message)
                except (TimeoutError, *LOST) as exc:
                    healthy = False
                    self._unhome(session)
                    return outcome({"error": answers.error(answers.ToolError.SANDBOX_ERROR,
                                                            f"the sandbox worker was lost ({exc!r}) and replaced")})
                healthy = checked.pop("unhealthy", None) is not True  # (a worker that checked it may say so)
                if answers.untouched(checked):
                    self._homes[session] = (slot, step + 1)
                    held.version = step + 1
                else:  # its instance may have changed unanswered (the process exits by itself too)
                    held.signal(signal.SIGKILL)
                    self._unhome(session)
                return outcome(checked)
            self._lanes.pop(session, None)  # (first: the worker ends it now, not as an ending)
            held.close()
            self._unhome(session)
            left = self.limits.call_timeout - (asyncio.get_running_loop().time() - started)
            try:
                collect: frames.Collect = {"op": "collect", "session": session, "outcome": how,  # type: ignore[typeddict-item]
                                           "timeout": self.limits.call_timeout, "cap": cap, "wait": max(left, 0.0)}
                collected = await self._roundtrip(worker, dict(collect), self.limits.call_timeout + 2 * GUARD_MARGIN)
            except (TimeoutError, *LOST) as exc:
                healthy = False
                return outcome({"error": answers.error(answers.ToolError.SANDBOX_ERROR,
                                                        f"the sandbox worker was lost ({exc!r}) and replaced")})
            healthy = collected.get("unhealthy") is not True
            if collected.get("gone") is True:
                return None  # the worker had ended it before the call reached it: rebuilt from the store
            return outcome(collected if isinstance(collected.get("error"), dict) else answers.malformed())
        finally:
            tmp = worker.tmp
            if healthy and tmp is not None and not tmp.untouched():
                # (shielded: a cancelled call must not hand the worker on while its /tmp is being emptied)
                await asyncio.shield(self._release(worker))
            elif healthy:  # (at once, the usual case: no task is made to hand it on)
                self._put(worker)
            else:
                self._replace(worker)

    async def _checked(self, worker: Worker, body: bytes, message: frames.Call) -> dict[str, Any]:
        """A lent process's answer, decoded and checked: here when it is small, else by its worker,
        in its own process (untrusted JSON can take seconds to decode and walk, and this event
        loop serves every session)."""
        if len(body) <= INLINE_ANSWER_BYTES:
            return answers.checked("call", decode_answer(body), message, bounded=True)
        limits = {k: v for k, v in message.items() if k.startswith("max_") or k == "deltas"}
        check: dict[str, Any] = {"op": "check", "answer": body, **limits}  # (a ``frames.Check``)
        return await self._roundtrip(worker, check, self.limits.call_timeout + 2 * GUARD_MARGIN)

    async def _release(self, worker: Worker) -> None:
        """Hand ``worker`` on after a call straight to one of its processes left something in its
        /tmp: emptied first, off the event loop, or the worker replaced if that cannot be done."""
        assert worker.tmp is not None
        if await asyncio.to_thread(worker.tmp.empty):
            self._put(worker)
        else:
            self._replace(worker)

    async def _call(self, env: EnvCode, message: frames.Call, state: str | Stored | None,
                    session: tuple[str, int, int | None] | None) -> CallOutcome:
        withheld: str | None = None  # the stored text, not sent unless the worker asks for it
        if isinstance(state, Stored):
            message["state"] = state.text
            if state.delta is not None:
                message["delta"] = state.delta
                if state.template is not None and state.base:
                    # (its config only where the worker must build the template: see ``_roundtrip``)
                    message["template"], message["known"] = state.template, state.base
                    message["init_config"] = state.init_config or {}
                    if session is not None and entries_in_place(state.delta) is not None \
                            and time.monotonic() >= self._send_state_until:
                        # The template's state and the delta make the stored text: it stays here,
                        # unless the worker cannot rebuild the session from them (``NEED_STATE``).
                        withheld = message.pop("state")
                        message["state_bytes"] = len(withheld)  # (where a full worker may lodge it)
        elif state is not None:
            message["state"] = state
        prefer = None
        if session is not None:
            sid, step, prefer = session
            message["session"], message["version"], message["next_version"] = sid, step, step + 1
            message["lend"] = True
            self._unhome(sid)  # until the worker says it kept the instance
        try:
            answer, slot = await self._asking(env, message, prefer, withheld)
        except RequestFailed as exc:
            if exc.kind in CALL_ERRORS or exc.kind == NEED_STATE:
                return outcome({"error": {"type": exc.kind, "message": exc.message}})
            # e.g. the class failed to load in this worker: not the agent's doing
            return outcome({"error": {"type": "sandbox_error", "message": f"{exc.kind}: {exc.message}"}})
        except WorkerLost as exc:
            return outcome({"error": {"type": "sandbox_error", "message": exc.message}})
        # (the worker checked the answer of the process that ran environment code: ``answers.checked``)
        if answer.get(answers.LODGED) is True:
            self.lodged_calls += 1
        if session is not None:
            self._home(session[0], slot, session[1] + 1, answer.get("lane"))
        return outcome(answer)

    async def _asking(self, env: EnvCode, message: frames.Call, prefer: int | None,
                      withheld: str | None) -> tuple[dict[str, Any], int]:
        """The worker's answer to a session call, sent again with what the worker asked for: the
        template's config (``NEED_CONFIG``), the stored text ``withheld`` (``NEED_STATE``)."""
        attempt: dict[str, Any] = dict(message)
        while True:
            try:
                return await self._request(dict(attempt), env, self.limits.call_timeout, prefer)
            except RequestFailed as exc:
                if exc.kind == NEED_CONFIG and "template" in attempt and not attempt.get(WITH_CONFIG):
                    attempt[WITH_CONFIG] = True
                elif exc.kind == NEED_STATE and withheld is not None and "state" not in attempt:
                    attempt.update({"state": withheld, WITH_CONFIG: True})
                    # Mostly a full worker, whose lodge needs the text: for a while, send it at once
                    # rather than ask twice (see ``sandbox.worker.lodge``).
                    self._send_state_until = time.monotonic() + SEND_STATE_FOR
                else:
                    raise

    async def score(self, env: EnvCode, state: str, initial: str, checks: list[str]) -> list[dict[str, Any]]:
        if not checks:
            return []
        answer = await self.request(
            {"op": "score", "env": env.key, "state": state, "initial": initial, "checks": checks,
             "timeout": self.limits.check_timeout},
            env,
            self.limits.check_timeout * len(checks),
        )
        results = answer.get("checks")
        if not (isinstance(results, list) and len(results) == len(checks) and all(
                isinstance(r, dict) and isinstance(r.get("passed"), bool) and (r.get("error") is None or isinstance(
                    r.get("error"), str)) for r in results)):
            raise RequestFailed("sandbox_error", "scoring sent an answer of the wrong shape")
        return [{"passed": r["passed"], "error": r.get("error")} for r in results]
