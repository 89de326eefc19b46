"""Claims on the idempotency keys of requests that create sessions (create, fork): a claim becomes
the stored answer on success and is released on failure (``service.engine.idempotency``)."""

from __future__ import annotations

from service.stores.redis.connection import Connection, translated
from service.stores.redis.keys import Keys


class Claims:
    def __init__(self, redis: Connection, keys: Keys, ttl: float) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_ms = int(ttl * 1000)

    @translated
    async def claim(self, key: str, value: str, lease: float) -> str | None:
        name = self.keys.request(key)
        if await self.redis.client.set(name, value, nx=True, px=int(lease * 1000)):
            return None
        existing = await self.redis.client.get(name)
        return "" if existing is None else str(existing)

    @translated
    async def finish(self, key: str, value: str) -> None:
        await self.redis.client.set(self.keys.request(key), value, px=self.ttl_ms)

    @translated
    async def release(self, key: str) -> None:
        await self.redis.client.delete(self.keys.request(key))
