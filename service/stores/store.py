"""The session store contract, shared by the memory and Redis implementations.

A session is one ``SessionMeta`` record plus three blobs: the encoded current
state, the encoded initial state (check functions see it as ``initial_state``)
and the trajectory, a list of JSON step records. An initial state the caller names by its
digest is a *base*: stored once per tenant and digest, however many sessions start from it,
and a session whose state is still its base holds no copy of either. Every read or write of a
session refreshes its idle TTL; an expired session is gone for every reader. A session made with
an idle TTL of its own (``SessionMeta.idle_ttl``) lives that long after its last read or write
instead of the store's: a trainer that may be killed without a word asks for a short one, so what
it leaves behind is reaped in seconds, not in an hour.

Calls on one session are serialized by ``lock``; ``commit`` is additionally a
compare-and-set on the step number, so even a caller whose lock lease ran out
can never apply a step twice or on top of a state it did not read.

What a tenant stores is counted in bytes (states, initial states, step records of its live
sessions; its catalog records): every write that takes a ``quota`` is refused whole with
``BytesQuota``, before anything is written, when the tenant's count would pass it. A session's
bytes count from its creation until ``forget`` (or until ``admit`` finds it expired). A session
counts the states it reads, shared or not: the quota bounds what a tenant's sessions hold, not
how well they share.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

# Seconds an idle session lives, unless it asked for its own (ENVFOUNDRY_SESSION_TTL).
SESSION_TTL = 3600.0


def group_delta(state: str, initial: str, initial_digest: str, delta: dict[str, str] | None) -> dict[str, str]:
    """The fields of a new group's delta; a delta is only ever against the initial state as its base."""
    fields = dict(delta or {})
    if fields and not (initial_digest and (state is initial or state == initial)):
        raise ValueError("a delta is against the initial state, as a base that is the state")
    return fields


class StoreError(Exception):
    """The store is unreachable or answered unexpectedly."""


class LockTimeout(StoreError):
    """The session stayed busy with other calls for longer than the wait limit."""


class LocalLocks:
    """One holder at a time per session, within this process (a lock is kept only while in use)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._locks

    def hold(self, session_id: str, wait: float) -> AbstractAsyncContextManager[None]:
        """Raises LockTimeout: another holder kept it for ``wait`` seconds."""
        return _Holding(self._locks, session_id, wait)


class _Holding:
    """``LocalLocks.hold`` (a class: every tool call takes one, and a generator costs more)."""

    def __init__(self, locks: dict[str, tuple[asyncio.Lock, int]], session_id: str, wait: float) -> None:
        self.locks, self.session_id, self.wait = locks, session_id, wait
        self.lock: asyncio.Lock | None = None

    async def __aenter__(self) -> None:
        found = self.locks.get(self.session_id)
        lock, users = (asyncio.Lock(), 0) if found is None else found
        self.locks[self.session_id] = (lock, users + 1)
        try:
            if found is None:
                await lock.acquire()  # (a new lock: taken at once, no timer needed)
            else:
                async with asyncio.timeout(self.wait):
                    await lock.acquire()
        except BaseException as exc:
            self._leave(lock)
            if isinstance(exc, TimeoutError):
                raise LockTimeout(f"session {self.session_id} stayed busy for {self.wait:g} s") from None
            raise
        self.lock = lock

    async def __aexit__(self, *exc: object) -> None:
        assert self.lock is not None
        self.lock.release()
        self._leave(self.lock)

    def _leave(self, lock: asyncio.Lock) -> None:
        _, users = self.locks[self.session_id]
        if users == 1:
            del self.locks[self.session_id]
        else:
            self.locks[self.session_id] = (lock, users - 1)


class RecordLimit(Exception):
    """A tenant holds as many catalog records of a kind as it may."""


class BytesQuota(Exception):
    """Storing ``needed`` more bytes would take the tenant past its stored-bytes quota; nothing was written."""

    def __init__(self, used: int, needed: int, quota: int) -> None:
        super().__init__(f"the tenant stores {used} bytes; {needed} more would pass its quota of {quota}")
        self.used = used
        self.needed = needed
        self.quota = quota


def stored_bytes(text: str) -> int:
    """What ``text`` takes in the store (UTF-8), without encoding the common all-ASCII case."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def digest_of(text: str) -> str:
    """The content address of an encoded state (SHA-256 of its UTF-8 text)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def new_session_id() -> str:
    """128 random bits, URL-safe."""
    return "ses_" + secrets.token_urlsafe(16)


@dataclass
class SessionMeta:
    session_id: str
    env_id: str
    scenario_id: str | None
    created_at: float
    step: int = 0
    parent_id: str | None = None
    tenant: str = ""
    mode: str = "task"  # or "conversation": a simulated user holds the task
    done: bool = False  # the simulated user ended the conversation
    opening: str | None = None  # the simulated user's first message
    env_registration: str = ""  # the Environment.registration the session was made from
    # Its randomness (see ``sandbox.worker.randomness``): the tag naming its stream (a fork keeps its
    # parent's) and the seed every draw comes from, if it was given one.
    stream: str = ""
    seed: int | None = None
    # The versions it started on (``service.catalog.versions``): it goes on with them whatever is added
    # under its ids later ("" for sessions made before versions were recorded: the latest).
    env_version: str = ""
    scenario_version: str = ""
    # Seconds it lives after its last read or write, when not the store's TTL (forks keep it).
    idle_ttl: float | None = None

    def to_fields(self) -> dict[str, str]:
        fields = {k: "" if v is None else str(v) for k, v in asdict(self).items()}
        fields["done"] = "1" if self.done else ""
        return fields

    @classmethod
    def from_fields(cls, data: dict[str, str]) -> SessionMeta:
        return cls(
            session_id=data["session_id"],
            env_id=data["env_id"],
            scenario_id=data.get("scenario_id") or None,
            created_at=float(data["created_at"]),
            step=int(data["step"]),
            parent_id=data.get("parent_id") or None,
            tenant=data.get("tenant", ""),
            mode=data.get("mode") or "task",
            done=bool(data.get("done")),
            opening=data.get("opening") or None,
            env_registration=data.get("env_registration", ""),
            stream=data.get("stream", ""),
            seed=int(data["seed"]) if data.get("seed") else None,
            env_version=data.get("env_version", ""),
            scenario_version=data.get("scenario_version", ""),
            idle_ttl=float(data["idle_ttl"]) if data.get("idle_ttl") else None,
        )

    def ttl(self, default: float) -> float:
        """Seconds the session lives after its last read or write: its own idle TTL, else ``default``."""
        return self.idle_ttl if self.idle_ttl is not None else default


@dataclass
class Snapshot:
    meta: SessionMeta
    state: str
    initial: str
    expires_at: float
    trajectory: list[str] = field(default_factory=list)
    initial_digest: str = ""  # when the initial state is a base: its digest (see ``create_group``)
    state_digest: str = ""  # when the state is a base plus a delta: the base's digest


@dataclass
class Held:
    """A session's call lock, held, with the session's meta read in the same step (``snap`` is None
    when the session does not exist; its blobs are empty, see ``SessionStore.state``)."""

    snap: Snapshot | None
    token: str = ""
    released: bool = False  # a commit given this lock released it already
    bases: list[str] = field(default_factory=list)  # the store's names of the bases the session reads


class SessionStore(Protocol):
    ttl: float

    async def create(self, meta: SessionMeta, state: str, initial: str, trajectory: list[str], *,
                     quota: int | None = None) -> None:
        """Store a new session.

        Raises:
            BytesQuota: the session would take its tenant past ``quota`` bytes (nothing is written).
        """

    async def create_group(self, metas: list[SessionMeta], state: str, initial: str, trajectory: list[str], *,
                           quota: int | None = None, initial_digest: str = "",
                           delta: dict[str, str] | None = None) -> None:
        """Store several sessions sharing one state, all or none (``BytesQuota`` as ``create``).

        With ``initial_digest`` (``digest_of(initial)``, which the caller vouches for: it is never
        checked here), ``initial`` is stored as a base, once for the tenant and digest, and a
        ``state`` equal to it is that base too: the sessions then store only their meta. With
        ``delta`` too (fields against that base, see ``sandbox.state.deltas``), each session's state is
        the base plus those fields."""

    async def load(self, session_id: str, *, trajectory: bool = False, blobs: bool = True,
                   current: bool = True) -> Snapshot | None:
        """Read a session consistently (meta, blobs and optionally trajectory at one step).
        Without ``blobs`` the snapshot's state and initial state are empty (see ``state``);
        without ``current``, its state alone is (for a caller that needs the initial state only)."""

    async def state(self, session_id: str) -> str | None:
        """The session's current encoded state alone."""

    async def stored(self, session_id: str) -> tuple[str, dict[str, str] | None] | None:
        """The current encoded state, and its delta's fields when it is kept as a base plus a delta
        (``sandbox.state.deltas``; None when the state is the session's own text)."""

    async def copy(self, source: SessionMeta, metas: list[SessionMeta], *, quota: int | None = None) -> bool:
        """Store sessions ``metas`` as copies of ``source`` at its current step (state, initial
        state, trajectory), all or none; False if ``source`` no longer exists. Each copy costs
        what ``source`` stores.

        Raises:
            BytesQuota: the copies would take the tenant past ``quota`` bytes (none is written).
        """

    async def commit(self, session_id: str, expected_step: int, state: str | None, record: str, *,
                     done: bool = False, idempotency: tuple[str, str] | None = None, tenant: str | None = None,
                     held: Held | None = None, quota: int | None = None, delta: dict[str, Any] | None = None,
                     new_base: str = "", unlocked: bool = False) -> bool:
        """Append ``record``, advance the step and replace the state (unless None), atomically,
        only if the session exists and is still at ``expected_step``. ``done`` marks the
        conversation ended; ``idempotency`` (key, value) is remembered with the step, so a retry
        carrying the key finds it even when the answer to the first attempt was lost. With
        ``tenant``, the session's place in that tenant's live count is refreshed too. With ``held``
        (from ``begin``), the call lock is released in the same step. With ``tenant``, the bytes the
        step adds (the record, the state's growth) count for the tenant.

        With ``delta`` (``{"set": {field: value}, "unset": [field]}``, checked by the caller with
        ``sandbox.state.deltas.problem``) and no ``state``, the step changes those fields of the state's
        delta; refused (False) when the session's state is not a base plus a delta. With ``new_base``
        (``digest_of(state)``), ``state`` becomes the session's base and its delta is emptied.

        ``unlocked``: the caller holds no lock (it knows the session's step from its own last
        commit): refused too while another caller holds the session's lock, or when the
        ``idempotency`` key was used already. Nothing is written then; the caller takes the lock
        and goes the usual way.

        Raises:
            BytesQuota: the step would take ``tenant`` past ``quota`` bytes (nothing is written;
                a lock in ``held`` is released all the same).
        """

    def begin(self, session_id: str, wait: float, lease: float) -> AbstractAsyncContextManager[Held]:
        """``lock`` and ``load(blobs=False)`` together (one round trip where the store allows)."""

    async def idempotent(self, session_id: str, key: str) -> str | None:
        """The value committed with idempotency ``key`` on this session, if any."""

    async def trajectory(self, session_id: str) -> list[str] | None:
        """The session's step records, or None when it does not exist."""

    async def trajectory_page(self, session_id: str, offset: int, limit: int) -> tuple[list[str], int] | None:
        """Step records ``offset`` to ``offset + limit`` and the total, or None when the session does not exist."""

    async def claim_request(self, key: str, value: str, lease: float) -> str | None:
        """Claim a request key for ``lease`` seconds; the value already there when it is taken."""

    async def finish_request(self, key: str, value: str) -> None:
        """Replace a claimed request key's value with the answer, kept for the session TTL."""

    async def release_request(self, key: str) -> None:
        """Forget a claim whose request failed, so a retry can run it."""

    async def delete(self, session_id: str) -> bool:
        """Remove a session; False when it did not exist."""

    def lock(self, session_id: str, wait: float, lease: float) -> AbstractAsyncContextManager[None]:
        """Hold the session's call lock; raise LockTimeout after ``wait`` seconds."""

    async def admit(self, tenant: str, session_ids: list[str], limit: int, ttl: float | None = None) -> int | None:
        """Count ``session_ids`` as live sessions of ``tenant`` unless that would pass ``limit``;
        return the live count when it would (nothing is counted then). ``ttl``: the sessions' own
        idle TTL, when they have one (see ``SessionMeta.idle_ttl``)."""

    async def forget(self, tenant: str, session_ids: list[str]) -> None:
        """Stop counting sessions (deleted, or their creation failed), and the bytes they stored."""

    async def usage(self, tenant: str) -> int:
        """The bytes ``tenant`` stores, as its quota counts them."""

    async def live(self, tenant: str, offset: int, limit: int) -> tuple[list[str], int]:
        """A page of the tenant's live session ids, oldest expiry first, and how many there are."""

    async def put_record(self, kind: str, key: str, value: str, *, tenant: str = "",
                         limit: int | None = None, quota: int | None = None) -> str | None:
        """Store a tenant's catalog record unless ``key`` exists; return the existing value if it does.

        Raises:
            RecordLimit: the tenant already holds ``limit`` records of ``kind``.
            BytesQuota: the record would take the tenant past ``quota`` bytes.
        """

    async def set_record(self, kind: str, key: str, value: str, *, tenant: str = "", quota: int | None = None) -> None:
        """Store a tenant's catalog record, replacing the one ``key`` holds (an id's latest version).

        Raises:
            BytesQuota: the record would take the tenant past ``quota`` bytes; nothing changes.
        """

    async def get_record(self, kind: str, key: str, *, tenant: str = "") -> str | None:
        """A catalog record (``kind`` is 'environments' or 'scenarios') of ``tenant``."""

    async def all_records(self, kind: str, *, tenant: str = "") -> dict[str, str]:
        """Every catalog record of ``kind`` that ``tenant`` holds."""

    async def delete_record(self, kind: str, key: str, *, tenant: str = "") -> bool:
        """Remove a tenant's record; False when it did not exist."""

    async def ping(self) -> None:
        """Raise StoreError when the store is unreachable."""

    async def close(self) -> None:
        """Release connections."""
