"""Bases: states that sessions share, stored once per tenant under their digest (``Keys.base``), and
the texts of those this process read, kept (content-addressed, so never stale).

The bases a session reads are named in its meta; whatever refreshes the session's keys refreshes
them too, for twice the session TTL, so a base outlives every session that uses it. A cluster keeps
bases on the tenant's slot, out of a session script's reach: there the store refreshes them in a
command of their own (``touch`` is then '0').
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sandbox.state import deltas
from service.stores.redis.connection import Connection

BASE_FIELDS = ("state_base", "initial_base")
# Bases kept read in this process, least recently used first.
BASE_CACHE_BYTES = 64 << 20
PARSED_BASES = 8  # and kept parsed into parts, to compose states from their deltas
OFF_LOOP_BYTES = 256 * 1024  # bases this large are parsed and composed off the event loop

T = TypeVar("T")


@dataclass(frozen=True)
class Base:
    """A base a group of new sessions names: its key, its size, and whether it is their state too."""

    name: str
    size: int
    is_state: bool


def base_names(fields: dict[str, Any]) -> list[str]:
    """The keys of the bases a session's meta names."""
    return [str(fields[name]) for name in BASE_FIELDS if fields.get(name)]


def digest(name: str | None) -> str:
    """A base's digest, from its key (see ``Keys.base``)."""
    return name.rsplit(":", 1)[1] if name else ""


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class Bases:
    def __init__(self, redis: Connection, ttl: float) -> None:
        self.redis = redis
        self.ttl_ms = 2 * int(ttl * 1000)
        self.touch = "0" if redis.cluster else "1"  # whether the session scripts refresh bases themselves
        self._texts: OrderedDict[str, str] = OrderedDict()  # base key -> its text
        self._parsed: OrderedDict[str, deltas.Base] = OrderedDict()  # bases a delta was composed with
        self._bytes = 0

    async def keep(self, name: str, text: str) -> None:
        """Store a base unless it is there (then its TTL is refreshed: it is not sent again)."""
        if not await self.redis.client.pexpire(name, self.ttl_ms):
            await self.redis.client.set(name, text, px=self.ttl_ms)
        self._remember(name, text)

    def _remember(self, name: str, text: str) -> None:
        if name in self._texts:
            self._texts.move_to_end(name)
            return
        self._texts[name] = text
        self._bytes += len(text)
        while self._bytes > BASE_CACHE_BYTES and len(self._texts) > 1:
            _, dropped = self._texts.popitem(last=False)
            self._bytes -= len(dropped)

    async def refresh(self, names: Sequence[str | None], wanted: Sequence[str] = ()) -> dict[str, str] | None:
        """Refresh bases ``names`` (a cluster's session scripts cannot) and the texts of ``wanted``
        among them; None when one of them is gone (its sessions cannot be read any more)."""
        present = list(dict.fromkeys(n for n in names if n))
        if not present:
            return {}
        fetch = [n for n in dict.fromkeys(wanted) if n and n not in self._texts]
        async with self.redis.client.pipeline(transaction=False) as pipe:
            for name in present:
                pipe.pexpire(name, self.ttl_ms)
            for name in fetch:
                pipe.get(name)
            answers: list[Any] = await pipe.execute()
        if not all(answers[:len(present)]):
            return None
        for name, text in zip(fetch, answers[len(present):], strict=True):
            if text is None:
                return None
            self._remember(name, str(text))
        texts = {}
        for name in wanted:
            if name:
                texts[name] = self._texts[name]
                self._texts.move_to_end(name)
        return texts

    async def composed(self, meta: dict[str, str], state: str | None, fields: dict[str, str],
                       texts: dict[str, str] | None) -> str | None:
        """The session's state: its own text, or its base and its delta composed (off the event loop
        when the base is large); None when its base is gone or the delta does not fit it."""
        name = meta.get("state_base", "")
        if state is not None or not name:
            return state
        found = await self.refresh([name], [name]) if texts is None or name not in texts else texts
        if found is None:
            return None
        if not fields:
            return found[name]
        parsed = self._parsed.get(name)
        try:
            if parsed is None:
                parsed = await _off_loop(deltas.Base, found[name])
                self._parsed[name] = parsed
                while len(self._parsed) > PARSED_BASES:
                    self._parsed.popitem(last=False)
            self._parsed.move_to_end(name)
            return await _off_loop(deltas.compose, parsed, fields) if parsed.size > OFF_LOOP_BYTES \
                else deltas.compose(parsed, fields)
        except ValueError:
            return None  # (a delta only its own session's forged answers could have made)
