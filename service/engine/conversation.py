"""Conversation mode: the agent talks to a simulated user (``service.engine.user_llm``) who holds the
scenario's task, opens the conversation and ends it; each exchange is a step of the session."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from service.engine import failures, idempotency, steps
from service.engine.calls import LEASE_SLACK, Applied
from service.engine.user_llm import Exchange, UserSimulator
from service.engine.user_llm import UserLLMFailed as UserEndpointFailed
from service.errors import ConversationEnded, NotConversation, UserLLMFailed, UserLLMUnavailable

if TYPE_CHECKING:
    from service.engine.sessions import Sessions


class Conversation:
    """The conversations of one engine's sessions (``Sessions.conversation``)."""

    def __init__(self, engine: Sessions, user: UserSimulator | None) -> None:
        self.engine = engine
        self.user = user

    @property
    def user_timeout(self) -> float:
        return self.user.timeout if self.user else 0.0

    def simulator(self) -> UserSimulator:
        """Raises UserLLMUnavailable: the service has no simulated user."""
        if self.user is None:
            raise UserLLMUnavailable("conversation mode needs a simulated user: set ENVFOUNDRY_USER_LLM_BASE_URL "
                                     "(and ENVFOUNDRY_USER_LLM_MODEL, ENVFOUNDRY_USER_LLM_API_KEY) on the service")
        return self.user

    async def opening(self, task: str) -> str:
        """The simulated user's first message, for a session about to be created."""
        try:
            return await self.simulator().opening(task)
        except UserEndpointFailed as exc:
            raise UserLLMFailed(f"{exc}; nothing was created") from exc

    async def message(self, session_id: str, content: str, *, key: str | None = None, tenant: str = "") -> Applied:
        engine = self.engine
        engine.calls.forget_warm(session_id)
        fingerprint = idempotency.fingerprint("message", {"content": content})
        lease = self.user_timeout + LEASE_SLACK
        async with failures.step_failures(), engine.store.lock(session_id, engine.lock_wait, lease):
            snap = await engine.snapshot(session_id, trajectory=True, tenant=tenant)
            if snap.meta.mode != "conversation":
                raise NotConversation(f"session '{session_id}' is in task mode; create it with "
                                      "mode 'conversation' to talk to a simulated user")
            replay = await engine.calls.replay(session_id, key, fingerprint)
            if replay is not None:
                return replay
            if snap.meta.done:
                raise ConversationEnded("the simulated user has ended this conversation; score the session")
            engine.calls.check_steps(snap)
            scenario = await engine.scenario_of(snap)
            assert scenario is not None  # conversation sessions are made from scenarios only
            exchanges = [Exchange(r["content"], r["reply"]) for r in map(json.loads, snap.trajectory)
                         if r.get("kind") == "message"]
            try:
                reply = await self.simulator().reply(scenario.task, snap.meta.opening or "", exchanges, content)
            except UserEndpointFailed as exc:
                raise UserLLMFailed(f"{exc}; the session is unchanged, retry the message") from exc
            record = steps.message_step(snap.meta.step + 1, content, reply.text, reply.done)
            await engine.calls.commit(snap, None, record, key=key, fingerprint=fingerprint, done=reply.done)
        return Applied(record)
