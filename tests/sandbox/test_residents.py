"""Live sessions: a session's instance stays in its worker between calls, is used only at the
step the caller holds, and is dropped whenever it may no longer match what is stored."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import anyio
import pytest

from sandbox.pool.requests import WorkerPool
from sandbox.state import encoder, view
from sandbox.state.parts import Parts, shares
from tests.sandbox.calls import session_call
from tests.sandbox.test_contract import PROBE, _descendants, _worker_pid

pytestmark = pytest.mark.anyio


class Stored:
    """A session as the service keeps it: its step and state, and how often the state was read."""

    def __init__(self, state: str) -> None:
        self.state, self.step, self.reads = state, 0, 0

    async def load(self) -> str:
        self.reads += 1
        return self.state

    async def call(self, pool: WorkerPool, session: str, name: str, **arguments: Any) -> Any:
        out = await session_call(pool, PROBE, session, self.step, self.load, name, arguments)
        self.step += 1
        if out.state is not None:
            self.state = out.state
        return out


async def _session(pool: WorkerPool, session: str, config: dict[str, Any] | None = None) -> Stored:
    return Stored(await pool.init_state(PROBE, config or {"counter": 0}, session))


async def test_calls_on_a_live_session_never_read_the_stored_state(pool_factory: Any) -> None:
    async with pool_factory(size=2) as pool:
        stored = await _session(pool, "s1")
        for expected in range(1, 6):
            out = await stored.call(pool, "s1", "increment")
            assert out.ok and out.result == {"success": True, "data": expected}
        assert stored.reads == 0
        assert json.loads(stored.state)["counter"] == 5


async def test_a_session_at_another_step_is_rebuilt_from_the_stored_state(pool_factory: Any) -> None:
    """What another replica committed meanwhile wins: the live instance is at an older step."""
    async with pool_factory(size=1) as pool:
        stored = await _session(pool, "s1")
        await stored.call(pool, "s1", "increment")
        elsewhere = await pool.call(PROBE, stored.state, "increment", {"by": 10})  # another replica's step
        stored.state, stored.step = elsewhere.state, stored.step + 1
        out = await stored.call(pool, "s1", "get_counter")
        assert out.result == 11 and stored.reads == 1


async def test_a_failed_call_drops_the_live_instance_and_the_next_starts_from_the_stored_state(
        pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        stored = await _session(pool, "s1")
        await stored.call(pool, "s1", "increment")
        failed = await stored.call(pool, "s1", "fail_after_change")
        assert not failed.ok and failed.error["type"] == "tool_exception" and failed.state is None
        out = await stored.call(pool, "s1", "get_counter")
        assert out.ok and out.result == 1 and stored.reads == 1
        assert json.loads(stored.state)["counter"] == 1 and "half" not in json.loads(stored.state)["items"]


async def test_an_uncommitted_step_is_forgotten(pool_factory: Any) -> None:
    """The caller could not store the step a call made: the live instance, which made it, must go."""
    async with pool_factory(size=1) as pool:
        stored = await _session(pool, "s1")
        lost = await session_call(pool, PROBE, "s1", 0, stored.load, "increment", {"by": 7})
        assert lost.ok
        pool.forget("s1")
        out = await stored.call(pool, "s1", "get_counter")
        assert out.result == 0 and stored.reads == 1


async def test_module_changes_stay_in_their_own_session(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        a, b = await _session(pool, "a"), await _session(pool, "b")
        assert (await a.call(pool, "a", "pollute", value="from-a")).ok
        seen = (await b.call(pool, "b", "observe")).result
        assert seen["shared"] == [] and seen["polluted"] is None and seen["loads"] != 1000


async def test_live_sessions_are_stopped_between_their_calls(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        for name in ("a", "b", "c"):
            stored = await _session(pool, name)
            await stored.call(pool, name, "increment")
        worker = await pool._acquire(None)
        pool._put(worker)
        # Every process that ran environment code (hosts, ready forks, the three residents) is
        # stopped; only the worker's own zygote waits for work. (A host may still be making its
        # next ready fork, which the worker starts once idle: it rests again when done.)
        for _ in range(50):
            states = [_process_state(pid) for pid in _descendants(_worker_pid(worker))]
            if "R" not in states:
                break
            await anyio.sleep(0.02)
        assert states.count("T") >= 4 and set(states) <= {"T", "S", "t"}, states


async def test_the_oldest_live_session_goes_past_the_bound(pool_factory: Any) -> None:
    async with pool_factory(size=1, residents=2) as pool:
        a, b = await _session(pool, "a"), await _session(pool, "b")
        await a.call(pool, "a", "increment")
        await b.call(pool, "b", "increment")
        c = await _session(pool, "c")  # a is the least recently used of the two kept
        await c.call(pool, "c", "increment")
        await b.call(pool, "b", "increment")
        assert (a.reads, b.reads, c.reads) == (0, 0, 0)
        out = await a.call(pool, "a", "get_counter")
        assert out.result == 1 and a.reads == 1


def _process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


# -- encoding part by part -----------------------------------------------------------------
def _tree(rng: random.Random) -> dict[str, Any]:
    return {
        "users": {f"U{i}": {"name": f"user {i}", "tags": [rng.randint(0, 9)], "score": rng.random()}
                  for i in range(rng.randint(0, 6))},
        "counter": rng.randint(0, 5),
        "log": [f"line {i}" for i in range(rng.randint(0, 3))],
        "$odd": {"$ef": 1} if rng.random() < 0.3 else {"x": (1, 2)},
        "when": {"set": {1, 2, 3}, "tuple": (rng.randint(0, 3), "a")},
    }


def _mutate(state: dict[str, Any], rng: random.Random) -> None:
    choice = rng.randint(0, 6)
    users = state["users"]
    if choice == 0 and users:
        users.pop(rng.choice(sorted(users)))
    elif choice == 1:
        users[f"N{rng.randint(0, 99)}"] = {"name": "new", "tags": [], "score": 0.5}
    elif choice == 2 and users:
        users[rng.choice(sorted(users))]["tags"].append(rng.randint(0, 9))
    elif choice == 3:
        state["counter"] += 1
    elif choice == 4:
        state.pop("log", None) if rng.random() < 0.5 else state.setdefault("log", []).append("more")
    elif choice == 5:
        state["users"] = {k: users[k] for k in reversed(list(users))}
    else:
        state["fresh"] = {"deep": {"er": [rng.randint(0, 3)]}}


def test_parts_encode_and_diff_exactly_as_the_whole_state() -> None:
    rng = random.Random(7)
    for _ in range(40):
        state = _tree(rng)
        text = encoder.encode_state(state)
        parts = Parts("nomodule", state, json.loads(text))
        for _ in range(8):
            before = view.view_encoded(json.loads(text))
            _mutate(state, rng)
            assert not shares(state, "nomodule")
            text, diff = parts.update(state)
            assert text == encoder.encode_state(state)
            assert diff == view.diff(before, view.view_encoded(json.loads(text)))


def test_shared_objects_are_found_as_the_codec_counts_them() -> None:
    leaf: dict[str, Any] = {"x": 1}
    assert shares({"a": leaf, "b": leaf}, "m")
    assert shares({"a": [leaf, [leaf]]}, "m")
    cycle: list[Any] = []
    cycle.append(cycle)
    assert shares({"a": cycle}, "m")
    assert not shares({"a": (), "b": (), "c": "same", "d": "same", "e": 10**30, "f": 10**30}, "m")
    assert not shares({"a": {"x": 1}, "b": {"x": 1}}, "m")
    pid = os.getpid()
    assert not shares({"pid": pid, "again": pid}, "m")


async def test_a_worker_full_of_live_sessions_still_starts_new_ones(pool_factory: Any) -> None:
    """Every live session holds a process: the worker's process budget (a container's pids limit,
    the uid's process limit) covers the residents it keeps, and more sessions than that evict."""
    async with pool_factory(size=1, residents=32) as pool:
        count = pool.limits.residents + 6
        sessions = [await _session(pool, f"s{i}") for i in range(count)]
        for i, stored in enumerate(sessions):
            out = await stored.call(pool, f"s{i}", "increment")
            assert out.ok, out.error
        assert pool.replaced == 0
