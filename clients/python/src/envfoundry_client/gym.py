"""A Gymnasium-style environment over an envfoundry session.

Observations and actions are text. ``reset(options={"scenario_id": ..., "mode": ...})`` starts a
session and returns the task (conversation mode: the simulated user's opening message) and an
info dict with the tools, rules and introduction. ``step(action)`` takes what the agent produced:
an OpenAI tool call (object or JSON text, ``{"type": "function", "function": {...}}`` or
``{"name", "arguments"}``), an assistant message object, a list of calls, text with
``<tool_call>`` blocks, or a plain message. A plain message ends a task-mode episode and goes to
the simulated user in conversation mode, whose ``done`` ends the episode. The reward is the
session's ``/score`` when the episode ends (and after every step with ``reward_every_step``); it
is 0.0 otherwise. ``max_steps`` truncates.

The class subclasses ``gymnasium.Env`` when gymnasium is installed (``pip install
envfoundry-client[gym]``) and works the same without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envfoundry_client.actions import parse_action
from envfoundry_client.client import Client
from envfoundry_client.errors import NotFound
from envfoundry_client.models import Mode, Score, Session


class _Plain:
    """What the adapter needs of ``gymnasium.Env`` when gymnasium is not installed."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return None

    def close(self) -> None:
        return None


if TYPE_CHECKING:
    _Base = _Plain
else:
    try:
        from gymnasium import Env as _Base
    except ImportError:  # the adapter works without the optional extra
        _Base = _Plain


class EnvfoundryEnv(_Base):
    """One episode at a time over one session of ``client`` (made from ``base_url`` when not given)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, client: Client | None = None, *, base_url: str | None = None, api_key: str | None = None,
                 scenario_id: str | None = None, mode: Mode = "task", max_steps: int = 30,
                 reward_every_step: bool = False) -> None:
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        self.client = client or Client(base_url, api_key=api_key)
        self._owns_client = client is None
        self.scenario_id = scenario_id
        self.mode: Mode = mode
        self.max_steps = max_steps
        self.reward_every_step = reward_every_step
        self.session: Session | None = None
        self.steps = 0
        self.ended = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start a new episode (ending the previous session). ``options``: ``scenario_id``, ``mode``."""
        super().reset(seed=seed)  # seeds gymnasium's np_random; scenarios themselves are deterministic
        options = options or {}
        scenario_id = options.get("scenario_id", self.scenario_id)
        if not scenario_id:
            raise ValueError('reset needs a scenario: EnvfoundryEnv(scenario_id=...) or options={"scenario_id": ...}')
        mode = options.get("mode", self.mode)
        self._end_session()
        self.session = self.client.create_session(str(scenario_id), mode=mode)
        self.steps = 0
        self.ended = False
        s = self.session
        info = {"session_id": s.session_id, "scenario_id": s.scenario_id, "env_id": s.env_id, "mode": s.mode,
                "task": s.task, "tools": s.tools, "rules": s.rules, "introduction": s.introduction}
        return s.prompt, info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one action; returns (observation, reward, terminated, truncated, info)."""
        if self.session is None:
            raise RuntimeError("call reset() before step()")
        if self.ended:
            raise RuntimeError("the episode has ended; call reset()")
        sid = self.session.session_id
        self.steps += 1
        parsed = parse_action(action)
        info: dict[str, Any] = {"session_id": sid, "step": self.steps}
        terminated = False
        if parsed.error is not None:
            observation = f"Your action could not be read: {parsed.error}. Nothing was done."
            info["error"] = parsed.error
        elif parsed.calls:
            results = [self.client.call(sid, c.name, c.arguments) for c in parsed.calls]
            info["calls"] = results
            observation = "\n\n".join(r.observation for r in results)
        elif self.session.mode == "conversation":
            reply = self.client.send_message(sid, parsed.text)
            info["reply"] = reply
            observation, terminated = reply.reply, reply.done
        else:
            observation, terminated = "", True  # the agent's final answer ends a task episode
        truncated = not terminated and self.steps >= self.max_steps
        reward = 0.0
        if terminated or truncated or self.reward_every_step:
            score: Score = self.client.score(sid)
            info["score"] = score
            reward = score.reward or 0.0
        self.ended = terminated or truncated
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        """Delete the session and, if this object made its client, close it."""
        self._end_session()
        if self._owns_client:
            self.client.close()
        super().close()

    def _end_session(self) -> None:
        if self.session is not None:
            try:
                self.client.delete_session(self.session.session_id)
            except NotFound:  # expired already: nothing to free
                pass
            self.session = None
