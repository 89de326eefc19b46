"""Environment classes for trainers that take a class of tools, such as TRL's ``environment_factory``.

    from envfoundry_client.factory import dataset_rows, environment_factory
    Library = environment_factory("http://127.0.0.1:8000", "library_circulation")
    trainer = GRPOTrainer(model=..., train_dataset=Dataset.from_list(dataset_rows(URL, "library_circulation")),
                          environment_factory=Library)

The class has one public method per tool of the environment, with the tool's parameters and a
Google-style docstring made from its JSON Schema (see ``signatures``), so a trainer that builds
tool schemas from methods gives the model the service's schemas. Each instance is one rollout:

- ``reset(scenario_id=..., **row)`` opens a session on that scenario (other row fields are
  ignored), closing the instance's previous one, and returns the task (in conversation mode the
  simulated user's first message) for the trainer to append to the prompt;
- a tool method calls the tool in that session and returns the observation text (a failed call
  says why, as an observation: the session is unchanged);
- ``get_reward()`` scores the session (passed checks / checks; NaN for a scenario without checks);
- in conversation mode, ``talk_to_user(content)`` talks to the simulated user.

A session is deleted when its instance is reset again or garbage-collected (or at exit). One
HTTP connection pool serves every instance of a class (pass ``client=`` to share or close one of
your own).
"""

from __future__ import annotations

import math
import weakref
from typing import Any

from envfoundry_client.client import Client
from envfoundry_client.errors import EnvfoundryError
from envfoundry_client.models import Mode
from envfoundry_client.signatures import JSON, plain_name, tool_function

RESERVED = frozenset({"reset", "get_reward"})
USER_TOOL = "talk_to_user"  # conversation mode only (an environment may have a send_message tool of its own)


def _delete(client: Client, session_id: str) -> None:
    try:
        client.delete_session(session_id)
    except (EnvfoundryError, RuntimeError):
        pass  # expired, deleted elsewhere, the service or the client closed: nothing is left to clean up


class SessionTools:
    """What every generated class shares; its subclasses add one method per tool."""

    _client: Client
    _env_id: str
    _mode: Mode = "task"

    def __init__(self) -> None:
        self._session: str | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def session_id(self) -> str | None:
        """The session the current rollout runs in (None before the first reset)."""
        return self._session

    def reset(self, scenario_id: str | None = None, **row: Any) -> str | None:
        """Open a session on ``scenario_id`` (else on the environment's default state); the task is returned.

        Raises:
            NotFound: no such scenario. ValueError: the scenario is of another environment.
        """
        self._close()
        if scenario_id is None:
            session = self._client.create_session(env_id=self._env_id, mode=self._mode)
        else:
            session = self._client.create_session(scenario_id, mode=self._mode)
        self._session = session.session_id
        self._finalizer = weakref.finalize(self, _delete, self._client, session.session_id)
        if session.env_id != self._env_id:
            self._close()
            raise ValueError(f"scenario {scenario_id!r} is of environment {session.env_id!r}, not {self._env_id!r}")
        return session.user_message if self._mode == "conversation" else session.task

    def get_reward(self) -> float:
        """The session's score now: passed checks / checks (NaN when the scenario has none)."""
        reward = self._client.score(self._held()).reward
        return math.nan if reward is None else reward

    def _call(self, name: str, arguments: JSON) -> str:
        return self._client.call(self._held(), name, arguments).observation

    def _held(self) -> str:
        if self._session is None:
            raise RuntimeError("call reset() first: it opens the session the tools act on")
        return self._session

    def _close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._session, self._finalizer = None, None


class ConversationTools(SessionTools):
    """Conversation mode: the simulated user holds the task, and the agent talks to it with a tool."""

    _mode: Mode = "conversation"

    def talk_to_user(self, content: str) -> str:
        """Say something to the user you are helping; their reply is returned.

        Args:
            content: What you say to the user.
        """
        return self._client.send_message(self._held(), content).reply


def environment_factory(base_url: str, env_id: str, *, api_key: str | None = None, mode: Mode = "task",
                        timeout: float = 120.0, client: Client | None = None) -> type[SessionTools]:
    """A class of ``env_id``'s tools whose instances are rollouts on the service at ``base_url``.

    Raises:
        NotFound: no such environment.
        ValueError: a tool's name cannot be a Python method, or is reset, get_reward (or, in conversation
            mode, talk_to_user).
    """
    http = client or Client(base_url, api_key=api_key, timeout=timeout)
    environment = http.get_environment(env_id)
    namespace: dict[str, Any] = {"_client": http, "_env_id": env_id, "_mode": mode,
                                 "__doc__": f"Rollouts on envfoundry's {env_id}: {environment.summary}"}
    for tool in environment.tools:
        name = tool.get("function", {}).get("name")
        if name in RESERVED or (mode == "conversation" and name == USER_TOOL):
            raise ValueError(f"tool {name!r} of {env_id} has the name of a method the trainer calls itself")
        namespace[name] = tool_function(tool, SessionTools._call)
    class_name = "".join(part.capitalize() for part in env_id.split("_") if part) or "Environment"
    base = ConversationTools if mode == "conversation" else SessionTools
    return type(class_name if plain_name(class_name) else "Environment", (base,), namespace)


def dataset_rows(base_url: str, env_id: str, *, api_key: str | None = None, repeat: int = 1) -> list[JSON]:
    """One training row per scenario of ``env_id``: ``{"prompt": [...], "scenario_id": ...}``.

    The prompt is the environment's introduction and rules; ``reset`` appends the task to it.
    """
    with Client(base_url, api_key=api_key) as http:
        environment = http.get_environment(env_id)
        scenarios = http.list_scenarios(env_id)
    rules = "\n".join(f"- {rule}" for rule in environment.rules)
    system = f"{environment.introduction}\n\nRules:\n{rules}" if rules else environment.introduction
    rows: list[JSON] = []
    for scenario in scenarios:
        prompt = [{"role": "system", "content": system}, {"role": "user", "content": "Task: "}]
        rows += [{"prompt": prompt, "scenario_id": scenario.scenario_id} for _ in range(repeat)]
    return rows
