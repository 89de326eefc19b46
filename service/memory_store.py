"""The in-process session store: the embedded default when no Redis URL is given.

A base (see ``service.store``) is kept once per tenant and digest with the number of sessions
that use it, and dropped with the last of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

from service.store import BytesQuota, Held, LockTimeout, RecordLimit, SessionMeta, Snapshot, stored_bytes


@dataclass
class _Entry:
    meta: SessionMeta
    state: str | None  # None: the state is the initial state's base
    initial: str
    trajectory: list[str] = field(default_factory=list)
    expires_at: float = 0.0
    idempotency: dict[str, str] = field(default_factory=dict)
    base: tuple[str, str] | None = None  # (tenant, digest) of the initial state when it is a base

    @property
    def current(self) -> str:
        return self.initial if self.state is None else self.state


class MemoryStore:
    def __init__(self, ttl: float = 3600.0) -> None:
        self.ttl = ttl
        self._sessions: dict[str, _Entry] = {}
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._records: dict[tuple[str, str], dict[str, str]] = {}  # (tenant, kind) -> key -> value
        self._requests: dict[str, tuple[str, float]] = {}  # key -> (value, expires at)
        self._live: dict[str, dict[str, float]] = {}  # tenant -> session id -> expires at
        self._bytes: dict[str, dict[str, int]] = {}  # tenant -> session id -> bytes it stores
        self._session_bytes: dict[str, int] = {}  # tenant -> the sum of its sessions' bytes
        self._record_bytes: dict[str, int] = {}  # tenant -> bytes of its catalog records
        self._bases: dict[tuple[str, str], tuple[str, int]] = {}  # (tenant, digest) -> (text, sessions using it)
        self._last_sweep = 0.0

    def _entry(self, session_id: str) -> _Entry | None:
        now = time.time()
        if now - self._last_sweep > 60:
            self._sweep(now)
        entry = self._sessions.get(session_id)
        if entry is None:
            return None
        if entry.expires_at <= now:
            self._drop(session_id)
            return None
        entry.expires_at = now + self.ttl
        return entry

    def _sweep(self, now: float) -> None:
        """Drop expired sessions so an idle service does not hold them forever."""
        self._last_sweep = now
        for session_id in [k for k, e in self._sessions.items() if e.expires_at <= now]:
            self._drop(session_id)
        for key in [k for k, (_, expires) in self._requests.items() if expires <= now]:
            del self._requests[key]

    async def create(self, meta: SessionMeta, state: str, initial: str, trajectory: list[str], *,
                     quota: int | None = None) -> None:
        await self.create_group([meta], state, initial, trajectory, quota=quota)

    async def create_group(self, metas: list[SessionMeta], state: str, initial: str, trajectory: list[str], *,
                           quota: int | None = None, initial_digest: str = "") -> None:
        if not metas:
            return
        each = stored_bytes(state) + stored_bytes(initial) + sum(map(stored_bytes, trajectory))
        tenant = metas[0].tenant
        self._reserve(tenant, each * len(metas), quota)
        base = (tenant, initial_digest) if initial_digest else None
        own: str | None = state
        if base is not None:
            shared = initial
            known = self._bases.get(base)
            if known is not None:
                shared = known[0]  # the text kept already, however the caller's copy came
            own = None if state is initial or state == initial else state
            initial = shared
        for meta in metas:
            self._drop(meta.session_id)  # (a create never extends what an old session left)
            if base is not None:
                self._bases[base] = (initial, self._bases.get(base, ("", 0))[1] + 1)
            self._sessions[meta.session_id] = _Entry(
                replace(meta), own, initial, list(trajectory), time.time() + self.ttl, base=base
            )
            self._count(tenant, meta.session_id, each)

    def _reserve(self, tenant: str, needed: int, quota: int | None) -> None:
        """Raises BytesQuota when ``needed`` more bytes would take ``tenant`` past ``quota``."""
        if quota is None or needed <= 0:
            return
        used = self._used(tenant)
        if used + needed > quota:
            raise BytesQuota(used, needed, quota)

    def _used(self, tenant: str) -> int:
        return self._session_bytes.get(tenant, 0) + self._record_bytes.get(tenant, 0)

    def _count(self, tenant: str, session_id: str, grown: int) -> None:
        counted = self._bytes.setdefault(tenant, {})
        counted[session_id] = counted.get(session_id, 0) + grown
        self._session_bytes[tenant] = self._session_bytes.get(tenant, 0) + grown

    def _uncount(self, tenant: str, session_id: str) -> None:
        held = self._bytes.get(tenant, {}).pop(session_id, None)
        if held is not None:
            self._session_bytes[tenant] -= held

    def _drop(self, session_id: str) -> _Entry | None:
        """Remove a session (expired or deleted); its bytes are gone with it."""
        entry = self._sessions.pop(session_id, None)
        if entry is not None:
            self._uncount(entry.meta.tenant, session_id)
            if entry.base is not None:
                text, users = self._bases.pop(entry.base)
                if users > 1:
                    self._bases[entry.base] = (text, users - 1)
        return entry

    def bases(self, tenant: str) -> int:
        """How many bases ``tenant``'s sessions share (to show they are stored once)."""
        return sum(1 for owner, _ in self._bases if owner == tenant)

    async def usage(self, tenant: str) -> int:
        return self._used(tenant)

    async def load(self, session_id: str, *, trajectory: bool = False, blobs: bool = True) -> Snapshot | None:
        entry = self._entry(session_id)
        if entry is None:
            return None
        return Snapshot(
            meta=replace(entry.meta),
            state=entry.current,
            initial=entry.initial,
            expires_at=entry.expires_at,
            trajectory=list(entry.trajectory) if trajectory else [],
            initial_digest=entry.base[1] if entry.base is not None else "",
        )

    async def copy(self, source: SessionMeta, metas: list[SessionMeta], *, quota: int | None = None) -> bool:
        snap = await self.load(source.session_id, trajectory=True)
        if snap is None:
            return False
        await self.create_group(metas, snap.state, snap.initial, snap.trajectory, quota=quota,
                                initial_digest=snap.initial_digest)
        return True

    async def state(self, session_id: str) -> str | None:
        entry = self._entry(session_id)
        return None if entry is None else entry.current

    @asynccontextmanager
    async def begin(self, session_id: str, wait: float, lease: float) -> AsyncIterator[Held]:
        async with self.lock(session_id, wait, lease):
            yield Held(await self.load(session_id, blobs=False))

    async def commit(self, session_id: str, expected_step: int, state: str | None, record: str, *,
                     done: bool = False, idempotency: tuple[str, str] | None = None, tenant: str | None = None,
                     held: Held | None = None, quota: int | None = None) -> bool:
        entry = self._entry(session_id)
        if tenant is not None and session_id in self._live.get(tenant, {}):
            self._live[tenant][session_id] = time.time() + self.ttl
        if entry is None or entry.meta.step != expected_step:
            return False
        if tenant is not None:
            grown = stored_bytes(record) + (0 if state is None else stored_bytes(state) - stored_bytes(entry.current))
            self._reserve(tenant, grown, quota)
            self._count(tenant, session_id, grown)
        if state is not None:
            entry.state = state
        entry.trajectory.append(record)
        entry.meta.step += 1
        entry.meta.done = entry.meta.done or done
        if idempotency is not None:
            entry.idempotency[idempotency[0]] = idempotency[1]
        return True

    async def idempotent(self, session_id: str, key: str) -> str | None:
        entry = self._entry(session_id)
        return None if entry is None else entry.idempotency.get(key)

    async def trajectory(self, session_id: str) -> list[str] | None:
        entry = self._entry(session_id)
        return None if entry is None else list(entry.trajectory)

    async def trajectory_page(self, session_id: str, offset: int, limit: int) -> tuple[list[str], int] | None:
        entry = self._entry(session_id)
        return None if entry is None else (entry.trajectory[offset:offset + limit], len(entry.trajectory))

    async def claim_request(self, key: str, value: str, lease: float) -> str | None:
        now = time.time()
        existing = self._requests.get(key)
        if existing is not None and existing[1] > now:
            return existing[0]
        self._requests[key] = (value, now + lease)
        return None

    async def finish_request(self, key: str, value: str) -> None:
        self._requests[key] = (value, time.time() + self.ttl)

    async def release_request(self, key: str) -> None:
        self._requests.pop(key, None)

    async def delete(self, session_id: str) -> bool:
        return self._entry(session_id) is not None and self._drop(session_id) is not None

    @asynccontextmanager
    async def lock(self, session_id: str, wait: float, lease: float) -> AsyncIterator[None]:
        lock, users = self._locks.get(session_id, (asyncio.Lock(), 0))
        self._locks[session_id] = (lock, users + 1)
        try:
            try:
                await asyncio.wait_for(lock.acquire(), wait)
            except TimeoutError:
                raise LockTimeout(f"session {session_id} stayed busy for {wait:g} s") from None
            try:
                yield
            finally:
                lock.release()
        finally:
            lock, users = self._locks[session_id]
            if users == 1:
                del self._locks[session_id]
            else:
                self._locks[session_id] = (lock, users - 1)

    async def admit(self, tenant: str, session_ids: list[str], limit: int) -> int | None:
        now = time.time()
        live = {k: v for k, v in self._live.get(tenant, {}).items() if v > now}
        for gone in self._live.get(tenant, {}).keys() - live.keys():
            entry = self._sessions.get(gone)
            if entry is not None and entry.expires_at <= now:
                self._drop(gone)  # an expired session gives its bytes back
        if len(live) + len(session_ids) > limit:
            self._live[tenant] = live
            return len(live)
        live.update({sid: now + self.ttl for sid in session_ids})
        self._live[tenant] = live
        return None

    async def live(self, tenant: str, offset: int, limit: int) -> tuple[list[str], int]:
        now = time.time()
        alive = sorted((expires, sid) for sid, expires in self._live.get(tenant, {}).items() if expires > now)
        return [sid for _, sid in alive[offset:offset + limit]], len(alive)

    async def forget(self, tenant: str, session_ids: list[str]) -> None:
        for sid in session_ids:
            self._live.get(tenant, {}).pop(sid, None)
            self._uncount(tenant, sid)

    async def put_record(self, kind: str, key: str, value: str, *, tenant: str = "",
                         limit: int | None = None, quota: int | None = None) -> str | None:
        records = self._records.setdefault((tenant, kind), {})
        existing = records.get(key)
        if existing is None:
            if limit is not None and len(records) >= limit:
                raise RecordLimit(f"{kind}: at most {limit}")
            size = stored_bytes(value)
            self._reserve(tenant, size, quota)
            records[key] = value
            self._record_bytes[tenant] = self._record_bytes.get(tenant, 0) + size
        return existing

    async def get_record(self, kind: str, key: str, *, tenant: str = "") -> str | None:
        return self._records.get((tenant, kind), {}).get(key)

    async def all_records(self, kind: str, *, tenant: str = "") -> dict[str, str]:
        return dict(self._records.get((tenant, kind), {}))

    async def delete_record(self, kind: str, key: str, *, tenant: str = "") -> bool:
        value = self._records.get((tenant, kind), {}).pop(key, None)
        if value is None:
            return False
        self._record_bytes[tenant] -= stored_bytes(value)
        return True

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None
