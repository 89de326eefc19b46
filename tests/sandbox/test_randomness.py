"""Randomness in a session is what one plain process would draw, however its process was made.

Every session process is a fork (of its environment's host or of a scenario's template), and
sessions are rebuilt from their stored state whenever their process is gone. Neither may change
what the class draws: a ``random.seed`` it makes holds across the fork and every rebuild, sessions
made from one template never share draws, and a session given a seed draws the same everywhere.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import types
from typing import Any

import pytest

from sandbox.pool.calls import EnvCode
from sandbox.pool.requests import WorkerPool
from sandbox.state.readonly import ReadOnly
from sandbox.worker.randomness import HIDDEN
from sandbox.worker.resident import LiveSession
from tests.sandbox.calls import session_call

pytestmark = pytest.mark.anyio

SEEDING = EnvCode("random-seeding", "random_seeding", "Dice", '''
import random


class Dice:
    def __init__(self, config=None):
        random.seed(42)
        self.first = random.random()

    def roll(self) -> float:
        return random.random()
''')

DRAWING = EnvCode("random-drawing", "random_drawing", "Tokens", '''
import os
import random
import secrets
import uuid


class Tokens:
    def __init__(self, config=None):
        self.token = str(uuid.uuid4())
        self.pin = random.randint(0, 10**9)
        self.rng = random.Random()

    def draw(self) -> dict:
        return {"random": random.random(), "uuid": str(uuid.uuid4()), "secret": secrets.token_hex(8),
                "urandom": os.urandom(4).hex(), "rng": self.rng.random(), "system": random.SystemRandom().random()}

    def same(self) -> int:
        return 1
''')

PLAIN = EnvCode("random-plain", "random_plain", "Counter", '''
import random


class Counter:
    def __init__(self, config=None):
        self.count = 0

    def roll(self) -> float:
        return random.random()

    def bump(self) -> int:
        self.count += 1
        return self.count
''')


READING = EnvCode("random-reading", "random_reading", "Dice", '''
import random


class Dice:
    def __init__(self, config=None):
        random.seed(42)
        self.first = random.random()
        self.rolled = []

    def roll(self) -> float:
        value = random.random()
        self.rolled.append(value)
        return value

    def last(self) -> float:
        return self.rolled[-1] if self.rolled else 0.0
''')


class Session:
    """A session as the service keeps it (whole states), with its randomness' tag and seed."""

    def __init__(self, pool: WorkerPool, env: EnvCode, sid: str, stream: str, seed: int | None = None) -> None:
        self.pool, self.env, self.sid, self.stream, self.seed = pool, env, sid, stream, seed
        self.state, self.step = "", 0

    async def start(self, template: str | None = None) -> Session:
        self.state = await self.pool.init_state(self.env, {}, self.sid, template, stream=self.stream, seed=self.seed)
        return self

    async def call(self, name: str, *, rebuild: bool = False) -> Any:
        if rebuild:
            self.pool.forget(self.sid)  # its process is gone: rebuilt from the stored state

        async def stored() -> str:
            return self.state

        outcome = await session_call(self.pool, self.env, self.sid, self.step, stored, name, {},
                                               stream=self.stream, seed=self.seed)
        assert outcome.ok, outcome.error
        assert all(not entry["path"].startswith(f"/{HIDDEN}") for kind in ("added", "removed", "changed")
                   for entry in outcome.diff[kind])
        self.step += 1
        if outcome.state is not None:
            self.state = outcome.state
        return outcome.result


def _plain_dice(rolls: int) -> list[float]:
    random.seed(42)
    random.random()
    return [random.random() for _ in range(rolls)]


@pytest.mark.parametrize("template", [None, "t-dice"])
async def test_a_class_seeding_random_draws_as_in_one_plain_process(pool_factory: Any, template: str | None) -> None:
    async with pool_factory(size=1) as pool:
        live = await Session(pool, SEEDING, "live", "a").start(template)
        assert [await live.call("roll") for _ in range(3)] == _plain_dice(3)
        rebuilt = await Session(pool, SEEDING, "rebuilt", "b").start(template)
        assert [await rebuilt.call("roll", rebuild=True) for _ in range(4)] == _plain_dice(4)


async def test_reads_proven_to_change_nothing_between_draws_leave_the_stream_where_it_was(pool_factory: Any) -> None:
    """``last`` is proven read-only, so its calls do not look at the random state at all: the draws
    around them, live and rebuilt, are still one plain process's."""
    async with pool_factory(size=1) as pool:
        session = await Session(pool, READING, "a", "a").start("t-reading")
        rolls, lasts = [], []
        for rebuild in (False, False, True, False):
            rolls.append(await session.call("roll", rebuild=rebuild))
            stored = session.state
            lasts.append(await session.call("last"))
            assert session.state == stored  # (nothing to store: not even the random state)
            lasts.append(await session.call("last", rebuild=True))
        assert rolls == _plain_dice(4)
        assert lasts == [value for value in rolls for _ in range(2)]


HOOKED = '''
import random
import sys


class Dice:
    def __init__(self, config=None):
        self.rolled = []

    def arm(self) -> int:
        sys.setprofile(lambda frame, event, arg: random.random() if event == "call" else None)
        return 1

    def last(self) -> int:
        return len(self.rolled)
'''


def test_a_draw_made_beside_a_proven_read_is_stored() -> None:
    """A profile hook an earlier call set runs during a read proven to change nothing: what it
    draws is the session's, and stored, as one plain process would go on from there."""
    module = types.ModuleType("random_hooked")
    exec(compile(HOOKED, "<env random_hooked>", "exec"), module.__dict__)
    session = LiveSession(module, module.Dice, ReadOnly(module, HOOKED, module.Dice))
    session.handle({"op": "init", "init_config": {}})
    assert session.readonly is not None and session.readonly.proven("last", module.Dice)
    plain, _ = session.handle({"op": "call", "name": "last", "arguments": {}})
    assert plain["state"] is None  # (nothing drew: nothing to store)
    try:
        session.handle({"op": "call", "name": "arm", "arguments": {}})
        armed = json.loads(session.text).get(HIDDEN)
        answer, kept = session.handle({"op": "call", "name": "last", "arguments": {}})
    finally:
        sys.setprofile(None)
    assert kept and answer["ok"] and answer["result"] == 0
    assert json.loads(session.text)[HIDDEN] != armed  # what the hook drew during the read is stored


async def test_sessions_of_one_template_never_share_draws(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        first = await Session(pool, DRAWING, "a", "a").start("t-tokens")
        second = await Session(pool, DRAWING, "b", "b").start("t-tokens")
        one, two = json.loads(first.state), json.loads(second.state)
        assert one["token"] != two["token"] and one["pin"] != two["pin"]
        drawn = await first.call("draw"), await second.call("draw")
        assert all(drawn[0][name] != drawn[1][name] for name in drawn[0])
        (memory,) = (await pool.measure()).values()
        assert memory.templates == 0  # its __init__ draws: no template is kept for it
        counted = await Session(pool, PLAIN, "c", "c").start("t-plain")
        assert await counted.call("bump") == 1
        (memory,) = (await pool.measure()).values()
        assert memory.templates == 1  # a deterministic __init__ keeps its template
        other = await Session(pool, PLAIN, "d", "d").start("t-plain")
        assert await counted.call("roll") != await other.call("roll")


async def test_a_session_goes_on_drawing_where_it_was_after_a_rebuild(pool_factory: Any) -> None:
    """The stored state carries the ``random`` module's state, and a fork (same tag) goes on alike."""
    async with pool_factory(size=1) as pool:
        session = await Session(pool, PLAIN, "a", "tag").start("t-plain")
        await session.call("roll")
        fork = Session(pool, PLAIN, "fork", "tag")
        fork.state, fork.step = session.state, session.step
        assert await session.call("roll", rebuild=True) == await fork.call("roll")
        assert await session.call("roll") == await fork.call("roll", rebuild=True)
        stranger = Session(pool, PLAIN, "stranger", "other")  # another stream: draws its own
        stranger.state, stranger.step = session.state, session.step
        assert await session.call("roll") != await stranger.call("roll")


async def test_a_seed_makes_every_draw_the_same_everywhere(pool_factory: Any) -> None:
    async with pool_factory(size=2) as pool:
        runs = []
        for name, seed, rebuild in (("a", 7, False), ("b", 7, True), ("c", 8, False)):
            session = await Session(pool, DRAWING, name, name, seed).start("t-tokens")
            draws = [await session.call("draw", rebuild=rebuild) for _ in range(3)]
            runs.append((json.loads(session.state)["token"], draws))
        assert runs[0] == runs[1]
        assert runs[0][0] != runs[2][0] and all(
            runs[0][1][0][name] != runs[2][1][0][name] for name in runs[0][1][0])
        plain = await Session(pool, PLAIN, "d", "d", 7).start("t-plain")
        random.seed(7)
        assert await plain.call("roll", rebuild=True) == random.random()


async def test_checks_and_the_state_never_show_the_randomness(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        session = await Session(pool, PLAIN, "a", "a").start()
        await session.call("roll")
        assert HIDDEN in json.loads(session.state)
        checks = [f"def check_func(final_state):\n    return {HIDDEN!r} not in final_state and "
                  f"{HIDDEN!r} not in initial_state and final_state['count'] == 0"]
        (verdict,) = await pool.score(PLAIN, session.state, session.state, checks)
        assert verdict == {"passed": True, "error": None}


RESERVED = EnvCode("random-reserved", "random_reserved", "Shadow", '''
class Shadow:
    def __init__(self, config=None):
        self.count = 0

    def shadow(self) -> int:
        self.count += 1
        self.__random__ = "mine"
        return self.count

    def bump(self) -> int:
        self.count += 1
        return self.count
''')


async def test_an_attribute_named_as_the_stored_randomness_fails_its_call_and_changes_nothing(
        pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        session = await Session(pool, RESERVED, "a", "a").start()
        outcome = await session_call(pool, RESERVED, "a", 0, _stored(session), "shadow", {}, stream="a")
        assert not outcome.ok and outcome.error is not None and HIDDEN in outcome.error["message"]
        assert "reserved" in outcome.error["message"]
        assert await session.call("bump") == 1  # the failed call's write was rolled back with it


def _stored(session: Session) -> Any:
    async def stored() -> str:
        return session.state
    return stored


WORDS = EnvCode("string-set", "string_set", "Words", '''
class Words:
    def __init__(self, config=None):
        self.words = {"kiwi", "fig"}

    def add(self) -> list:
        for word in ("apple", "pear", "plum", "lime", "date", "yuzu"):
            self.words.add(word)
        return list(self.words)

    def listed(self) -> list:
        return list(self.words)
''')


async def test_a_set_of_strings_keeps_its_order_in_every_worker(pool_factory: Any) -> None:
    """str hashes are randomised per process unless PYTHONHASHSEED is set: every worker shares one,
    so a set rebuilt in another worker iterates as it did where it was built."""
    async with pool_factory(size=2, hash_seed=1) as pool:
        session = await Session(pool, WORDS, "a", "a").start()
        built = await session.call("add")
        listed = {tuple(await session.call("listed", rebuild=True)) for _ in range(6)}  # workers in turn
        assert listed == {tuple(built)}
        plain = subprocess.run(
            [sys.executable, "-c", "w = {'kiwi', 'fig'}\nfor x in ('apple', 'pear', 'plum', 'lime', 'date', 'yuzu'): "
                                   "w.add(x)\nprint(list(w))"],
            env={"PYTHONHASHSEED": "1"}, capture_output=True, text=True, check=True).stdout
        assert plain.strip() == str(built)  # as a plain process with that PYTHONHASHSEED has it
