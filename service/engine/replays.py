"""What replaying past steps may cost: rebuilt states are kept, and each tenant's replay time is bounded.

A past state that cannot be added up from step records is rebuilt by running the steps again in
the sandbox (``service.engine.rewind``), which may take a whole rewind budget of sandbox time for one
``GET /state?step=k``. So a state once rebuilt is kept in this replica (``ReplayCache``: by
tenant, session, step and environment code, least recently used out first, bounded in entries
and bytes; a session's first k steps never change, so neither does the state after them), and
the time replays take is charged to the tenant (``ReplayBudget``: a bucket of replay seconds
refilled over each minute, and a bound on the replays one tenant runs at once). Both are per
replica: N replicas allow a tenant N times the budget.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from service.errors import QuotaExceeded

ReplayKey = tuple[str, str, int, str]  # (tenant, session id, step, environment code key)


class ReplayCache:
    """Rebuilt past states (encoded), least recently used out first."""

    def __init__(self, entries: int, size: int) -> None:
        self.entries = entries
        self.size = size
        self._states: OrderedDict[ReplayKey, str] = OrderedDict()
        self._bytes = 0

    def get(self, key: ReplayKey) -> str | None:
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
        return state

    def put(self, key: ReplayKey, state: str) -> None:
        if len(state) > self.size or self.entries < 1:
            return  # (one state larger than the whole cache would only empty it)
        old = self._states.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        self._states[key] = state
        self._bytes += len(state)
        while self._bytes > self.size or len(self._states) > self.entries:
            self._bytes -= len(self._states.popitem(last=False)[1])


@dataclass
class _Bucket:
    seconds: float  # replay seconds the tenant may still start replays with (below 0: owed)
    at: float  # when it was last refilled (monotonic)
    running: int = 0


@dataclass
class Turn:
    """One replay under way: what it takes from its start is charged when it ends."""

    clock: Callable[[], float]
    started: float | None = None

    def start(self) -> None:
        self.started = self.clock()


class ReplayBudget:
    """Per tenant: ``per_minute`` replay seconds, refilled evenly over each minute (never more held
    than that), and at most ``concurrent`` replays at once. A replay may start while the tenant
    holds any time at all; what it takes is charged when it ends, so a tenant may owe up to one
    rewind budget and then waits until it is paid back."""

    def __init__(self, per_minute: float, concurrent: int, charged: Callable[[float], None] = lambda _: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.concurrent = concurrent
        self.charged = charged  # told the seconds each replay is charged (for the metrics)
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def _refilled(self, tenant: str) -> _Bucket:
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(self.per_minute, now)
        bucket.seconds = min(self.per_minute, bucket.seconds + (now - bucket.at) * self.per_minute / 60)
        bucket.at = now
        return bucket

    def left(self, tenant: str) -> float:
        """The replay seconds ``tenant`` holds now (negative: owed)."""
        return self._refilled(tenant).seconds

    @asynccontextmanager
    async def turn(self, tenant: str) -> AsyncIterator[Turn]:
        """Admit one replay of ``tenant`` and charge it the time from ``Turn.start`` to its end,
        whatever the end (a replay that failed took sandbox time too).

        Raises:
            QuotaExceeded: the tenant has no replay time left, or runs as many replays as it may.
        """
        bucket = self._refilled(tenant)
        if bucket.seconds <= 0:
            wait = -bucket.seconds * 60 / self.per_minute
            raise QuotaExceeded(f"this tenant has used its replay time ({self.per_minute:g} s per minute of running "
                                "past steps again to rebuild a past state) and owes "
                                f"{-bucket.seconds:.1f} s; states rebuilt already and those added up from step records "
                                "are still served", quota="replay_seconds", value=self.per_minute,
                                retry_after=max(1, math.ceil(wait)))
        if bucket.running >= self.concurrent:
            raise QuotaExceeded(f"this tenant already runs {bucket.running} replays of past steps, as many as it may "
                                "at once; retry when one has ended", quota="max_tenant_replays",
                                value=self.concurrent, retry_after=1)
        bucket.running += 1
        turn = Turn(self.clock)
        try:
            yield turn
        finally:
            bucket = self._refilled(tenant)
            bucket.running -= 1
            if turn.started is not None:
                taken = self.clock() - turn.started
                bucket.seconds -= taken
                self.charged(taken)
            if bucket.running == 0 and bucket.seconds >= self.per_minute:
                del self._buckets[tenant]  # (a full bucket is what a new one would be)
