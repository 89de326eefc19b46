"""A served session is the class run plainly, through every rebuild: each example runs its calls
in this process, and through the pool with the instance rebuilt from the stored state before
every call; results and state must be the same (the issue's examples: set order, time zones,
bound methods and back-references in state, aliasing through collections, deep chains,
private and dunder attributes)."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from typing import Any

import pytest

from sandbox.pool.calls import EnvCode, Stored
from sandbox.pool.requests import WorkerPool
from sandbox.state import view
from sandbox.state.deltas import Base, compose
from sandbox.worker.resident import instantiate, public_state
from tests.sandbox.calls import session_call

pytestmark = pytest.mark.anyio

EXAMPLES: dict[str, tuple[str, list[tuple[str, dict[str, Any]]]]] = {
    "set_order": ('''
class Env:
    def __init__(self):
        self.members = {8}
        self.tags = frozenset({16, 0, 8})

    def join(self, n):
        self.members.add(n)
        return list(self.members)

    def first_member(self):
        return next(iter(self.members))

    def listed(self):
        return [list(self.members), list(self.tags)]
''', [("join", {"n": 0}), ("first_member", {}), ("join", {"n": 24}), ("listed", {})]),

    "time_zones": ('''
import datetime as dt
from zoneinfo import ZoneInfo


class Env:
    def __init__(self):
        self.start = dt.datetime(2024, 1, 15, 9, 0, tzinfo=ZoneInfo("America/New_York"))
        self.fixed = dt.datetime(2024, 1, 15, 9, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5), "EST"))
        self.ambiguous = dt.datetime(2024, 11, 3, 1, 30, fold=1, tzinfo=ZoneInfo("America/New_York"))

    def later(self, days):
        return (self.start + dt.timedelta(days=days)).isoformat()

    def zone_names(self):
        return [self.fixed.strftime("%Z"), self.start.tzname(), self.ambiguous.tzname(),
                self.ambiguous.utcoffset().total_seconds()]

    def shift(self, days):
        self.start = self.start + dt.timedelta(days=days)
        return self.start.strftime("%Y-%m-%d %H:%M %Z %z")
''', [("later", {"days": 180}), ("zone_names", {}), ("shift", {"days": 180}), ("later", {"days": 180}),
      ("zone_names", {})]),

    "bound_methods": ('''
class Env:
    def __init__(self):
        self.total = 0
        self.handlers = {"add": self._add, "sub": self._sub}
        self.log = Log()
        self.hooks = [self.log.write]

    def _add(self, n):
        self.total += n
        return self.total

    def _sub(self, n):
        self.total -= n
        return self.total

    def run(self, op, n):
        for hook in self.hooks:
            hook(op)
        return self.handlers[op](n)

    def report(self):
        return [self.total, self.log.lines, self.handlers["add"].__self__ is self]


class Log:
    def __init__(self):
        self.lines = []

    def write(self, line):
        self.lines.append(line)
''', [("run", {"op": "add", "n": 5}), ("run", {"op": "sub", "n": 2}), ("report", {})]),

    "back_references": ('''
class Account:
    def __init__(self, bank, name):
        self.bank = bank
        self.name = name
        self.balance = 0

    def deposit(self, amount):
        self.balance += amount
        self.bank.ledger.append([self.name, amount])


class Env:
    def __init__(self):
        self.accounts = {}
        self.ledger = []
        self.me = self

    def open(self, name):
        self.accounts[name] = Account(self, name)
        return name

    def deposit(self, name, amount):
        self.accounts[name].deposit(amount)
        return len(self.ledger)

    def check(self):
        return [all(a.bank is self for a in self.accounts.values()), self.me is self, self.ledger]
''', [("open", {"name": "a"}), ("deposit", {"name": "a", "amount": 3}), ("open", {"name": "b"}),
      ("deposit", {"name": "b", "amount": 4}), ("check", {})]),

    "collections_aliasing": ('''
from collections import Counter, OrderedDict, defaultdict, deque


class Env:
    def __init__(self):
        self.by_id = {}
        self.queue = deque(maxlen=10)
        self.index = OrderedDict()
        self.groups = defaultdict(list)
        self.counts = Counter()
        self.stats = {"counts": self.counts, "groups": self.groups}

    def add(self, job_id):
        job = {"id": job_id, "done": False}
        self.by_id[job_id] = job
        self.queue.append(job)
        self.index[job_id] = job
        self.groups["open"].append(job)
        self.counts["added"] += 1
        return len(self.queue)

    def finish(self):
        job = self.queue.popleft()
        job["done"] = True
        self.counts["done"] += 1
        return [j["done"] for j in self.by_id.values()]

    def report(self):
        return [[j["done"] for j in self.index.values()], [j["done"] for j in self.groups["open"]],
                dict(self.stats["counts"]), self.stats["groups"] is self.groups, self.queue.maxlen,
                self.groups["new"]]
''', [("add", {"job_id": "a"}), ("add", {"job_id": "b"}), ("finish", {}), ("report", {}), ("report", {})]),

    "deep_chain": ('''
class Node:
    def __init__(self, value, next=None):
        self.value = value
        self.next = next


class Env:
    def __init__(self):
        self.head = None
        self.size = 0

    def push(self, count):
        for _ in range(count):
            self.head = Node(self.size, self.head)
            self.size += 1
        return self.size

    def total(self):
        node, out = self.head, 0
        while node is not None:
            out += node.value
            node = node.next
        return out
''', [("push", {"count": 250}), ("total", {}), ("push", {"count": 2750}), ("total", {})]),

    "deep_plain_data": ('''
class Env:
    def __init__(self):
        self.count = 0

    def bump(self):
        self.__version__ = "2"
        self._private = [1]
        self.__secret = 3
        self.count += 1
        return self.count

    def read(self):
        return [getattr(self, "__version__", None), getattr(self, "_private", None), getattr(self, "_Env__secret", None),
                self.count]
''', [("bump", {}), ("read", {}), ("bump", {}), ("read", {})]),
}


def _env(name: str) -> EnvCode:
    code = EXAMPLES[name][0]
    return EnvCode(hashlib.sha256(code.encode()).hexdigest(), f"rebuild-{name.replace('_', '-')}", "Env", code)


def _in_process(name: str) -> tuple[list[Any], Any]:
    """The calls' results (as their views) and the instance after them, in this process."""
    module = types.ModuleType(f"ef_env_inproc_{name}")
    sys.modules[module.__name__] = module
    try:
        exec(compile(EXAMPLES[name][0], module.__name__, "exec"), module.__dict__)
        instance = instantiate(module.Env, {})
        results = [view.view(getattr(instance, tool)(**arguments)) for tool, arguments in EXAMPLES[name][1]]
        return results, instance
    finally:
        del sys.modules[module.__name__]


async def _rebuilt_every_call(pool: WorkerPool, name: str) -> tuple[list[Any], str]:
    """The same calls through the pool, each on an instance rebuilt from the stored state."""
    env = _env(name)
    state = await pool.init_state(env, {})
    results = []
    for tool, arguments in EXAMPLES[name][1]:
        out = await pool.call(env, state, tool, arguments)
        assert out.ok, out.error
        results.append(out.result)
        state = out.state if out.state is not None else state
    return results, state


@pytest.mark.parametrize("name", list(EXAMPLES))
async def test_a_class_rebuilt_before_every_call_behaves_as_in_process(pool_factory: Any, name: str) -> None:
    expected, instance = _in_process(name)
    async with pool_factory(size=1) as pool:
        results, state = await _rebuilt_every_call(pool, name)
    assert results == expected
    # The stored state is the in-process one: names, values and shape (the view shows aliasing).
    final = public_state(instance)
    assert list(json.loads(state)) == list(final)
    assert view.view_encoded(json.loads(state)) == json.loads(json.dumps(view.view(final, owner=instance)))


class _Session:
    """A session as the service keeps it (a base and the delta calls answer, or a whole state),
    forgotten by the pool before every call: each call rebuilds its instance from what is stored."""

    def __init__(self, pool: WorkerPool, env: EnvCode, state: str, forget: bool = True) -> None:
        self.pool, self.env, self.step, self.forget = pool, env, 0, forget
        self.base, self.text = state, state
        self.fields: dict[str, str] | None = {}

    async def load(self) -> Stored:
        return Stored(self.text, None if self.fields is None else dict(self.fields))

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        if self.forget:
            self.pool.forget("s-rebuilt")
        out = await session_call(self.pool, self.env, "s-rebuilt", self.step, self.load, name, arguments,
                                           deltas=True)
        assert out.ok, out.error
        self.step += 1
        if out.delta is not None:
            assert self.fields is not None
            self.fields.update(out.delta["set"])
            for gone in out.delta["unset"]:
                self.fields.pop(gone, None)
            self.text = compose(Base(self.base), self.fields)
        elif out.state is not None:
            self.text = out.state
            self.base, self.fields = (out.state, {}) if out.rebase else (out.state, None)
        return out.result


@pytest.mark.parametrize("forget", [True, False], ids=["rebuilt", "live"])
@pytest.mark.parametrize("name", list(EXAMPLES))
async def test_a_session_forgotten_before_every_call_behaves_as_in_process(pool_factory: Any, name: str,
                                                                           forget: bool) -> None:
    """The same through sessions, whose calls may answer deltas against a stored base (and, live,
    on the instance kept between calls, whose state is encoded part by part while it can be)."""
    expected, instance = _in_process(name)
    async with pool_factory(size=1) as pool:
        env = _env(name)
        session = _Session(pool, env, await pool.init_state(env, {}, "s-rebuilt"), forget)
        results = [await session.call(tool, arguments) for tool, arguments in EXAMPLES[name][1]]
        assert pool.rebuilt_calls == (len(results) if forget else 0)
    assert results == expected
    final = public_state(instance)
    assert view.view_encoded(json.loads(session.text)) == json.loads(json.dumps(view.view(final, owner=instance)))
