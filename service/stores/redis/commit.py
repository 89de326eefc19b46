"""A step's commit, named field by field, and how it becomes ``commit.lua``'s KEYS and ARGV."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from service.stores.redis.keys import SessionKeys
from service.stores.store import Held, stored_bytes


class Mode(StrEnum):
    """How a step changes the session's state (the script's ``mode``)."""

    KEEP = "0"  # the state stays
    TEXT = "1"  # a new state, the session's own text
    DELTA = "2"  # changed fields of the state's delta against its base
    BASE = "3"  # a new base, which the session names (its delta emptied)


@dataclass(frozen=True)
class Commit:
    """``SessionStore.commit``'s arguments (documented there), by name."""

    session_id: str
    expected_step: int
    state: str | None
    record: str
    done: bool = False
    idempotency: tuple[str, str] | None = None
    tenant: str | None = None
    held: Held | None = None
    quota: int | None = None
    delta: dict[str, Any] | None = None
    new_base: str = ""
    unlocked: bool = False

    @property
    def mode(self) -> Mode:
        if self.state is not None:
            return Mode.BASE if self.new_base else Mode.TEXT
        return Mode.DELTA if self.delta is not None else Mode.KEEP

    def most_added(self) -> int:
        """The most bytes the step can add to what the session stores."""
        return stored_bytes(self.record) + (0 if self.state is None else stored_bytes(self.state)) + sum(
            stored_bytes(str(item)) for item in self._changes()[1:])

    def keys(self, session: SessionKeys, tenant: tuple[str, str, str] | None) -> list[str]:
        """The script's KEYS: the session's, then (``tenant``) the tenant's live sessions, session
        bytes and record bytes, for a commit that counts them in the same script."""
        return [session.meta, session.state, session.initial, session.trajectory, session.idempotency,
                session.lock, session.delta, *(tenant or ())]

    def argv(self, *, base: str, ttl_ms: int, expires_ms: int, base_ttl_ms: int, touch: str) -> list[Any]:
        """The script's ARGV, in the order ``commit.lua`` names them. ``base``: the new base's key
        (``Mode.BASE``); ``ttl_ms``: the store's idle TTL; ``expires_ms``: when that TTL ends the
        session (ms since the epoch); ``base_ttl_ms`` and ``touch`` as in ``Bases``."""
        mode = self.mode
        key, value = self.idempotency or ("", "")
        return [
            self.expected_step,
            mode.value,
            base if mode is Mode.BASE else self.state if mode is Mode.TEXT else "",
            self.record,
            ttl_ms,
            "1" if self.done else "0",
            key,
            value,
            self.held.token if self.held else "",
            self.session_id,
            expires_ms,
            -1 if self.quota is None else self.quota,
            base_ttl_ms,
            touch,
            stored_bytes(self.state) if mode is Mode.BASE and self.state is not None else 0,
            "1" if self.unlocked else "0",
            *self._changes(),
        ]

    def _changes(self) -> list[Any]:
        """The delta's part of ARGV: how many fields it sets, those fields and values, the fields it drops."""
        if self.mode is not Mode.DELTA or self.delta is None:
            return [0]
        changes = self.delta["set"]
        return [len(changes), *(item for pair in changes.items() for item in pair), *self.delta["unset"]]
