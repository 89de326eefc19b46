"""Every Redis key name, built in one place.

Session keys share the hash tag ``{<session id>}`` so a Redis Cluster keeps a
session on one slot and its multi-key updates stay atomic.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SessionKeys:
    meta: str
    state: str
    initial: str
    trajectory: str
    idempotency: str
    lock: str
    delta: str  # the fields of the state's delta against its base (see ``sandbox.state.deltas``), a hash

    def data(self) -> tuple[str, str, str, str, str]:
        """Keys whose TTL moves together (the lock has its own lease), but the delta's."""
        return (self.meta, self.state, self.initial, self.trajectory, self.idempotency)

    def kept(self) -> tuple[str, ...]:
        """Every key whose TTL moves with the session's."""
        return (*self.data(), self.delta)


class Keys:
    def __init__(self, prefix: str = "ef") -> None:
        self.prefix = prefix

    def session(self, session_id: str) -> SessionKeys:
        base = f"{self.prefix}:session:{{{session_id}}}"
        return SessionKeys(
            meta=f"{base}:meta",
            state=f"{base}:state",
            initial=f"{base}:initial",
            trajectory=f"{base}:trajectory",
            idempotency=f"{base}:idempotency",
            lock=f"{base}:lock",
            delta=f"{base}:delta",
        )

    def base(self, tenant: str, digest: str) -> str:
        """A state shared by sessions (content-addressed: ``digest`` is its text's SHA-256), stored
        once per tenant. It lives on the tenant's slot and expires unless a session using it is
        touched (every refresh of a session's keys refreshes the bases it names)."""
        return f"{self.prefix}:base:{_tag(tenant)}:{digest}"

    def tools_changed(self) -> str:
        """The pub/sub channel on which replicas tell each other that a session's tools changed
        (``service.api.broadcast``); a channel, not a key: nothing is stored under it."""
        return f"{self.prefix}:events:tools_changed"

    def request(self, name: str) -> str:
        """An idempotent request that creates sessions (create, fork); ``name`` is scoped by the caller."""
        return f"{self.prefix}:request:{name}"

    def live_sessions(self, tenant: str) -> str:
        """A tenant's sessions (sorted set, scored by when each expires unless used again)."""
        return f"{self.prefix}:tenant:{_tag(tenant)}:sessions"

    def session_bytes(self, tenant: str) -> str:
        """Bytes each of a tenant's sessions stores, and their sum under ``#total`` (hash; on the
        slot of ``live_sessions``, and expiring with it)."""
        return f"{self.prefix}:tenant:{_tag(tenant)}:session-bytes"

    def record_bytes(self, tenant: str) -> str:
        """Bytes of a tenant's catalog records (a counter that does not expire)."""
        return f"{self.prefix}:tenant:{_tag(tenant)}:record-bytes"

    def records(self, kind: str, tenant: str = "") -> str:
        """A tenant's catalog records of ``kind`` ('environments', 'scenarios' or the versions of
        either, 'environment_versions' and 'scenario_versions'), one hash."""
        if kind not in ("environments", "scenarios", "environment_versions", "scenario_versions"):
            raise ValueError(f"unknown record kind {kind!r}")
        return f"{self.prefix}:catalog:{tenant + ':' if tenant else ''}{kind}"


def _tag(tenant: str) -> str:
    """A tenant's hash tag, so a cluster keeps its counts on one slot. The tenant of a service without
    keys is '': an empty tag would not count as one, so it is a space (no tenant name holds one)."""
    return "{" + (tenant or " ") + "}"
