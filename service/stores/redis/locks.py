"""A session's call lock: a key holding a random token, with a short lease the holder renews while
it works, so a holder that dies (kill -9) blocks the session for at most ``HEARTBEAT`` seconds, not
the longest request. Only the token's holder releases or renews it (``release.lua``,
``renew.lua``); the commit's compare-and-set on the step keeps steps exact even when a lease ran out.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from redis.exceptions import RedisError

from service.stores.redis.bases import Bases, base_names
from service.stores.redis.connection import Connection, translated
from service.stores.redis.keys import Keys
from service.stores.redis.sessions import meta_snapshot
from service.stores.store import Held, LockTimeout

# How long a lock outlives a holder that stopped renewing it.
HEARTBEAT = 10.0

T = TypeVar("T")


class Keeper:
    """A lock's renewal: a timer, then (for a long holder) the task that renews the lease."""

    timer: asyncio.TimerHandle | None = None
    task: asyncio.Task[None] | None = None

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


class Locks:
    def __init__(self, redis: Connection, keys: Keys, ttl: float, bases: Bases) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl = ttl
        self.bases = bases
        # Call locks whose release failed because Redis was down: released once it is back, so a
        # session is not blocked for a whole lease after an outage (key -> token).
        self._unreleased: dict[str, str] = {}
        self._begin = redis.script("touch_bases", "session_ttl", "begin")
        self._release = redis.script("release")
        self._renew = redis.script("renew")

    @asynccontextmanager
    async def lock(self, session_id: str, wait: float, lease: float) -> AsyncIterator[None]:
        key = self.keys.session(session_id).lock
        token = secrets.token_hex(16)
        held = min(lease, HEARTBEAT)
        await self._acquire(key, token, wait, held, session_id)
        keeper = self._keep_later(key, token, held)
        try:
            yield
        finally:
            keeper.cancel()
            try:
                await self._release(keys=[key], args=[token])
            except RedisError:
                self._unreleased[key] = token  # released when Redis answers again; else the lease ends it

    @asynccontextmanager
    async def begin(self, session_id: str, wait: float, lease: float) -> AsyncIterator[Held]:
        """``lock`` and a meta-only ``load`` in one script; a commit given the result unlocks too."""
        k = self.keys.session(session_id)
        token = secrets.token_hex(16)
        lease = min(lease, HEARTBEAT)
        meta = await self._begin_locked([k.lock, *k.kept()], token, wait, lease, session_id)
        if not meta:
            yield Held(None, token, released=True)
            return
        pairs = iter(meta)
        fields = dict(zip(pairs, pairs, strict=True))
        held = Held(meta_snapshot(fields, self.ttl), token, bases=base_names(fields))
        if self.redis.cluster and held.bases:
            await self._touch_bases(held.bases)
        keeper = self._keep_later(k.lock, token, lease)
        try:
            yield held
        finally:
            keeper.cancel()
            if not held.released:
                try:
                    await self._release(keys=[k.lock], args=[token])
                except RedisError:
                    self._unreleased[k.lock] = token

    @translated
    async def _begin_locked(self, keys: list[str], token: str, wait: float, lease: float,
                            session_id: str) -> list[str]:
        async def take() -> list[str] | None:
            meta = await self.redis.run(self._begin, keys, [token, int(lease * 1000), int(self.ttl * 1000),
                                                            self.bases.ttl_ms, self.bases.touch])
            return None if meta is None else list(meta)

        return await self._until_free(take, wait, session_id)

    def _keep_later(self, key: str, token: str, lease: float) -> Keeper:
        """Renew the lease from a third of the way through it, only if the holder is still at work
        then (most calls end long before: no task for them)."""
        keeper = Keeper()

        def start() -> None:
            keeper.task = asyncio.get_running_loop().create_task(self._keep(key, token, lease))

        keeper.timer = asyncio.get_running_loop().call_later(lease / 3, start)
        return keeper

    async def _release_stale(self) -> None:
        for stale, stale_token in list(self._unreleased.items()):
            await self._release(keys=[stale], args=[stale_token])
            del self._unreleased[stale]

    @translated
    async def _touch_bases(self, names: Sequence[str | None]) -> None:
        await self.bases.refresh(names)

    @translated
    async def _acquire(self, key: str, token: str, wait: float, lease: float, session_id: str) -> None:
        async def take() -> bool | None:
            return await self.redis.client.set(key, token, nx=True, px=int(lease * 1000)) or None

        await self._until_free(take, wait, session_id)

    async def _until_free(self, attempt: Callable[[], Coroutine[Any, Any, T | None]], wait: float,
                          session_id: str) -> T:
        """Repeat ``attempt`` (taking a session's lock) with a growing pause until it gives something.

        Raises:
            LockTimeout: the session stayed locked for ``wait`` seconds.
        """
        await self._release_stale()
        deadline = time.monotonic() + wait
        delay = 0.002
        while (taken := await attempt()) is None:
            if time.monotonic() >= deadline:
                raise LockTimeout(f"session {session_id} stayed busy for {wait:g} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        return taken

    async def _keep(self, key: str, token: str, held: float) -> None:
        while True:
            await asyncio.sleep(held / 3)
            try:
                await self._renew(keys=[key], args=[token, int(held * 1000)])
            except RedisError:
                pass  # Redis is away: the commit's compare-and-set still keeps steps exact
