"""What a tenant holds: its live sessions (a sorted set, scored by when each expires unless used
again) and the bytes it stores, counted against its quota (see ``service.stores.store``).

A tenant's keys share its hash tag (``Keys``), so each update of them is one script on one slot,
however many replicas write.
"""

from __future__ import annotations

import time
from typing import Any

from redis.exceptions import RedisError

from service.stores.redis.connection import Connection, translated
from service.stores.redis.keys import Keys
from service.stores.store import BytesQuota


class Tenants:
    def __init__(self, redis: Connection, keys: Keys, ttl: float) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_ms = int(ttl * 1000)
        self._reserve = redis.script("reserve")
        self._admit = redis.script("uncount", "settle", "admit")
        self._prune = redis.script("uncount", "settle", "prune")
        self._forget = redis.script("uncount", "forget")

    async def reserve(self, tenant: str, counts: dict[str, int], quota: int | None) -> None:
        """Count bytes for ``tenant`` (a session id or '#records' to its bytes), all or none.

        Raises:
            BytesQuota: they would take the tenant past ``quota``; nothing is counted.
        """
        pairs = [item for field, size in counts.items() for item in (field, size)]
        used = int(await self._reserve(keys=[self.keys.session_bytes(tenant), self.keys.record_bytes(tenant)],
                                       args=[-1 if quota is None else quota, *pairs]))
        if used >= 0:
            raise BytesQuota(used, sum(counts.values()), quota or 0)

    async def unreserve(self, tenant: str, counts: dict[str, int]) -> None:
        """Give back bytes counted for writes that then failed (best effort: Redis may be gone)."""
        try:
            await self.reserve(tenant, {field: -size for field, size in counts.items()}, None)
        except RedisError:
            pass

    @translated
    async def admit(self, tenant: str, session_ids: list[str], limit: int, ttl: float | None = None) -> int | None:
        now, due = await self._due(tenant)
        lives = self.ttl_ms if ttl is None else int(ttl * 1000)
        live = await self.redis.run(self._admit, [self.keys.live_sessions(tenant), self.keys.session_bytes(tenant)],
                                    [now, limit, now + lives, len(due) // 2, *due, *session_ids])
        return None if int(live) < 0 else int(live)

    async def _due(self, tenant: str) -> tuple[int, list[Any]]:
        """Now (ms), and the tenant's counted ids whose score has passed, each with when its session
        really expires (0: gone), for ``settle.lua``. Reads refresh a session's keys, never its score."""
        now = int(time.time() * 1000)
        due = [str(sid) for sid in await self.redis.client.zrangebyscore(self.keys.live_sessions(tenant), "-inf", now)]
        if not due:
            return now, []
        async with self.redis.client.pipeline(transaction=False) as pipe:  # (sessions on many slots of a cluster)
            for sid in due:
                pipe.pttl(self.keys.session(sid).meta)
            left: list[Any] = await pipe.execute()
        return now, [item for sid, ms in zip(due, left, strict=True)
                     for item in (sid, now + int(ms) if int(ms) > 0 else now + self.ttl_ms if int(ms) == -1 else 0)]

    @translated
    async def usage(self, tenant: str) -> int:
        async with self.redis.client.pipeline(transaction=False) as pipe:
            pipe.hget(self.keys.session_bytes(tenant), "#total")
            pipe.get(self.keys.record_bytes(tenant))
            sessions, records = await pipe.execute()
        return int(sessions or 0) + int(records or 0)

    @translated
    async def live(self, tenant: str, offset: int, limit: int) -> tuple[list[str], int]:
        now, due = await self._due(tenant)
        key = self.keys.live_sessions(tenant)
        if due:
            await self._prune(keys=[key, self.keys.session_bytes(tenant)], args=[now, -1, 0, len(due) // 2, *due])
        async with self.redis.client.pipeline(transaction=True) as pipe:
            pipe.zrangebyscore(key, now, "+inf", start=offset, num=limit)
            pipe.zcount(key, now, "+inf")
            ids, total = await pipe.execute()
        return [str(i) for i in ids], int(total)

    @translated
    async def forget(self, tenant: str, session_ids: list[str]) -> None:
        if session_ids:
            await self._forget(keys=[self.keys.live_sessions(tenant), self.keys.session_bytes(tenant)],
                               args=session_ids)
