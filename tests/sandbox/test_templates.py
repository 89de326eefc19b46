"""Sessions made from one initial state start as forks of a process that holds it built.

A scenario's initial state is built once per worker (its *template*); each session made from it
is a fork of that process, so creating one costs neither building nor encoding the state,
whatever its size (bench/live_memory.py prints the figures), and live sessions share the
template's memory until they change it. Sessions stay independent, and what they start from is
exactly what a plain init builds.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from sandbox.pool.calls import CallOutcome, EnvCode, Stored
from sandbox.pool.requests import WorkerPool
from sandbox.state.deltas import Base, compose
from tests.sandbox.calls import session_call

pytestmark = pytest.mark.anyio

CODE = '''
import time

BUILT = []


class Shop:
    def __init__(self, config=None):
        BUILT.append(1)
        self.items = {f"i{n}": {"stock": n} for n in range((config or {}).get("count", 3))}
        self.ticket = time.monotonic_ns()  # (not a draw: a template whose __init__ draws is not kept)

    def buy(self, item: str) -> dict:
        self.items[item]["stock"] -= 1
        return {"success": True, "left": self.items[item]["stock"]}

    def stock(self, item: str) -> int:
        return self.items[item]["stock"]

    def builds(self) -> int:
        return len(BUILT)

    def add(self, item: str, stock: int) -> dict:
        self.items[item] = {"stock": stock}
        return {"success": True}

    def drop(self, item: str) -> dict:
        del self.items[item]
        return {"success": True}

    def stocks(self) -> dict:
        return {item: entry["stock"] for item, entry in self.items.items()}
'''
SHOP = EnvCode("templates-shop", "templates_shop", "Shop", CODE)
FAILING = EnvCode("templates-failing", "templates_failing", "Shop", CODE.replace(
    "        BUILT.append(1)", "        if (config or {}).get('fail'):\n            raise ValueError('no shop today')\n"
                              "        BUILT.append(1)"))


class Live:
    def __init__(self, pool: WorkerPool, session: str, state: str) -> None:
        self.pool, self.session, self.state, self.step = pool, session, state, 0

    @classmethod
    async def start(cls, pool: WorkerPool, session: str, template: str, config: dict[str, Any]) -> Live:
        return cls(pool, session, await pool.init_state(SHOP, config, session=session, template=template))

    async def call(self, name: str, **arguments: Any) -> Any:
        async def stored() -> str:
            return self.state

        outcome = await session_call(self.pool, SHOP, self.session, self.step, stored, name, arguments)
        assert outcome.ok, outcome.error
        self.step += 1
        if outcome.state is not None:
            self.state = outcome.state
        return outcome.result


async def test_sessions_from_one_template_start_alike_and_go_their_own_ways(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        plain = await pool.init_state(SHOP, {"count": 3})
        first = await Live.start(pool, "a", "t-shop", {"count": 3})
        second = await Live.start(pool, "b", "t-shop", {"count": 3})
        (memory,) = (await pool.measure()).values()
        assert memory.templates == 1
        # the template built the instance once; both sessions are forks of it
        assert await first.call("builds") == 1 and await second.call("builds") == 1
        assert json.loads(first.state)["ticket"] == json.loads(second.state)["ticket"]
        without_ticket = {k: v for k, v in json.loads(plain).items() if k != "ticket"}
        assert {k: v for k, v in json.loads(first.state).items() if k != "ticket"} == without_ticket
        assert (await first.call("buy", item="i2"))["left"] == 1
        assert await second.call("stock", item="i2") == 2  # untouched by the other session
        third = await Live.start(pool, "c", "t-shop", {"count": 3})
        assert await third.call("stock", item="i2") == 2  # nor did it reach the template


async def test_another_template_key_builds_its_own_instance(pool_factory: Any) -> None:
    """The service makes the key from the tenant, the code and the config: another key (another
    tenant, say) never starts from what a first one built."""
    async with pool_factory(size=1) as pool:
        first = await Live.start(pool, "a", "t-one", {"count": 3})
        other = await Live.start(pool, "b", "t-two", {"count": 3})
        assert json.loads(first.state)["ticket"] != json.loads(other.state)["ticket"]
        (memory,) = (await pool.measure()).values()
        assert memory.templates == 2


async def test_an_init_that_fails_through_a_template_reports_its_error(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        with pytest.raises(Exception) as failed:
            await pool.init_state(FAILING, {"fail": True}, session="a", template="t-fail")
        assert "no shop today" in str(failed.value)
        (memory,) = (await pool.measure()).values()
        assert memory.templates == 0 and pool.replaced == 0
        assert isinstance(await pool.init_state(FAILING, {}, session="b", template="t-fine"), str)


async def test_a_deleted_environments_templates_end(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        await Live.start(pool, "a", "t-shop", {"count": 3})
        pool.unload(SHOP.key)
        (memory,) = (await pool.measure()).values()
        assert memory.templates == 0 and memory.live == 0
        again = await Live.start(pool, "b", "t-shop", {"count": 3})
        assert await again.call("builds") == 1  # a new host, a new template


async def test_a_cold_session_rebuilt_from_its_template_and_delta_is_exactly_its_stored_state(
        pool_factory: Any) -> None:
    """A session kept as its scenario's initial state plus a delta, its process gone, is rebuilt as
    a fork of the template with the delta applied, whatever the delta holds: entries changed in
    place (only they are looked at then), added, removed. Its answers, the deltas of its later
    calls and the state they compose to are those of the session that never went cold; the state
    arrives in init_config, as EnvScaler's scenarios carry it."""
    async with pool_factory(size=1) as pool:
        config = {"count": 0, "items": {f"i{n}": {"stock": n} for n in range(300)}}
        base = await pool.init_state(SHOP, config, session="s", template="t-cold", deltas=True)
        digest = hashlib.sha256(base.encode()).hexdigest()
        fields: dict[str, str] = {}
        expected = {f"i{n}": n for n in range(300)}
        step = 0

        async def run(name: str, **arguments: Any) -> Any:
            nonlocal step

            async def stored() -> Stored:
                return Stored(compose(Base(base), fields), dict(fields), template="t-cold", init_config=config,
                              base=digest)

            outcome = await session_call(pool, SHOP, "s", step, stored, name, arguments, deltas=True)
            assert outcome.ok, outcome.error
            assert outcome.state is None or outcome.delta is not None or outcome.rebase is False
            if outcome.delta is not None:
                fields.update(outcome.delta["set"])
                for gone in outcome.delta["unset"]:
                    fields.pop(gone, None)
            step += 1
            return outcome.result

        for name, arguments, change in (
            ("buy", {"item": "i5"}, lambda: expected.update(i5=4)),
            ("buy", {"item": "i299"}, lambda: expected.update(i299=298)),
            ("add", {"item": "new", "stock": 7}, lambda: expected.update(new=7)),
            ("buy", {"item": "new"}, lambda: expected.update(new=6)),
            ("drop", {"item": "i7"}, lambda: expected.pop("i7")),
            ("buy", {"item": "i8"}, lambda: expected.update(i8=7)),
        ):
            await run(name, **arguments)
            change()
            pool.forget("s")  # its process no longer serves it: the next call rebuilds it
            assert await run("stocks") == expected
            assert await run("stock", item="i5") == expected["i5"]
            shown = json.loads(compose(Base(base), fields))["items"]
            assert {item: entry["stock"] for item, entry in shown.items()} == expected
            assert list(shown) == list(expected)  # (the order the plain class keeps)


async def test_a_rebuild_from_the_template_leaves_the_stored_text_in_the_service(pool_factory: Any) -> None:
    """A scenario's state may be megabytes: a cold session whose delta only changed entries in place
    is rebuilt from the template and the delta, and its stored text never crosses to the worker. A
    delta that added an entry, or a base the template does not hold, still takes the text (the
    worker asks for it), and every rebuild answers exactly the stored state."""
    async with pool_factory(size=1) as pool:
        config = {"count": 0, "items": {f"i{n}": {"stock": n} for n in range(50)}}
        base = await pool.init_state(SHOP, config, session="seed", template="t-text", deltas=True)
        digest = hashlib.sha256(base.encode()).hexdigest()
        sent: list[dict[str, Any]] = []
        request = pool._request

        async def spy(message: dict[str, Any], *args: Any) -> Any:
            if message.get("op") == "call":
                sent.append(dict(message))
            return await request(message, *args)

        pool._request = spy  # type: ignore[method-assign]

        async def rebuilt(session: str, fields: dict[str, str], known: str = digest) -> Any:
            stored = Stored(compose(Base(base), fields), dict(fields), template="t-text", init_config=config, base=known)
            sent.clear()
            outcome = await pool.session_call(SHOP, session, 3, "stocks", {}, stored, deltas=True)
            assert isinstance(outcome, CallOutcome) and outcome.ok, outcome
            return outcome.result, ["state" in message for message in sent]

        in_place = {'["items","i3"]': '={"stock":99}'}
        assert await rebuilt("a", in_place) == ({**{f"i{n}": n for n in range(50)}, "i3": 99}, [False])
        assert await rebuilt("b", {}) == ({f"i{n}": n for n in range(50)}, [False])  # a group's new member
        added = {'["items","new"]': '+0:{"stock":5}'}
        assert await rebuilt("c", added) == ({**{f"i{n}": n for n in range(50)}, "new": 5}, [True])
        # (a base the template does not hold: the worker asks for the text, and decodes it)
        assert await rebuilt("d", in_place, known="0" * 64) == \
            ({**{f"i{n}": n for n in range(50)}, "i3": 99}, [False, True])
