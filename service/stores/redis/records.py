"""A tenant's catalog records (environments, scenarios and their versions), one hash per kind, their
bytes counted against the tenant's quota."""

from __future__ import annotations

from redis.exceptions import RedisError, ResponseError

from service.stores.redis.connection import Connection, translated
from service.stores.redis.keys import Keys
from service.stores.redis.tenants import Tenants
from service.stores.store import RecordLimit, StoreError, stored_bytes


class Records:
    def __init__(self, redis: Connection, keys: Keys, tenants: Tenants) -> None:
        self.redis = redis
        self.keys = keys
        self.tenants = tenants
        self._put = redis.script("put_record")

    async def put(self, kind: str, key: str, value: str, *, tenant: str = "",
                  limit: int | None = None, quota: int | None = None) -> str | None:
        size = {"#records": stored_bytes(value)}
        try:
            known = await self.redis.client.hget(self.keys.records(kind, tenant), key)
            if known is not None:
                return str(known)  # (not counted against the quota: nothing is written)
            await self.tenants.reserve(tenant, size, quota)
            try:
                existing = await self._put(keys=[self.keys.records(kind, tenant)],
                                           args=[key, value, -1 if limit is None else limit])
            except BaseException:
                await self.tenants.unreserve(tenant, size)
                raise
        except ResponseError as exc:
            if "record limit" in str(exc):
                raise RecordLimit(f"{kind}: at most {limit}") from exc
            raise StoreError(f"redis: {exc}") from exc
        except RedisError as exc:
            raise StoreError(f"redis: {exc}") from exc
        if existing is not None:
            await self.tenants.unreserve(tenant, size)  # nothing was written
        return None if existing is None else str(existing)

    @translated
    async def set(self, kind: str, key: str, value: str, *, tenant: str = "", quota: int | None = None) -> None:
        name = self.keys.records(kind, tenant)
        old = int(await self.redis.client.hstrlen(name, key))
        # (the bytes of a record replaced concurrently may be counted a little off; never a write lost)
        grown = stored_bytes(value) - old
        await self.tenants.reserve(tenant, {"#records": grown}, quota if grown > 0 else None)
        try:
            await self.redis.client.hset(name, key, value)
        except BaseException:
            await self.tenants.unreserve(tenant, {"#records": grown})
            raise

    @translated
    async def get(self, kind: str, key: str, *, tenant: str = "") -> str | None:
        value = await self.redis.client.hget(self.keys.records(kind, tenant), key)
        return None if value is None else str(value)

    @translated
    async def all(self, kind: str, *, tenant: str = "") -> dict[str, str]:
        records = await self.redis.client.hgetall(self.keys.records(kind, tenant))
        return {str(k): str(v) for k, v in records.items()}

    @translated
    async def delete(self, kind: str, key: str, *, tenant: str = "") -> bool:
        name = self.keys.records(kind, tenant)
        async with self.redis.client.pipeline(transaction=True) as pipe:
            pipe.hstrlen(name, key)
            pipe.hdel(name, key)
            size, removed = await pipe.execute()
        if int(removed) > 0:
            await self.tenants.reserve(tenant, {"#records": -int(size)}, None)
        return int(removed) > 0
