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

Each session is deleted when its instance is reset again or collected, and whatever is still
open is deleted at exit, on SIGTERM or SIGHUP (see ``leases``), so an interrupted run leaves
nothing behind. After SIGKILL the service reaps them once idle for ``idle_ttl_seconds`` (a
parameter, else ``ENVFOUNDRY_SESSION_IDLE_SECONDS``, else the service's ``ENVFOUNDRY_SESSION_TTL``).
One HTTP connection pool serves every instance of a class (pass ``client=`` to share or close one
of your own). Its retries ride over a restart of the service (30 s by default; ``Retry``).

A rollout whose session failed (lost in a restart of a memory-store service, expired, or a call
that went unanswered past the retry budget) is not scored: the tool methods raise a
``RolloutFailed`` naming the cause, which TRL shows the model, and ``get_reward()`` returns None,
which TRL leaves out of the sum (it warns), and warns itself with the cause.

The class pickles (by what made it: the service, the environment and its tool schemas, not by
name), as TRL's AsyncGRPOTrainer needs; an instance pickles as a fresh one, without a session.
"""

from __future__ import annotations

import copyreg
import math
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from envfoundry_client import leases
from envfoundry_client.client import Client
from envfoundry_client.errors import EnvfoundryError, NotFound
from envfoundry_client.exchange import Config
from envfoundry_client.models import Mode
from envfoundry_client.signatures import JSON, plain_name, tool_function

RESERVED = frozenset({"reset", "get_reward", "failure", "session_id"})
USER_TOOL = "talk_to_user"  # conversation mode only (an environment may have a send_message tool of its own)
T = TypeVar("T")


class RolloutFailed(EnvfoundryError):
    """The rollout's session failed outside the agent: what it did cannot be scored."""


def _delete(client: Client, session_id: str) -> None:
    try:
        client.delete_session(session_id)
    except NotFound:
        pass  # expired or deleted elsewhere: nothing is left
    except (EnvfoundryError, RuntimeError):
        return  # the service is away (a restart) or the client closed: leases tries again at exit
    leases.release(session_id)


class SessionTools:
    """What every generated class shares; its subclasses add one method per tool."""

    _client: Client
    _env_id: str
    _mode: Mode = "task"
    _idle_ttl: float | None = None  # None: ENVFOUNDRY_SESSION_IDLE_SECONDS, else the service's TTL

    def __init__(self) -> None:
        self._session: str | None = None
        self._scenario: str | None = None
        self._failure: str | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {}  # a session belongs to one process: a copy starts without one

    def __setstate__(self, state: dict[str, Any]) -> None:
        SessionTools.__init__(self)

    @property
    def session_id(self) -> str | None:
        """The session the current rollout runs in (None before the first reset)."""
        return self._session

    @property
    def failure(self) -> str | None:
        """Why the current rollout cannot be scored (None while it can)."""
        return self._failure

    def reset(self, scenario_id: str | None = None, **row: Any) -> str | None:
        """Open a session on ``scenario_id`` (else on the environment's default state); the task is returned.

        Raises:
            NotFound: no such scenario. ValueError: the scenario is of another environment.
        """
        self._close()
        self._failure, self._scenario = None, scenario_id
        if scenario_id is None:
            session = self._client.create_session(env_id=self._env_id, mode=self._mode,
                                                  idle_ttl_seconds=self._idle_ttl)
        else:
            session = self._client.create_session(scenario_id, mode=self._mode, idle_ttl_seconds=self._idle_ttl)
        self._session = session.session_id
        leases.hold(self._client.config, session.session_id)
        self._finalizer = weakref.finalize(self, _delete, self._client, session.session_id)
        self._finalizer.atexit = False  # leases closes what is left at exit, with a client of its own
        if session.env_id != self._env_id:
            self._close()
            raise ValueError(f"scenario {scenario_id!r} is of environment {session.env_id!r}, not {self._env_id!r}")
        return session.user_message if self._mode == "conversation" else session.task

    def get_reward(self) -> float | None:
        """The session's score now: passed checks / checks (NaN when the scenario has none); None
        when the rollout failed outside the agent (see ``failure``), with a warning saying why."""
        if self._failure is None:
            try:
                reward = self._client.score(self._held()).reward
            except EnvfoundryError as exc:
                self._fail(exc)
            else:
                return math.nan if reward is None else reward
        warnings.warn(f"envfoundry: not scored: {self._failure}", RuntimeWarning, stacklevel=2)
        return None

    def _call(self, name: str, arguments: JSON) -> str:
        return self._service(lambda session: self._client.call(session, name, arguments).observation)

    def _service(self, send: Callable[[str], T]) -> T:
        """Run one request on the session; a failure of the service fails the rollout, and says so."""
        session = self._held()
        if self._failure is not None:
            raise RolloutFailed(self._failure)
        try:
            return send(session)
        except EnvfoundryError as exc:
            self._fail(exc)
            raise RolloutFailed(self._failure) from exc

    def _fail(self, exc: EnvfoundryError) -> None:
        where = f"session {self._session} (scenario {self._scenario or 'default'} of {self._env_id})"
        if isinstance(exc, NotFound):
            why = "is gone: the service restarted on a memory store, or the session expired"
        else:
            why = f"failed: {exc}"
        self._failure = f"{where} {why}; this rollout cannot be scored"

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
        return self._service(lambda session: self._client.send_message(session, content).reply)


@dataclass(frozen=True)
class Spec:
    """What makes a class: enough to make it again in another process (pickle)."""

    name: str
    env_id: str
    mode: Mode
    doc: str
    tools: tuple[JSON, ...]
    config: Config
    idle_ttl: float | None = None


class ToolClass(type):
    """The metaclass of generated classes, so that pickle takes them by their ``Spec``, not by name."""


def _reduce(cls: ToolClass) -> Any:
    spec = cls.__dict__.get("_spec")
    return cls.__qualname__ if spec is None else (_build, (spec,))  # a class of this module: by name


copyreg.pickle(ToolClass, _reduce)


def _client_for(config: Config) -> Client:
    return Client(config.base_url, headers=config.headers, timeout=config.timeout, retry=config.retry)


def _build(spec: Spec, client: Client | None = None) -> type[SessionTools]:
    http = client or _client_for(spec.config)
    namespace: dict[str, Any] = {"_client": http, "_env_id": spec.env_id, "_mode": spec.mode, "_spec": spec,
                                 "_idle_ttl": spec.idle_ttl, "__doc__": spec.doc, "__module__": __name__}
    for tool in spec.tools:
        namespace[tool["function"]["name"]] = tool_function(tool, SessionTools._call)
    base = ConversationTools if spec.mode == "conversation" else SessionTools
    made = cast(type[SessionTools], ToolClass(spec.name, (base,), namespace))
    if client is None:
        weakref.finalize(made, http.close)  # its own pool: closed with the class (a rebuilt one, here)
    return made


def environment_factory(base_url: str, env_id: str, *, api_key: str | None = None, mode: Mode = "task",
                        timeout: float = 120.0, client: Client | None = None,
                        idle_ttl_seconds: float | None = None) -> type[SessionTools]:
    """A class of ``env_id``'s tools whose instances are rollouts on the service at ``base_url``.

    ``idle_ttl_seconds``: each rollout's session expires that long after its last call (default:
    ``ENVFOUNDRY_SESSION_IDLE_SECONDS``, else the service's TTL), so a SIGKILL leaks nothing for long.

    Raises:
        NotFound: no such environment.
        ValueError: a tool's name cannot be a Python method, or is reset, get_reward (or, in conversation
            mode, talk_to_user).
    """
    http = client or Client(base_url, api_key=api_key, timeout=timeout)
    leases.install()  # from the main thread, where signal handlers can be set
    environment = http.get_environment(env_id)
    for tool in environment.tools:
        name = tool.get("function", {}).get("name")
        if name in RESERVED or (mode == "conversation" and name == USER_TOOL):
            raise ValueError(f"tool {name!r} of {env_id} has the name of a method the trainer calls itself")
    class_name = "".join(part.capitalize() for part in env_id.split("_") if part) or "Environment"
    spec = Spec(class_name if plain_name(class_name) else "Environment", env_id, mode,
                f"Rollouts on envfoundry's {env_id}: {environment.summary}", tuple(environment.tools), http.config,
                idle_ttl_seconds)
    made = _build(spec, http)
    if client is None:
        weakref.finalize(made, http.close)  # the pool this call made: closed with the class
    return made


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
