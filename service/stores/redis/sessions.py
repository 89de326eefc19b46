"""Sessions in Redis: each one a meta hash and its blobs under one hash tag (``Keys.session``), so a
cluster keeps a session on one slot and every update of it is one MULTI or one script."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError, ResponseError

from service.stores.redis.bases import BASE_FIELDS, Base, Bases, base_names, digest
from service.stores.redis.commit import Commit, Mode
from service.stores.redis.connection import Connection, translated
from service.stores.redis.keys import Keys
from service.stores.redis.tenants import Tenants
from service.stores.store import BytesQuota, SessionMeta, Snapshot, group_delta, stored_bytes


def meta_snapshot(fields: dict[str, str], ttl: float) -> Snapshot:
    """A snapshot of a session's meta alone (``load(blobs=False)``), from its meta hash's fields;
    ``ttl``: the store's."""
    meta = SessionMeta.from_fields(fields)
    return Snapshot(meta, "", "", time.time() + meta.ttl(ttl),
                    initial_digest=digest(fields.get("initial_base")), state_digest=digest(fields.get("state_base")))


class Sessions:
    def __init__(self, redis: Connection, keys: Keys, ttl: float, bases: Bases, tenants: Tenants) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl = ttl
        self.bases = bases
        self.tenants = tenants
        self._commit = redis.script("touch_bases", "session_ttl", "commit")
        self._fork = redis.script("touch_bases", "session_ttl", "fork")
        self._refresh = redis.script("touch_bases", "session_ttl", "refresh")

    @property
    def _ttl_ms(self) -> int:
        return int(self.ttl * 1000)

    async def _shorten(self, keys: Sequence[str], idle_ttl: str | None) -> None:
        """Give a session with an idle TTL of its own its TTL back, after a read made in one
        pipeline with the store's. The pipeline cannot know it before it reads the meta, and a
        script in it cannot run on a cluster's pipelines; so such a session's reads take a second
        round trip (the common session, without one, takes none)."""
        if not idle_ttl:
            return
        async with self.redis.client.pipeline(transaction=True) as pipe:
            for key in keys:
                pipe.pexpire(key, int(float(idle_ttl) * 1000))
            await pipe.execute()

    @translated
    async def create_group(self, metas: list[SessionMeta], state: str, initial: str, trajectory: list[str], *,
                           quota: int | None = None, initial_digest: str = "",
                           delta: dict[str, str] | None = None) -> None:
        if not metas:
            return
        fields = group_delta(state, initial, initial_digest, delta)
        held = sum(stored_bytes(name) + stored_bytes(value) for name, value in fields.items())
        size = stored_bytes(initial)
        each = (size if state is initial else stored_bytes(state)) + size + sum(map(stored_bytes, trajectory)) + held
        counts = {meta.session_id: each for meta in metas}
        tenant = metas[0].tenant
        # Counted first, in one script on the tenant's slot, so the quota holds however many replicas write.
        await self.tenants.reserve(tenant, counts, quota)
        try:
            base = None
            if initial_digest:
                base = Base(self.keys.base(tenant, initial_digest), stored_bytes(initial),
                            state is initial or state == initial)
                await self.bases.keep(base.name, initial)  # before the sessions: none reads a missing base
            await self._write_group(metas, state, initial, trajectory, base, fields)
        except BaseException:
            await self.tenants.unreserve(tenant, counts)
            raise

    async def _write_group(self, metas: list[SessionMeta], state: str, initial: str, trajectory: list[str],
                           base: Base | None, fields: dict[str, str] | None = None) -> None:
        if not self.redis.cluster:
            # One MULTI: every session of the group exists, or none does.
            async with self.redis.client.pipeline(transaction=True) as pipe:
                for meta in metas:
                    self._write_session(pipe, meta, state, initial, trajectory, base, fields)
                await pipe.execute()
            return
        # A cluster spreads the group's sessions over slots, so no single MULTI covers them: each session is
        # written in a MULTI of its own slot, and if any fails the ones written are deleted before the error is
        # raised. Session ids are fresh, so nobody can have seen a half-made group in between.
        async def one(meta: SessionMeta) -> None:
            async with self.redis.client.pipeline(transaction=True) as pipe:
                self._write_session(pipe, meta, state, initial, trajectory, base, fields)
                await pipe.execute()

        outcomes = await asyncio.gather(*(one(meta) for meta in metas), return_exceptions=True)
        failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failure is not None:
            for meta in metas:
                try:
                    await self.redis.client.delete(*self.keys.session(meta.session_id).kept())
                except RedisError:
                    pass  # unreachable now: the keys expire with the session TTL
            raise failure

    @translated
    async def copy(self, source: SessionMeta, metas: list[SessionMeta], *, quota: int | None = None) -> bool:
        """Store ``metas`` as copies of ``source``'s state, initial state and trajectory, server-side
        where Redis allows (one script), else read and written back; False if ``source`` is gone."""
        if self.redis.pipeline is not None:
            each = await self._bytes_of(source)
            counts = {meta.session_id: each for meta in metas}
            await self.tenants.reserve(source.tenant, counts, quota)
            try:
                copied = await self._copy_inside(source, metas)
            except BaseException:
                await self.tenants.unreserve(source.tenant, counts)
                raise
            if copied is not None:
                if not copied:
                    await self.tenants.unreserve(source.tenant, counts)
                return copied
            await self.tenants.unreserve(source.tenant, counts)
        snap = await self.load(source.session_id, trajectory=True)
        if snap is None:
            return False
        await self.create_group(metas, snap.state, snap.initial, snap.trajectory, quota=quota,
                                initial_digest=snap.initial_digest)
        return True

    async def _bytes_of(self, meta: SessionMeta) -> int:
        """What a session stores, as counted for its tenant (for one counted before counts
        existed: its state and initial state)."""
        counted = await self.redis.client.hget(self.keys.session_bytes(meta.tenant), meta.session_id)
        if counted is not None:
            return int(counted)
        k = self.keys.session(meta.session_id)
        async with self.redis.client.pipeline(transaction=False) as pipe:
            pipe.strlen(k.state)
            pipe.strlen(k.initial)
            sizes: list[int] = await pipe.execute()
        return sum(int(size) for size in sizes)

    async def _copy_inside(self, source: SessionMeta, metas: list[SessionMeta]) -> bool | None:
        """The copy as one server-side script; None when this Redis cannot (no COPY before 6.2)."""
        if self.redis.pipeline is not None:
            k = self.keys.session(source.session_id)
            keys = [k.meta, k.state, k.initial, k.trajectory, k.delta]
            for meta in metas:
                keys.extend(self.keys.session(meta.session_id).kept())
            created = metas[0].to_fields()["created_at"]
            try:
                done = await self.redis.run(self._fork, keys, [self._ttl_ms, created, source.session_id,
                                                               self.bases.ttl_ms, *(m.session_id for m in metas)])
                return int(done) == 1
            except ResponseError as exc:
                if "COPY" not in str(exc).upper() and "unknown command" not in str(exc):
                    raise
        return None

    def _write_session(self, pipe: Any, meta: SessionMeta, state: str, initial: str, trajectory: list[str],
                       base: Base | None = None, delta: dict[str, str] | None = None) -> None:
        k = self.keys.session(meta.session_id)
        pipe.delete(*k.kept())  # a create never extends what an old session left
        fields = dict[Any, Any](meta.to_fields())
        if base is not None:  # the session names its base instead of holding a copy
            fields.update(initial_base=base.name, base_bytes=base.size)
            if base.is_state:
                fields["state_base"] = base.name
        if delta:
            fields["delta_bytes"] = sum(stored_bytes(name) + stored_bytes(value) for name, value in delta.items())
            pipe.hset(k.delta, mapping=delta)
            pipe.pexpire(k.delta, int(meta.ttl(self.ttl) * 1000))
        pipe.hset(k.meta, mapping=fields)
        if base is None or not base.is_state:
            pipe.set(k.state, state)
        if base is None:
            pipe.set(k.initial, initial)
        if trajectory:
            pipe.rpush(k.trajectory, *trajectory)
        for key in k.data():
            pipe.pexpire(key, int(meta.ttl(self.ttl) * 1000))

    @translated
    async def load(self, session_id: str, *, trajectory: bool = False, blobs: bool = True,
                   current: bool = True) -> Snapshot | None:
        k = self.keys.session(session_id)
        if not blobs:
            pairs = iter(await self.redis.run(self._refresh, list(k.kept()),
                                              [self._ttl_ms, self.bases.ttl_ms, self.bases.touch]))
            fields = dict(zip(pairs, pairs, strict=True))
            if not fields or (self.redis.cluster and await self.bases.refresh(base_names(fields)) is None):
                return None
            return meta_snapshot(fields, self.ttl)
        async with self.redis.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(k.meta)
            pipe.get(k.state)
            pipe.get(k.initial)
            pipe.hgetall(k.delta)
            if trajectory:
                pipe.lrange(k.trajectory, 0, -1)
            for key in k.kept():
                pipe.pexpire(key, self._ttl_ms)
            results: list[Any] = await pipe.execute()
        meta, state, initial, fields = results[0], results[1], results[2], results[3]
        if not meta:
            return None
        await self._shorten(k.kept(), meta.get("idle_ttl"))
        initial_base = meta.get("initial_base", "")
        texts = await self.bases.refresh(base_names(meta), [initial_base if initial is None else ""])
        state = await self.bases.composed(meta, state, fields, texts) if current else ""
        initial = texts.get(initial_base) if initial is None and texts is not None else initial
        if state is None or initial is None:
            return None
        read = SessionMeta.from_fields(meta)
        return Snapshot(
            meta=read,
            state=state,
            initial=initial,
            expires_at=time.time() + read.ttl(self.ttl),
            trajectory=list(results[4]) if trajectory else [],
            initial_digest=digest(initial_base),
            state_digest=digest(meta.get("state_base")),
        )

    @translated
    async def stored(self, session_id: str) -> tuple[str, dict[str, str] | None] | None:
        k = self.keys.session(session_id)
        async with self.redis.client.pipeline(transaction=True) as pipe:
            pipe.get(k.state)
            pipe.hgetall(k.meta)
            pipe.hgetall(k.delta)
            value, meta, fields = await pipe.execute()
        if not meta:
            return None
        text = await self.bases.composed(meta, value, fields, None)
        if text is None:
            return None
        return text, None if value is not None or not meta.get("state_base") else dict(fields)

    @translated
    async def commit(self, commit: Commit) -> bool:
        k = self.keys.session(commit.session_id)
        tenant = commit.tenant
        base = ""
        if commit.mode is Mode.BASE and commit.state is not None:
            base = self.keys.base(tenant or "", commit.new_base)
            await self.bases.keep(base, commit.state)  # before the session names it
        expires = int((time.time() + self.ttl) * 1000)
        args = commit.argv(base=base, ttl_ms=self._ttl_ms, expires_ms=expires, base_ttl_ms=self.bases.ttl_ms,
                           touch=self.bases.touch)
        counted = None
        if tenant is not None and not self.redis.cluster:
            # one round trip: commit, unlock, live count, bytes counted against the quota
            counted = (self.keys.live_sessions(tenant), self.keys.session_bytes(tenant), self.keys.record_bytes(tenant))
        upper = 0
        if tenant is not None and self.redis.cluster:
            # The tenant's counts are on another slot: the most the step can add is counted first.
            upper = commit.most_added()
            await self.tenants.reserve(tenant, {commit.session_id: upper}, commit.quota)
        try:
            outcome, grown, lives = await self.redis.run(self._commit, commit.keys(k, counted), args)
        except BaseException:
            if upper:
                await self.tenants.unreserve(tenant or "", {commit.session_id: upper})
            raise
        if commit.held is not None:
            commit.held.released = True
        if tenant is not None and self.redis.cluster:
            # ...and set right after the commit (with the live count), in a second round trip.
            await self.tenants.reserve(tenant, {commit.session_id: (int(grown) if int(outcome) == 1 else 0) - upper},
                                       None)
            async with self.redis.client.pipeline(transaction=True) as pipe:
                # (the script said how long the session lives: its own idle TTL, or the store's)
                pipe.zadd(self.keys.live_sessions(tenant), {commit.session_id: expires - self._ttl_ms + int(lives)},
                          xx=True)
                for name in commit.held.bases if commit.held is not None else []:  # on the tenant's slot too
                    pipe.pexpire(name, self.bases.ttl_ms)
                await pipe.execute()
        if int(outcome) == -2:
            used = await self.tenants.usage(tenant or "")
            raise BytesQuota(used, int(grown), commit.quota or 0)
        return int(outcome) == 1

    @translated
    async def idempotent(self, session_id: str, key: str) -> str | None:
        value = await self.redis.client.hget(self.keys.session(session_id).idempotency, key)
        return None if value is None else str(value)

    @translated
    async def trajectory(self, session_id: str) -> list[str] | None:
        k = self.keys.session(session_id)
        async with self.redis.client.pipeline(transaction=True) as pipe:
            pipe.exists(k.meta)
            pipe.lrange(k.trajectory, 0, -1)
            pipe.hmget(k.meta, *BASE_FIELDS, "idle_ttl")
            for key in k.kept():
                pipe.pexpire(key, self._ttl_ms)
            results: list[Any] = await pipe.execute()
        await self._shorten(k.kept(), results[2].pop())
        await self.bases.refresh(list(results[2]))
        return list(results[1]) if results[0] else None

    @translated
    async def trajectory_page(self, session_id: str, offset: int, limit: int) -> tuple[list[str], int] | None:
        k = self.keys.session(session_id)
        async with self.redis.client.pipeline(transaction=True) as pipe:
            pipe.exists(k.meta)
            pipe.lrange(k.trajectory, offset, offset + limit - 1)
            pipe.llen(k.trajectory)
            pipe.hmget(k.meta, *BASE_FIELDS, "idle_ttl")
            for key in k.kept():
                pipe.pexpire(key, self._ttl_ms)
            results: list[Any] = await pipe.execute()
        await self._shorten(k.kept(), results[3].pop())
        await self.bases.refresh(list(results[3]))
        return (list(results[1]), int(results[2])) if results[0] else None

    @translated
    async def delete(self, session_id: str) -> bool:
        k = self.keys.session(session_id)
        removed = await self.redis.client.delete(*k.kept())
        return int(removed) > 0
