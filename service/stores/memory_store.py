"""The in-process session store: the embedded default when no Redis URL is given.

A base (see ``service.stores.store``) is kept once per tenant and digest with the number of sessions
that use it, and dropped with the last of them. A session whose state is a base plus a delta
holds the delta's fields; its state is composed from them when it is read.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from sandbox.state import deltas
from service.stores.store import (
    SESSION_TTL,
    BytesQuota,
    Held,
    LocalLocks,
    RecordLimit,
    SessionMeta,
    Snapshot,
    group_delta,
    stored_bytes,
)

BaseKey = tuple[str, str]  # (tenant, digest)


@dataclass
class _Entry:
    meta: SessionMeta
    state: str | None  # None: the state is ``state_base`` and ``fields``
    initial: str
    trajectory: list[str] = field(default_factory=list)
    expires_at: float = 0.0
    idempotency: dict[str, str] = field(default_factory=dict)
    base: BaseKey | None = None  # the initial state's, when it is a base
    state_base: BaseKey | None = None
    fields: dict[str, str] = field(default_factory=dict)  # the delta against ``state_base``
    delta_bytes: int = 0


class MemoryStore:
    def __init__(self, ttl: float = SESSION_TTL) -> None:
        self.ttl = ttl
        self._sessions: dict[str, _Entry] = {}
        self._locks = LocalLocks()
        self._records: dict[tuple[str, str], dict[str, str]] = {}  # (tenant, kind) -> key -> value
        self._requests: dict[str, tuple[str, float]] = {}  # key -> (value, expires at)
        self._live: dict[str, dict[str, float]] = {}  # tenant -> session id -> expires at
        self._bytes: dict[str, dict[str, int]] = {}  # tenant -> session id -> bytes it stores
        self._session_bytes: dict[str, int] = {}  # tenant -> the sum of its sessions' bytes
        self._record_bytes: dict[str, int] = {}  # tenant -> bytes of its catalog records
        self._bases: dict[BaseKey, tuple[str, int]] = {}  # -> (text, uses by sessions)
        self._parsed: dict[BaseKey, deltas.Base] = {}  # bases a delta was composed with
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
        entry.expires_at = now + entry.meta.ttl(self.ttl)
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
                           quota: int | None = None, initial_digest: str = "",
                           delta: dict[str, str] | None = None) -> None:
        if not metas:
            return
        fields = group_delta(state, initial, initial_digest, delta)
        held = _delta_growth({}, {"set": fields, "unset": []})
        each = stored_bytes(state) + stored_bytes(initial) + sum(map(stored_bytes, trajectory)) + held
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
            entry = _Entry(replace(meta), own, initial, list(trajectory), time.time() + meta.ttl(self.ttl))
            if base is not None:
                entry.base = self._use(base, initial)
                entry.state_base = self._use(base, initial) if own is None else None
                entry.fields, entry.delta_bytes = dict(fields), held
            self._sessions[meta.session_id] = entry
            self._count(tenant, meta.session_id, each)

    def _use(self, key: BaseKey, text: str) -> BaseKey:
        known = self._bases.get(key)
        self._bases[key] = (text, 1) if known is None else (known[0], known[1] + 1)
        return key

    def _release(self, key: BaseKey | None) -> None:
        if key is None:
            return
        text, users = self._bases.pop(key)
        if users > 1:
            self._bases[key] = (text, users - 1)
        else:
            self._parsed.pop(key, None)

    def _current(self, entry: _Entry) -> str | None:
        """The state; None when its delta does not fit its base (as only forged answers make)."""
        if entry.state is not None:
            return entry.state
        assert entry.state_base is not None
        text = self._bases[entry.state_base][0]
        if not entry.fields:
            return text
        parsed = self._parsed.get(entry.state_base)
        if parsed is None:
            parsed = self._parsed[entry.state_base] = deltas.Base(text)
        try:
            return deltas.compose(parsed, entry.fields)
        except ValueError:
            return None

    def _state_size(self, entry: _Entry) -> int:
        """What the current state counts for the tenant: its own text, or its base and its delta."""
        if entry.state is not None:
            return stored_bytes(entry.state)
        assert entry.state_base is not None
        return stored_bytes(self._bases[entry.state_base][0]) + entry.delta_bytes

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
            self._release(entry.base)
            self._release(entry.state_base)
        return entry

    def bases(self, tenant: str) -> int:
        """How many bases ``tenant``'s sessions share (to show they are stored once)."""
        return sum(1 for owner, _ in self._bases if owner == tenant)

    async def usage(self, tenant: str) -> int:
        return self._used(tenant)

    async def load(self, session_id: str, *, trajectory: bool = False, blobs: bool = True,
                   current: bool = True) -> Snapshot | None:
        entry = self._entry(session_id)
        state = "" if entry is None or not blobs or not current else self._current(entry)
        if entry is None or state is None:
            return None
        return Snapshot(
            meta=replace(entry.meta),
            state=state,
            initial=entry.initial if blobs else "",
            expires_at=entry.expires_at,
            trajectory=list(entry.trajectory) if trajectory else [],
            initial_digest=entry.base[1] if entry.base is not None else "",
            state_digest=entry.state_base[1] if entry.state_base is not None else "",
        )

    async def copy(self, source: SessionMeta, metas: list[SessionMeta], *, quota: int | None = None) -> bool:
        entry = self._entry(source.session_id)
        if entry is None:
            return False
        each = self._state_size(entry) + stored_bytes(entry.initial) + sum(map(stored_bytes, entry.trajectory))
        self._reserve(source.tenant, each * len(metas), quota)
        for meta in metas:
            self._drop(meta.session_id)
            copied = _Entry(replace(meta), entry.state, entry.initial, list(entry.trajectory),
                            time.time() + meta.ttl(self.ttl),
                            fields=dict(entry.fields), delta_bytes=entry.delta_bytes)
            if entry.base is not None:
                copied.base = self._use(entry.base, entry.initial)
            if entry.state_base is not None:
                copied.state_base = self._use(entry.state_base, self._bases[entry.state_base][0])
            self._sessions[meta.session_id] = copied
            self._count(source.tenant, meta.session_id, each)
        return True

    async def state(self, session_id: str) -> str | None:
        entry = self._entry(session_id)
        return None if entry is None else self._current(entry)

    async def stored(self, session_id: str) -> tuple[str, dict[str, str] | None] | None:
        entry = self._entry(session_id)
        text = None if entry is None else self._current(entry)
        if entry is None or text is None:
            return None
        return text, None if entry.state is not None else dict(entry.fields)

    @asynccontextmanager
    async def begin(self, session_id: str, wait: float, lease: float) -> AsyncIterator[Held]:
        async with self.lock(session_id, wait, lease):
            yield Held(await self.load(session_id, blobs=False))

    async def commit(self, session_id: str, expected_step: int, state: str | None, record: str, *,
                     done: bool = False, idempotency: tuple[str, str] | None = None, tenant: str | None = None,
                     held: Held | None = None, quota: int | None = None, delta: dict[str, Any] | None = None,
                     new_base: str = "", unlocked: bool = False) -> bool:
        entry = self._entry(session_id)
        if tenant is not None and session_id in self._live.get(tenant, {}):
            self._live[tenant][session_id] = entry.expires_at if entry is not None else time.time() + self.ttl
        if entry is None or entry.meta.step != expected_step:
            return False
        if unlocked and (session_id in self._locks or idempotency is not None and idempotency[0] in entry.idempotency):
            return False
        if delta is not None and (state is not None or entry.state_base is None):
            return False  # a delta applies only to a state kept as a base and a delta
        if state is not None:
            change = stored_bytes(state) - self._state_size(entry)
        elif delta is not None:
            change = _delta_growth(entry.fields, delta)
        else:
            change = 0
        if tenant is not None:
            grown = stored_bytes(record) + change
            self._reserve(tenant, grown, quota)
            self._count(tenant, session_id, grown)
        if state is not None:
            self._release(entry.state_base)
            entry.state_base, entry.fields, entry.delta_bytes = None, {}, 0
            entry.state = state
            if new_base:
                entry.state_base, entry.state = self._use((entry.meta.tenant, new_base), state), None
        elif delta is not None:
            for name in delta["unset"]:
                entry.fields.pop(name, None)
            entry.fields.update(delta["set"])
            entry.delta_bytes += change
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
        async with self._locks.hold(session_id, wait):
            yield

    async def admit(self, tenant: str, session_ids: list[str], limit: int, ttl: float | None = None) -> int | None:
        now = time.time()
        live = self._settled(tenant, now)
        if len(live) + len(session_ids) > limit:
            return len(live)
        live.update({sid: now + (self.ttl if ttl is None else ttl) for sid in session_ids})
        return None

    def _settled(self, tenant: str, now: float) -> dict[str, float]:
        """The tenant's live count (id -> when it was last known to expire). A read refreshes a
        session's expiry, not this one, so an id whose time has passed is looked up: it stays while
        its session lives, and goes (an expired session with its bytes) once it does not."""
        live = self._live.setdefault(tenant, {})
        for sid in [sid for sid, expires in live.items() if expires <= now]:
            entry = self._sessions.get(sid)
            if entry is not None and entry.expires_at > now:
                live[sid] = entry.expires_at
                continue
            del live[sid]
            if entry is not None:
                self._drop(sid)  # an expired session gives its bytes back
        return live

    async def live(self, tenant: str, offset: int, limit: int) -> tuple[list[str], int]:
        now = time.time()
        alive = sorted((expires, sid) for sid, expires in self._settled(tenant, now).items())
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

    async def set_record(self, kind: str, key: str, value: str, *, tenant: str = "", quota: int | None = None) -> None:
        records = self._records.setdefault((tenant, kind), {})
        old = records.get(key)
        grown = stored_bytes(value) - (0 if old is None else stored_bytes(old))
        self._reserve(tenant, grown, quota)
        records[key] = value
        self._record_bytes[tenant] = self._record_bytes.get(tenant, 0) + grown

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


def _delta_growth(fields: dict[str, str], delta: dict[str, Any]) -> int:
    """The bytes a delta's fields take beyond those they replace or remove."""
    grown = 0
    for name in delta["unset"]:
        old = fields.get(name)
        if old is not None:
            grown -= stored_bytes(name) + stored_bytes(old)
    for name, value in delta["set"].items():
        old = fields.get(name)
        grown += stored_bytes(value) - (stored_bytes(old) if old is not None else -stored_bytes(name))
    return grown
