"""The frames of the sandbox protocol, one type per operation.

The service sends a worker one request at a time (``sandbox.pool``); the worker answers it
(``sandbox.worker.runtime``), writing calls and inits into the session's process and reading its answer;
or the service writes a call straight into a lent session's process (``sandbox.lane``). Every
frame is a JSON object (``sandbox.wire.protocol``); these are their fields, as the service builds and
reads them (the worker's ``Runtime.handle`` reads the same fields). Answers from a process that
ran environment code are judged by ``sandbox.wire.answers.checked`` before any field is used.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict


class Error(TypedDict):
    type: str  # a ``sandbox.wire.answers.ToolError``, or a worker's own kind (``load_error``, ``need_state``...)
    message: str


class Ending(TypedDict):
    sessions: list[str]  # sessions whose live process ends first
    envs: list[str]  # environments every process of which ends first


class Request(TypedDict, total=False):
    """What any request to a worker may carry besides its own fields."""

    id: int
    ending: Ending
    touched: list[str]  # sessions the service called straight since its last request
    stats: bool  # answer with ``memory``


class Limited(Request, total=False):
    """The per-call limits a request carries (``sandbox.wire.limits.Limits.call_fields``)."""

    timeout: float
    max_state_bytes: int
    max_result_bytes: int
    max_diff_bytes: int


class Load(Request, total=False):
    op: Literal["load"]
    env: str
    env_id: str
    class_name: str
    code: str
    layers: list[str]
    timeout: float


class Init(Limited, total=False):
    op: Literal["init"]
    env: str
    init_config: dict[str, Any]
    template: str  # a key naming this initial state: workers build it once (see ``WorkerPool.init_state``)
    known: str  # the digest of its state the service holds: the answer may leave the state out
    session: str  # keep the instance live for this session's calls
    next_version: int
    deltas: bool  # the state is the session's base: its calls answer what they changed
    lend: bool  # the service would call the kept process straight
    random: str  # the tag of the session's randomness (see ``sandbox.worker.randomness``)
    seed: int  # the session's seed: every draw reproducible


class Call(Limited, total=False):
    op: Literal["call"]
    env: str
    name: str
    arguments: dict[str, Any]
    deltas: bool
    state: str  # the stored state, when the worker holds no live instance at ``version``
    delta: dict[str, str]  # the stored delta against the base, with ``state``
    template: str
    init_config: dict[str, Any]
    known: str  # the digest of the base ``delta`` is against
    session: str
    version: int
    next_version: int
    lend: bool
    random: str  # as in ``Init``: for a rebuild, which stored randomness is the session's
    seed: int
    scope: str  # the session's tenant: a full worker may rebuild the session in its lodge
    lodged: bool  # (the worker's, to a lodge: see ``sandbox.worker.lodge``)
    forget: list[str]  # (the worker's, to a lodge) the sessions it must drop first
    state_bytes: int  # the length of the stored text left out (``template`` and ``delta`` make it)


class Score(Request, total=False):
    op: Literal["score"]
    env: str
    state: str
    initial: str
    checks: list[str]
    timeout: float


class Collect(Request, total=False):
    """A lent process did not answer its call properly: end it and say how it ended."""

    op: Literal["collect"]
    session: str
    outcome: Literal["timeout", "too_big", "ended"]
    timeout: float
    cap: int
    wait: float  # seconds to the call's deadline: a process that closed its pipe may run on that long


class Check(Limited, total=False):
    """The answer a lent process sent the service straight, too large for the service to read on its
    event loop: the worker decodes and checks it (``answers.checked``) and answers what passed."""

    op: Literal["check"]
    answer: bytes  # the process's frame body, as it came (carried after the JSON, see ``protocol``)
    deltas: bool


class Answer(TypedDict, total=False):
    """A worker's answer; the fields of each operation's answer besides those every answer may have."""

    id: int
    error: Error
    unhealthy: bool  # the worker can no longer start processes: replace it
    memory: dict[str, Any]  # with ``stats``
    ended: list[str]  # lent sessions whose process ended here since the last answer
    unprepared: bool  # it has hosts without a ready fork: ask it to ``prepare`` while idle
    gone: bool  # (``collect``) the process had ended here before the call reached it
    lent: bool  # the kept process's descriptors were sent on the lending socket just before


class CallAnswer(Answer, total=False):
    ok: bool
    result: Any
    state: str | None  # the new encoded state, or None (unchanged, or given as ``delta``)
    diff: dict[str, Any]
    delta: dict[str, Any]  # the fields the call set and unset, against the session's base
    rebase: bool  # ``state`` is to be the session's new base


class InitAnswer(Answer, total=False):
    state: str | None  # None: the ``known`` state
    digest: str
