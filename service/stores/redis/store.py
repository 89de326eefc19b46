"""The Redis session store: any API process sharing the Redis can serve any session.

It is the ``SessionStore`` contract (``service.stores.store``) over its parts, one module each:
``connection`` (the client, the pipeline, the scripts, Redis errors made ours), ``sessions`` (and
``commit``), ``locks``, ``bases``, ``tenants`` (live counts and quotas), ``records`` (the catalog)
and ``claims`` (idempotent creates). Every key name is built in ``keys``; the Lua scripts are in
``lua/``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

from service.stores.redis.bases import Bases
from service.stores.redis.claims import Claims
from service.stores.redis.commit import Commit
from service.stores.redis.connection import Connection, translated
from service.stores.redis.keys import Keys
from service.stores.redis.locks import Locks
from service.stores.redis.records import Records
from service.stores.redis.sessions import Sessions
from service.stores.redis.tenants import Tenants
from service.stores.store import SESSION_TTL, Held, SessionMeta, Snapshot


class RedisStore:
    def __init__(self, url: str | None, ttl: float = SESSION_TTL, prefix: str = "ef", *,
                 cluster_nodes: str | None = None) -> None:
        self.ttl = ttl
        self.keys = Keys(prefix)
        self.redis = Connection(url, cluster_nodes)
        self.tenants = Tenants(self.redis, self.keys, ttl)
        self.bases = Bases(self.redis, ttl)
        self.sessions = Sessions(self.redis, self.keys, ttl, self.bases, self.tenants)
        self.locks = Locks(self.redis, self.keys, ttl, self.bases)
        self.records = Records(self.redis, self.keys, self.tenants)
        self.claims = Claims(self.redis, self.keys, ttl)

    async def create(self, meta: SessionMeta, state: str, initial: str, trajectory: list[str], *,
                     quota: int | None = None) -> None:
        await self.sessions.create_group([meta], state, initial, trajectory, quota=quota)

    async def create_group(self, metas: list[SessionMeta], state: str, initial: str, trajectory: list[str], *,
                           quota: int | None = None, initial_digest: str = "",
                           delta: dict[str, str] | None = None) -> None:
        await self.sessions.create_group(metas, state, initial, trajectory, quota=quota,
                                         initial_digest=initial_digest, delta=delta)

    async def copy(self, source: SessionMeta, metas: list[SessionMeta], *, quota: int | None = None) -> bool:
        return await self.sessions.copy(source, metas, quota=quota)

    async def load(self, session_id: str, *, trajectory: bool = False, blobs: bool = True,
                   current: bool = True) -> Snapshot | None:
        return await self.sessions.load(session_id, trajectory=trajectory, blobs=blobs, current=current)

    async def state(self, session_id: str) -> str | None:
        found = await self.sessions.stored(session_id)
        return None if found is None else found[0]

    async def stored(self, session_id: str) -> tuple[str, dict[str, str] | None] | None:
        return await self.sessions.stored(session_id)

    async def commit(self, session_id: str, expected_step: int, state: str | None, record: str, *,
                     done: bool = False, idempotency: tuple[str, str] | None = None, tenant: str | None = None,
                     held: Held | None = None, quota: int | None = None, delta: dict[str, Any] | None = None,
                     new_base: str = "", unlocked: bool = False) -> bool:
        return await self.sessions.commit(Commit(
            session_id, expected_step, state, record, done=done, idempotency=idempotency, tenant=tenant,
            held=held, quota=quota, delta=delta, new_base=new_base, unlocked=unlocked))

    def begin(self, session_id: str, wait: float, lease: float) -> AbstractAsyncContextManager[Held]:
        return self.locks.begin(session_id, wait, lease)

    def lock(self, session_id: str, wait: float, lease: float) -> AbstractAsyncContextManager[None]:
        return self.locks.lock(session_id, wait, lease)

    async def idempotent(self, session_id: str, key: str) -> str | None:
        return await self.sessions.idempotent(session_id, key)

    async def trajectory(self, session_id: str) -> list[str] | None:
        return await self.sessions.trajectory(session_id)

    async def trajectory_page(self, session_id: str, offset: int, limit: int) -> tuple[list[str], int] | None:
        return await self.sessions.trajectory_page(session_id, offset, limit)

    async def delete(self, session_id: str) -> bool:
        return await self.sessions.delete(session_id)

    async def claim_request(self, key: str, value: str, lease: float) -> str | None:
        return await self.claims.claim(key, value, lease)

    async def finish_request(self, key: str, value: str) -> None:
        await self.claims.finish(key, value)

    async def release_request(self, key: str) -> None:
        await self.claims.release(key)

    async def admit(self, tenant: str, session_ids: list[str], limit: int, ttl: float | None = None) -> int | None:
        return await self.tenants.admit(tenant, session_ids, limit, ttl)

    async def forget(self, tenant: str, session_ids: list[str]) -> None:
        await self.tenants.forget(tenant, session_ids)

    async def usage(self, tenant: str) -> int:
        return await self.tenants.usage(tenant)

    async def live(self, tenant: str, offset: int, limit: int) -> tuple[list[str], int]:
        return await self.tenants.live(tenant, offset, limit)

    async def put_record(self, kind: str, key: str, value: str, *, tenant: str = "",
                         limit: int | None = None, quota: int | None = None) -> str | None:
        return await self.records.put(kind, key, value, tenant=tenant, limit=limit, quota=quota)

    async def set_record(self, kind: str, key: str, value: str, *, tenant: str = "", quota: int | None = None) -> None:
        await self.records.set(kind, key, value, tenant=tenant, quota=quota)

    async def get_record(self, kind: str, key: str, *, tenant: str = "") -> str | None:
        return await self.records.get(kind, key, tenant=tenant)

    async def all_records(self, kind: str, *, tenant: str = "") -> dict[str, str]:
        return await self.records.all(kind, tenant=tenant)

    async def delete_record(self, kind: str, key: str, *, tenant: str = "") -> bool:
        return await self.records.delete(kind, key, tenant=tenant)

    @translated
    async def ping(self) -> None:
        await self.redis.client.ping()

    async def close(self) -> None:
        await self.redis.close()
