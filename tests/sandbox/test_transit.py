"""A full worker serves calls that must rebuild their session in a transit process.

At 10,000 sessions of an RL batch a worker cannot keep every one live: each call of a cold
session used to end the least recently used live process to make room, then fork and rebuild
its own. Now the worker keeps the live sessions it has room for, and a call of any other session
of the same environment and tenant runs in one kept process that builds the instance from the
stored state, answers, and drops it. These tests hold that such calls answer as the class run
plainly, end no live session, reuse one process per tenant and never mix tenants.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from sandbox.pool.calls import CallOutcome, EnvCode
from sandbox.pool.requests import WorkerPool
from tests.sandbox.calls import session_call

pytestmark = pytest.mark.anyio

LEDGER = '''
import os
import random


class Ledger:
    def __init__(self, config=None):
        random.seed(11)  # a plain process draws this stream; so must every rebuild
        self.entries = []
        self.tags = set()
        self.balance = 0

    def add(self, amount: int, tag: str) -> dict:
        self.balance += amount
        self.tags.add(tag)
        entry = {"n": len(self.entries), "amount": amount, "draw": random.randint(0, 10**6)}
        self.entries.append(entry)
        return {"balance": self.balance, "entry": entry, "tags": sorted(self.tags)}

    def fail(self, amount: int) -> dict:
        self.balance += amount
        raise ValueError("refused after changing the balance")

    def where(self) -> int:
        return os.getpid()
'''
ENV = EnvCode("transit-ledger", "transit_ledger", "Ledger", LEDGER)


def plain_run(calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """The session's answers from the class run plainly in this process (a failed call rolled back)."""
    namespace: dict[str, Any] = {}
    exec(LEDGER, namespace)
    instance = namespace["Ledger"]({})
    results: list[Any] = []
    for name, arguments in calls:
        saved_state = json.dumps(vars(instance), default=sorted)
        saved_random = random.getstate()
        try:
            results.append(getattr(instance, name)(**arguments))
        except ValueError:
            instance.__dict__.update(json.loads(saved_state))
            instance.tags = set(instance.tags)
            random.setstate(saved_random)
            results.append(None)
    return results


class Sessions:
    """Sessions of one pool as the engine keeps them: the stored state, the step."""

    def __init__(self, pool: WorkerPool, scope: str | None) -> None:
        self.pool, self.scope = pool, scope
        self.states: dict[str, str] = {}
        self.steps: dict[str, int] = {}

    async def create(self, session: str) -> None:
        self.states[session] = await self.pool.init_state(ENV, {}, session=session, stream=session)
        self.steps[session] = 0

    async def call(self, session: str, name: str, arguments: dict[str, Any]) -> CallOutcome:
        async def stored() -> str:
            return self.states[session]

        outcome = await session_call(self.pool, ENV, session, self.steps[session], stored, name, arguments,
                                     stream=session, scope=self.scope)
        if outcome.ok:
            if outcome.state is not None:
                self.states[session] = outcome.state
            self.steps[session] += 1
        else:
            self.pool.forget(session)
        return outcome


async def test_a_full_worker_answers_cold_sessions_as_the_class_run_plainly_and_ends_no_live_one(
        pool_factory: Any) -> None:
    async with pool_factory(size=1, residents=2) as pool:
        sessions = Sessions(pool, "tenant-a")
        names = [f"s{i}" for i in range(6)]
        for name in names:
            await sessions.create(name)
        script = [("add", {"amount": 5, "tag": "b"}), ("fail", {"amount": 100}), ("add", {"amount": -2, "tag": "a"}),
                  ("add", {"amount": 7, "tag": "c"})]
        expected = plain_run(script)
        answers: dict[str, list[Any]] = {name: [] for name in names}
        for name, arguments in script:  # the sessions in turn: at most two of them fit live
            for session in names:
                outcome = await sessions.call(session, name, arguments)
                answers[session].append(outcome.result if outcome.ok else None)
                if name == "fail":
                    assert outcome.error is not None and outcome.error["type"] == "tool_exception"
        assert all(answers[session] == expected for session in names), answers
        (memory,) = (await pool.measure()).values()
        assert pool.transit_calls >= 4 * len(script) - 4  # the cold sessions' calls (a failed one may not count)
        assert memory.evicted == 0 and pool.replaced == 0


async def test_one_process_serves_a_tenants_cold_sessions_and_none_of_another_tenants(pool_factory: Any) -> None:
    async with pool_factory(size=1, residents=1) as pool:
        first, second = Sessions(pool, "tenant-a"), Sessions(pool, "tenant-b")
        for name in ("b0", "b1"):
            await second.create(name)
        for name in ("a0", "a1", "a2"):
            await first.create(name)  # the last one stays live
        pids = {}
        for sessions, name in ((first, "a0"), (second, "b0"), (first, "a1"), (second, "b1"), (first, "a2")):
            outcome = await sessions.call(name, "where", {})
            assert outcome.ok, outcome.error
            pids[name] = outcome.result
        assert pids["a0"] == pids["a1"] != pids["a2"]  # one process, no fork per call; a2 in its own
        assert pids["b0"] == pids["b1"] != pids["a0"]
        assert pool.transit_calls == 4 and pool.live_calls == 1


async def test_without_a_tenant_a_cold_call_makes_room_as_before(pool_factory: Any) -> None:
    async with pool_factory(size=1, residents=1) as pool:
        sessions = Sessions(pool, None)
        for name in ("c0", "c1"):
            await sessions.create(name)
        for name in ("c0", "c1", "c0"):
            outcome = await sessions.call(name, "add", {"amount": 1, "tag": "x"})
            assert outcome.ok, outcome.error
        assert pool.transit_calls == 0 and pool.rebuilt_calls == 3  # each ends the other's process
