"""A full worker keeps the sessions it has no room to give a process of their own in a lodge.

At 10,000 sessions of an RL batch a worker cannot keep a process (about 3 MB of its own) per
session: each call of a cold session used to end the least recently used live process to make
room, then fork and rebuild its own. Now, once full, the worker rebuilds such a session in one
process per environment and tenant that holds many sessions' instances, where it stays live.
These tests hold that lodged sessions answer as the class run plainly (their randomness too,
while other sessions draw in the same process), end no session's process, stay live, never
share a process with another tenant's, and go when deleted.
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
import gc
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

    def census(self) -> int:
        """Instances of this class alive in the process serving the call."""
        return sum(1 for found in gc.get_objects() if isinstance(found, Ledger))
'''
ENV = EnvCode("lodged-ledger", "lodged_ledger", "Ledger", LEDGER)


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


async def test_lodged_sessions_answer_as_the_class_run_plainly_and_stay_live(pool_factory: Any) -> None:
    async with pool_factory(size=1, residents=2) as pool:
        sessions = Sessions(pool, "tenant-a")
        names = [f"s{i}" for i in range(6)]
        for name in names:
            await sessions.create(name)
        script = [("add", {"amount": 5, "tag": "b"}), ("fail", {"amount": 100}), ("add", {"amount": -2, "tag": "a"}),
                  ("add", {"amount": 7, "tag": "c"}), ("add", {"amount": 1, "tag": "b"})]
        expected = plain_run(script)
        answers: dict[str, list[Any]] = {name: [] for name in names}
        for name, arguments in script:  # the sessions in turn, each drawing between the others' draws
            for session in names:
                outcome = await sessions.call(session, name, arguments)
                answers[session].append(outcome.result if outcome.ok else None)
                if name == "fail":
                    assert outcome.error is not None and outcome.error["type"] == "tool_exception"
        assert all(answers[session] == expected for session in names), answers
        (memory,) = (await pool.measure()).values()
        assert memory.evicted == 0 and pool.replaced == 0 and memory.live == len(names)
        # Four sessions lodged at their first call, and again after the failed one; every other
        # call of theirs was live.
        assert pool.rebuilt_calls == 4 + 4 + 2, pool.rebuilt_calls
        assert pool.live_calls == len(names) * len(script) - pool.rebuilt_calls
        # The four lodged from the start (but their failed calls), and s4 once its failed call had
        # ended its own process: the lodge is then one of the worker's two processes.
        assert pool.lodged_calls == 4 * (len(script) - 1) + len(script) - 2


async def test_one_lodge_holds_a_tenants_sessions_and_none_of_another_tenants(pool_factory: Any) -> None:
    async with pool_factory(size=1, residents=1) as pool:
        first, second = Sessions(pool, "tenant-a"), Sessions(pool, "tenant-b")
        for name in ("b0", "b1"):
            await second.create(name)
        for name in ("a0", "a1", "a2"):
            await first.create(name)  # the last one keeps its own process
        pids = {}
        for sessions, name in ((first, "a0"), (second, "b0"), (first, "a1"), (second, "b1"), (first, "a2")):
            outcome = await sessions.call(name, "where", {})
            assert outcome.ok, outcome.error
            pids[name] = outcome.result
        assert pids["a0"] == pids["a1"] != pids["a2"]  # one process, no fork per session
        assert pids["b0"] == pids["b1"] != pids["a0"]
        assert pool.lodged_calls == 4 and pool.rebuilt_calls == 4
        again = await first.call("a0", "where", {})  # live now: no state read, same process
        assert again.result == pids["a0"] and pool.rebuilt_calls == 4 and pool.lodged_calls == 5


async def test_a_deleted_lodged_session_is_gone_and_the_others_stay(pool_factory: Any) -> None:
    async with pool_factory(size=1, residents=1) as pool:
        sessions = Sessions(pool, "tenant-a")
        for name in ("d0", "d1", "d2"):
            await sessions.create(name)
        for name in ("d0", "d1"):
            assert (await sessions.call(name, "add", {"amount": 3, "tag": "x"})).ok
        assert (await sessions.call("d1", "census", {})).result == 2  # d0 and d1 live in one lodge
        pool.end_session("d0")
        outcome = await sessions.call("d1", "add", {"amount": 4, "tag": "y"})  # (carries the deletion)
        assert outcome.ok and outcome.result["balance"] == 7
        assert (await sessions.call("d1", "census", {})).result == 1
        (memory,) = (await pool.measure()).values()
        assert memory.live == 2  # d1 lodged, d2 in its own process
        assert pool.rebuilt_calls == 2


async def test_without_a_tenant_a_cold_call_makes_room_as_before(pool_factory: Any) -> None:
    async with pool_factory(size=1, residents=1) as pool:
        sessions = Sessions(pool, None)
        for name in ("c0", "c1"):
            await sessions.create(name)
        for name in ("c0", "c1", "c0"):
            outcome = await sessions.call(name, "add", {"amount": 1, "tag": "x"})
            assert outcome.ok, outcome.error
        assert pool.lodged_calls == 0 and pool.rebuilt_calls == 3  # each ends the other's process



def database(records: int) -> EnvCode:
    code = f'''
class Database:
    def __init__(self, config=None):
        self.records = {{f"r{{i:05d}}": {{"name": "x" * 120, "n": i}} for i in range({records})}}

    def write(self, key: str, n: int) -> dict:
        self.records[key] = {{"name": "y", "n": n}}
        return {{"n": n}}
'''
    return EnvCode(f"lodged-database-{records}", f"lodged_database_{records}", "Database", code)


async def _write_in_turn(pool: WorkerPool, env: EnvCode, names: list[str], steps: int) -> None:
    states: dict[str, str] = {}
    for name in names:
        states[name] = await pool.init_state(env, {}, session=name)
    for step in range(steps):
        for name in names:
            async def stored(name: str = name) -> str:
                return states[name]

            outcome = await session_call(pool, env, name, step, stored, "write", {"key": "r00001", "n": step},
                                         scope="tenant-a")
            assert outcome.ok, outcome.error
            assert outcome.state is not None
            states[name] = outcome.state


async def test_a_lodge_keeps_what_its_workers_memory_has_room_for(pool_factory: Any) -> None:
    """Sessions over a 110 KB state: a lodge lets its least recently used go cold past half the
    room its worker has for live sessions (each taken to hold 16 times its text), so no call
    fails and no worker is lost for memory."""
    async with pool_factory(size=1, residents=1, memory_mb=128, resident_memory_mb=16, call_timeout=10.0) as pool:
        names = [f"m{i}" for i in range(40)]
        await _write_in_turn(pool, database(800), names, 2)
        (memory,) = (await pool.measure()).values()
        assert pool.replaced == 0 and pool.lodged_calls > 0
        assert 1 < memory.live < len(names), memory  # some lodged, not all of them
        assert pool.rebuilt_calls > len(names)  # those let go came back from the store


async def test_a_session_over_a_large_state_keeps_a_process_of_its_own(pool_factory: Any) -> None:
    """A lodge would hold a whole copy of a 1 MB state; a process forked from its template shares
    the template's pages: past 128 KB a full worker makes room as before."""
    async with pool_factory(size=1, residents=1, call_timeout=10.0) as pool:
        await _write_in_turn(pool, database(7000), ["big0", "big1", "big2"], 2)
        assert pool.lodged_calls == 0 and pool.rebuilt_calls == 6
