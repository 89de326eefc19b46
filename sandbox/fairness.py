"""Sandbox workers shared fairly between tenants.

The gate admits as many sandbox requests at once as there are workers. When a
worker frees up and several tenants are waiting, the tenant that holds the
fewest workers goes first, and of those the one served longest ago (first come,
first served within a tenant). So one
tenant with a thousand queued rollouts cannot starve another tenant's single
call, and a tenant alone still gets every worker. A share below 1 also caps
what one tenant may hold even when nobody else is waiting.

Order alone does not bound a newcomer's wait: a tenant that holds every worker gives one back only
when a call of its own ends (up to the call timeout, or a score's budget). ``reserve`` workers are
therefore kept for tenants that hold none: a tenant already holding one may take a free worker only
while more than ``reserve`` are free, so another tenant's first request finds one at once.
"""

from __future__ import annotations

import asyncio
from collections import deque


class NoSlot(Exception):
    """No slot came free in time."""


class FairGate:
    def __init__(self, capacity: int, share: float = 1.0, reserve: int = 0) -> None:
        self.capacity = capacity
        self.cap = capacity if share >= 1.0 else max(1, int(capacity * share))
        self.reserve = max(0, min(reserve, capacity - 1))
        self.reserved_grants = 0  # slots taken from the reserve by a tenant holding none
        self._grants = 0
        self._last_grant: dict[str, int] = {}  # tenant -> when (in grants) it was last given a slot
        self.held: dict[str, int] = {}
        self._in_use = 0  # (the sum of ``held``, kept: it is asked several times a call)
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}

    @property
    def in_use(self) -> int:
        return self._in_use

    def slot(self, tenant: str, timeout: float | None = None) -> Slot:
        """Hold one slot for ``tenant`` (``async with``).

        Raises:
            NoSlot: no slot came free within ``timeout`` seconds.
        """
        return Slot(self, tenant, timeout)

    async def _acquire(self, tenant: str) -> None:
        """Wait for a slot (``Slot`` has found none free)."""
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(tenant, deque()).append(granted)
        self._dispatch()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release(tenant)  # granted just as the waiter gave up: hand the slot on
            else:
                self._forget(tenant, granted)
            raise

    def _may_take(self, tenant: str) -> bool:
        held = self.held.get(tenant, 0)
        free = self.capacity - self.in_use
        return free > 0 and held < self.cap and (held == 0 or free > self.reserve)

    def _take(self, tenant: str) -> None:
        held = self.held.get(tenant, 0)
        if held == 0 and self.capacity - self.in_use <= self.reserve:
            self.reserved_grants += 1
        self.held[tenant] = held + 1
        self._in_use += 1
        self._grants += 1
        self._last_grant[tenant] = self._grants

    def _release(self, tenant: str) -> None:
        self.held[tenant] -= 1
        self._in_use -= 1
        if not self.held[tenant]:
            del self.held[tenant]
            if tenant not in self.waiting:
                self._last_grant.pop(tenant, None)  # (only tenants holding or waiting are remembered)
        self._dispatch()

    def _dispatch(self) -> None:
        while self.waiting and self._in_use < self.capacity:
            eligible = [t for t in self.waiting if self._may_take(t)]
            if not eligible:
                return
            tenant = min(eligible, key=lambda t: (self.held.get(t, 0), self._last_grant.get(t, 0)))
            queue = self.waiting[tenant]
            granted = queue.popleft()
            if not queue:
                del self.waiting[tenant]
            if granted.done():  # its waiter was cancelled and has not cleaned up yet
                continue
            self._take(tenant)
            granted.set_result(None)

    def _forget(self, tenant: str, granted: asyncio.Future[None]) -> None:
        queue = self.waiting.get(tenant)
        if queue is not None and granted in queue:
            queue.remove(granted)
            if not queue:
                del self.waiting[tenant]


class Slot:
    """``FairGate.slot`` (a class: every tool call enters one, and a generator costs more)."""

    def __init__(self, gate: FairGate, tenant: str, timeout: float | None) -> None:
        self.gate, self.tenant, self.timeout = gate, tenant, timeout

    async def __aenter__(self) -> None:
        gate, tenant = self.gate, self.tenant
        if not gate.waiting and gate._may_take(tenant):  # free: taken at once, with no timer
            gate._take(tenant)
            return
        try:
            async with asyncio.timeout(self.timeout):  # (in this task: no task to wait in)
                await gate._acquire(tenant)
        except TimeoutError:
            raise NoSlot(f"no slot came free within {self.timeout:g} s") from None

    async def __aexit__(self, *exc: object) -> None:
        self.gate._release(self.tenant)
