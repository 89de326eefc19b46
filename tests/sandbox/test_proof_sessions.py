"""A served session shows what the class gives run plainly in one process, for tools whose writes
the read-only and confined proofs once missed: a loop or comprehension whose target is ``self.x``
or ``self.d[k]``, and a tool that reads on the class proven but runs on a class that
``self.__class__ = ...`` put in its place."""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest

from sandbox.pool.calls import EnvCode
from sandbox.pool.requests import WorkerPool
from sandbox.state.readonly import ReadOnly
from sandbox.worker.resident import CLASS_FIELD, instantiate, public_state
from tests.sandbox.test_residents import Stored

pytestmark = pytest.mark.anyio

QUEUE = '''
class Queue:
    def __init__(self, config=None):
        self.queue = ["a", "b", "c", "d"]
        self.cursor = 0
        self.seen = {"last": ""}
        self.scores = [3, 9, 4]
        self.best = 0

    def advance(self):
        for self.cursor in range(self.cursor + 1, len(self.queue)):
            break
        return self.queue[self.cursor]

    def mark(self, key="x"):
        for self.seen["last"] in [key]:
            pass
        return key

    def top(self):
        return max([self.best for self.best in self.scores])

    def current(self):
        return self.queue[self.cursor]
'''

BANK = '''
class FrozenAccount:
    def balance_of(self):
        self.reads += 1
        return self.balance

    def withdraw(self, amount=1):
        return "account frozen"


class Account:
    def __init__(self, config=None):
        self.balance = 10
        self.reads = 0

    def freeze(self):
        self.__class__ = FrozenAccount
        return "frozen"

    def balance_of(self):
        return self.balance

    def withdraw(self, amount=1):
        self.balance -= amount
        return self.balance
'''


class Plain:
    """The same class run plainly in this process: the reference a session must match."""

    def __init__(self, code: str, class_name: str) -> None:
        self.module = types.ModuleType(f"plain_{class_name.lower()}")
        sys.modules[self.module.__name__] = self.module
        exec(compile(code, f"<plain {class_name}>", "exec"), self.module.__dict__)
        self.instance = instantiate(getattr(self.module, class_name), {})
        self.class_name = class_name

    def call(self, name: str, **arguments: Any) -> Any:
        return getattr(self.instance, name)(**arguments)

    def state(self) -> dict[str, Any]:
        """What the service stores of it: its attributes, and its class where a tool changed it."""
        state = public_state(self.instance)
        if type(self.instance).__name__ != self.class_name:
            state[CLASS_FIELD] = type(self.instance).__qualname__
        return state


async def _calls(pool: WorkerPool, env: EnvCode, plain: Plain, stored: Stored, session: str,
                 calls: list[tuple[str, dict[str, Any]]]) -> None:
    for name, arguments in calls:
        out = await stored.call(pool, session, name, **arguments)
        assert out.ok, out.error
        assert out.result == plain.call(name, **arguments), name
        assert json.loads(stored.state) == plain.state(), f"the state after {name}"


@pytest.mark.parametrize("tool", ["advance", "mark", "top"])
async def test_a_store_through_a_loop_or_comprehension_target_is_kept_and_survives_a_rebuild(
        pool_factory: Any, tool: str) -> None:
    env = EnvCode("proof-queue", "proof_queue", "Queue", QUEUE)
    plain = Plain(QUEUE, "Queue")
    async with pool_factory(size=1) as pool:
        stored = Stored(await pool.init_state(env, {}, "s1"))
        await _calls(pool, env, plain, stored, "s1", [(tool, {"key": "k"} if tool == "mark" else {})])
        # Rebuilt from what is stored (another worker, or this one after a restart): the next call
        # answers as the instance that made the state would.
        rebuilt = await pool.call(env, stored.state, "advance", {})
        assert rebuilt.ok and rebuilt.result == plain.call("advance")


async def test_a_tool_on_an_instance_given_another_class_is_not_taken_for_read_only(pool_factory: Any) -> None:
    env = EnvCode("proof-bank", "proof_bank", "Account", BANK)
    plain = Plain(BANK, "Account")
    async with pool_factory(size=1) as pool:
        stored = Stored(await pool.init_state(env, {}, "s1"))
        await _calls(pool, env, plain, stored, "s1",
                     [("balance_of", {}), ("freeze", {}), ("balance_of", {}), ("withdraw", {}), ("balance_of", {})])
        assert plain.state() == {"balance": 10, "reads": 2, CLASS_FIELD: "FrozenAccount"}


LEDGER = '''
class Ledger:
    def __init__(self, config=None):
        self.accounts = {f"A{i}": {"note": "", "tags": ["retail"]} for i in range(40)}
        self.log = ["opened"]

    def _require(self, account_id):
        if account_id not in self.accounts:
            raise KeyError(account_id)
        return self.accounts[account_id]

    def _or_log(self, account_id):
        found = self.accounts.get(account_id)
        if found is None:
            return self.log
        return found

    def note(self, account_id, text="n"):
        account = self._require(account_id)
        account["note"] = text
        return account

    def remember(self, account_id, text="n"):
        account = self.accounts.get(account_id, {})
        account.setdefault("history", []).append(text)
        return len(account)

    def open(self, account_id, tag="t"):
        self.accounts.setdefault(account_id, {"note": "", "tags": []})["tags"].append(tag)
        return sorted(self.accounts)[-1]

    def tag(self, account_id, tag="t"):
        tags = self.accounts[account_id].get("tags", [])
        tags.append(tag)

    def stray(self, account_id, text="n"):
        found = self._or_log(account_id)
        if isinstance(found, list):
            found.append(text)
'''


async def test_entries_named_through_helpers_get_and_setdefault_are_kept_as_the_class_keeps_them(
        pool_factory: Any) -> None:
    """Tools confined through a helper that checks then returns, ``.get`` with a literal default,
    ``setdefault`` below an entry and of a new entry (which moves none but adds one), and a helper
    that may give back another attribute (not confined): each state as the class's run plainly."""
    env = EnvCode("proof-ledger", "proof_ledger", "Ledger", LEDGER)
    plain = Plain(LEDGER, "Ledger")
    proof = ReadOnly(plain.module, LEDGER, plain.module.Ledger)
    assert set(proof.confined) == {"note", "remember", "open", "tag"}  # (``stray`` is not: it may reach ``log``)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("note", {"account_id": "A3", "text": "first"}), ("remember", {"account_id": "A3", "text": "x"}),
        ("remember", {"account_id": "B9", "text": "y"}), ("open", {"account_id": "A7", "tag": "gold"}),
        ("open", {"account_id": "B1", "tag": "new"}), ("note", {"account_id": "B1", "text": "added"}),
        ("tag", {"account_id": "A5"}), ("stray", {"account_id": "A2", "text": "bad"}),
        ("stray", {"account_id": "Z0", "text": "logged"}), ("open", {"account_id": "B1", "tag": "again"}),
        ("remember", {"account_id": "B1", "text": "z"}),
    ]
    async with pool_factory(size=1) as pool:
        stored = Stored(await pool.init_state(env, {}, "s1"))
        await _calls(pool, env, plain, stored, "s1", calls)
    assert plain.state()["log"] == ["opened", "logged"] and "B1" in plain.state()["accounts"]
