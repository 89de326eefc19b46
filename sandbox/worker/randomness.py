"""Randomness in a session's process as in a fresh one, and reproducible on request.

Every session process is a fork (of its environment's host, or of a template holding an instance
built already), and CPython reseeds the ``random`` module in a forked child. Left alone, that
would undo a ``random.seed(42)`` an ``__init__`` made, and a template would hand every session
the same tokens its ``__init__`` drew. So:

- ``install`` (in the zygote, before any environment code) wraps what draws from the operating
  system: ``os.urandom`` (``uuid.uuid4``), ``random._urandom`` (``random.SystemRandom``,
  ``secrets``), ``random.Random.seed`` without a seed (a new ``random.Random()``) and
  ``uuid.uuid1``. The wrappers count draws, so a template can tell an ``__init__`` that drew (its
  sessions then build their instance themselves); in a seeded session they draw from a generator
  seeded from the session's seed instead.
- ``Stream`` is a session's randomness: the ``random`` module's state and, when seeded, that
  generator's. Once the session has drawn, both are kept in the stored state under ``HIDDEN``,
  a key the service keeps to itself, which the state's
  view and check functions never see. A rebuilt session goes on from there, as one process
  would. A stream is named by a tag the service gives each session (a fork keeps its parent's,
  a reseeded fork and each member of a group get their own): a stored stream of another tag (the
  shared initial state of a group) is not the session's, which then starts its own.

``random.Random`` instances an environment keeps in its state are stored with it (pickled by the
codec), so they go on after a rebuild by themselves. Standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import struct
import uuid
from typing import Any

HIDDEN = "__random__"
_WORDS = struct.Struct("<625I")  # a Mersenne Twister's state, as ``random.getstate`` gives it

_generator: random.Random | None = None  # in a seeded session: what the OS sources draw from
_draws = 0  # draws from the OS sources (and unseeded ``random.Random``\\ s) in this process
_installed = False
# The module's generator was seeded by environment code with a value of its own: its stream is then
# marked (its tag starts with ``CHOSEN``) and carried to every session that starts from it.
_chosen = False
CHOSEN = "="


def derived(seed: int, index: int) -> int:
    """Member ``index``'s seed in a group created with ``seed`` (63 bits, the same everywhere)."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def install() -> None:
    """Wrap the OS randomness sources (once per process tree; forks inherit the wrappers)."""
    global _installed
    if _installed:
        return
    _installed = True
    system_urandom = os.urandom
    plain_seed = random.Random.seed
    plain_uuid1 = uuid.uuid1
    module_seed = random.seed

    def urandom(size: int, /) -> bytes:
        global _draws
        _draws += 1
        if _generator is not None:
            if size < 0:
                raise ValueError("negative argument not allowed")
            return _generator.randbytes(size)
        return system_urandom(size)

    def seed(self: random.Random, a: Any = None, version: int = 2) -> None:
        global _draws
        if a is None:  # seeded from the OS
            _draws += 1
            if _generator is not None:
                a = int.from_bytes(_generator.randbytes(32), "big")
        plain_seed(self, a, version)

    def uuid1(node: int | None = None, clock_seq: int | None = None) -> uuid.UUID:
        global _draws
        _draws += 1
        return plain_uuid1(node, clock_seq)

    def seed_module(a: Any = None, version: int = 2) -> None:
        global _chosen
        if a is not None:
            _chosen = True
        module_seed(a, version)

    urandom.__doc__ = system_urandom.__doc__
    random.seed = seed_module  # (``random.seed`` is bound to the module's generator at import)
    os.urandom = urandom
    random._urandom = urandom  # type: ignore[attr-defined]  # SystemRandom and secrets draw here
    random.Random.seed = seed  # type: ignore[method-assign]
    uuid.uuid1 = uuid1


def draws() -> int:
    return _draws


class Stream:
    """A session's randomness in its process (see the module's docstring)."""

    def __init__(self) -> None:
        self.tag: str | None = None
        self.states: tuple[Any, Any] | None = None  # as last looked at
        self.value: str | None = None  # what the stored state holds under ``HIDDEN`` (None: nothing)
        self.chosen = False  # the environment had seeded the ``random`` module itself, when last looked at

    def begin(self, request: dict[str, Any], stored: Any = None) -> None:
        """Set this process's randomness for the session of ``request``: the ``stored`` stream (the
        value under ``HIDDEN``) if it is the session's, else a new one, from the request's
        ``seed`` if it has one. A request naming no stream (``random``) takes any stored one."""
        global _generator, _chosen
        tag = request.get("random")
        tag = tag if type(tag) is str else None
        seed = request.get("seed")
        found = _unpack(stored) if type(stored) is str else None
        # A stream the environment seeded itself (``random.seed(42)``) is what a plain process would
        # go on with, whichever session holds it: a group's member or a fork, unless given a seed.
        chosen = found is not None and found[0].startswith(CHOSEN) and type(seed) is not int
        _chosen = False
        own = found is not None and (tag is None or found[0].removeprefix(CHOSEN) == tag)
        if found is not None and (own or chosen) and _restore(found[1], found[2]):
            tag = found[0]
            _chosen = tag.startswith(CHOSEN)
            self.value = stored
        else:
            if type(seed) is int:
                random.seed(seed)
                _generator = random.Random(f"{seed}/os")
            else:
                random.seed()  # (a fresh process's own: the fork was reseeded, but say so)
                _generator = None
            _chosen = False  # (the service's seeding, not the environment's)
            # Another stream's (a group's shared initial state): kept as stored until this one draws.
            self.value = stored if type(stored) is str else None
        self.tag = tag
        self.states = _states()
        self.chosen = _chosen

    def resume(self) -> None:
        """Put this process's randomness back where this session's last call left it: in a process
        serving many sessions (``sandbox.worker.lodge``) another's call has drawn since."""
        global _chosen
        if self.states is not None:
            _restore(*self.states)
        _chosen = self.chosen

    def current(self) -> str | None:
        """The value to store under ``HIDDEN`` now: None while the session has not drawn."""
        self.chosen = _chosen
        states = _states()
        if states != self.states:
            self.states = states
            tag = self.tag or ""
            if _chosen and not tag.startswith(CHOSEN):
                tag = self.tag = CHOSEN + tag
            self.value = _pack(tag, states)
        return self.value


def _states() -> tuple[Any, Any]:
    return random.getstate(), None if _generator is None else _generator.getstate()


def _restore(module: Any, generator: Any) -> bool:
    """Put the ``random`` module and the generator back where a stored stream says; False (and
    nothing changed) if the states are not ones ``random`` takes."""
    global _generator
    restored = None
    try:
        if generator is not None:
            restored = random.Random(0)
            restored.setstate(generator)
        random.setstate(module)
    except (ValueError, TypeError, OverflowError):
        return False
    _generator = restored
    return True


def _pack(tag: str, states: tuple[Any, Any]) -> str:
    return "|".join([tag, _pack_state(states[0]), "" if states[1] is None else _pack_state(states[1])])


def _pack_state(state: Any) -> str:
    version, words, gauss = state
    text = base64.b64encode(_WORDS.pack(*words)).decode("ascii")
    return text if gauss is None else f"{text},{float(gauss).hex()}"


def _unpack(value: str) -> tuple[str, Any, Any] | None:
    """(tag, module state, generator state or None) from a stored value; None if it is not one."""
    try:
        tag, module, generator = value.split("|")
        return tag, _unpack_state(module), _unpack_state(generator) if generator else None
    except (ValueError, struct.error, TypeError):
        return None


def _unpack_state(text: str) -> Any:
    words, _, gauss = text.partition(",")
    return 3, _WORDS.unpack(base64.b64decode(words, validate=True)), float.fromhex(gauss) if gauss else None
