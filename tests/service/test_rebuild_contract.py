"""The contract: a served session is the class run plainly, through every rebuild.

Each class below is written the way LLM-written environments are (ordinary code, some of it
unusual). Its calls are run twice: in this process, instantiated as the service instantiates it
(a failed call rolled back), and through the real app (tests/in_process.py), whose sandbox rebuilds
the session from its stored state before every call (``ENVFOUNDRY_REBUILD_EVERY_CALL=1``), on both stores and both sandbox
backends. Every call's answer must be the same, and so must a fork's at every step, continued to
the end. Code that keeps state outside the instance is refused when it is added instead (422 naming
the line), never served and silently lost.
"""

from __future__ import annotations

import copy
import random
import re
import secrets
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox.worker.resident import instantiate
from tests.conftest import SANDBOX_IMAGE, Server, drop_keys, start_server
from tests.in_process import AppServer, start_app


@dataclass(frozen=True)
class Case:
    class_name: str
    code: str
    calls: tuple[tuple[str, dict[str, Any]], ...]


CASES = {
    "for-target attribute": Case("Queue", '''
class Queue:
    def __init__(self):
        self.queue = ["a", "b", "c", "d"]
        self.cursor = 0

    def advance(self) -> str:
        """Move to the next item."""
        for self.cursor in range(self.cursor + 1, len(self.queue)):
            break
        return self.queue[self.cursor]

    def current(self) -> str:
        """The item at the cursor."""
        return self.queue[self.cursor]
''', (("advance", {}), ("current", {}), ("advance", {}), ("current", {}))),
    "for-target subscript": Case("Seen", '''
class Seen:
    def __init__(self):
        self.seen = {"last": None}

    def see(self, key: str) -> str:
        """See a key."""
        for self.seen["last"] in [key]:
            pass
        return "ok"

    def last(self) -> str:
        """The last key seen."""
        return str(self.seen["last"])
''', (("see", {"key": "x"}), ("last", {}), ("see", {"key": "y"}), ("last", {}))),
    "comprehension target": Case("Scores", '''
class Scores:
    def __init__(self):
        self.scores = [3, 9, 4]
        self.best = None

    def top(self) -> int:
        """The top score."""
        return max([self.best for self.best in self.scores])

    def best_seen(self) -> str:
        """The last score looked at."""
        return str(self.best)
''', (("best_seen", {}), ("top", {}), ("best_seen", {}))),
    "class swapped at run time": Case("Account", '''
class Account:
    def __init__(self):
        self.balance = 100
        self.reads = 0

    def balance_of(self) -> int:
        """The balance."""
        return self.balance

    def read_count(self) -> int:
        """How often a frozen account was read."""
        return self.reads

    def freeze(self) -> str:
        """Freeze the account."""
        self.__class__ = FrozenAccount
        return "frozen"

    def withdraw(self, amount: int) -> dict:
        """Take money out."""
        self.balance -= amount
        return {"success": True, "balance": self.balance}


class FrozenAccount(Account):
    def balance_of(self) -> int:
        self.reads += 1
        return self.balance

    def withdraw(self, amount: int) -> dict:
        return {"success": False, "error": "account frozen"}
''', (("balance_of", {}), ("freeze", {}), ("balance_of", {}), ("balance_of", {}), ("withdraw", {"amount": 10}),
      ("read_count", {}))),
    "set order": Case("Club", '''
class Club:
    def __init__(self):
        self.members = {8}

    def join(self, member: int) -> list:
        """Add a member."""
        self.members.add(member)
        return list(self.members)

    def first_member(self) -> int:
        """The first member in the set's order."""
        return next(iter(self.members))
''', (("join", {"member": 0}), ("first_member", {}), ("join", {"member": 16}), ("first_member", {}))),
    "named time zones": Case("Clock", '''
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo


class Clock:
    def __init__(self):
        self.when = datetime(2026, 1, 15, 12, 0, tzinfo=ZoneInfo("America/New_York"))
        self.est = datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-5), "EST"))

    def later(self, days: int) -> str:
        """The time some days on."""
        return (self.when + timedelta(days=days)).isoformat()

    def zone(self) -> str:
        """The fixed zone's name."""
        return self.est.strftime("%Z")

    def move(self, days: int) -> str:
        """Move the clock on."""
        self.when = self.when + timedelta(days=days)
        return self.when.isoformat()
''', (("later", {"days": 180}), ("zone", {}), ("move", {"days": 90}), ("later", {"days": 0}))),
    "bound methods in state": Case("Calculator", '''
class Calculator:
    def __init__(self):
        self.total = 0
        self.handlers = {"add": self._add, "sub": self._sub}

    def _add(self, x):
        self.total += x

    def _sub(self, x):
        self.total -= x

    def apply(self, op: str, x: int) -> int:
        """Apply an operation."""
        self.handlers[op](x)
        return self.total
''', (("apply", {"op": "add", "x": 5}), ("apply", {"op": "sub", "x": 2}), ("apply", {"op": "add", "x": 10}))),
    "back-references": Case("Bank", '''
class Acct:
    def __init__(self, bank):
        self.bank = bank


class Bank:
    def __init__(self):
        self.accounts = []
        self.audits = 0

    def open(self) -> int:
        """Open an account."""
        self.accounts.append(Acct(self))
        return len(self.accounts)

    def audit_via(self, index: int) -> int:
        """Audit through an account's bank."""
        self.accounts[index].bank.audits += 1
        return self.audits
''', (("open", {}), ("audit_via", {"index": 0}), ("open", {}), ("audit_via", {"index": 1}), ("audit_via", {"index": 0}))),
    "aliasing through containers": Case("Ledger", '''
from collections import Counter, OrderedDict, defaultdict, deque


class Ledger:
    def __init__(self):
        shared = {"n": 0}
        self.plain = {"a": shared}
        self.queue = deque([shared])
        self.ordered = OrderedDict(a=shared)
        self.grouped = defaultdict(list)
        self.grouped["x"].append(shared)
        self.counts = Counter()
        self.tally = {"c": self.counts}

    def bump(self, where: str) -> int:
        """Bump the shared entry through one container."""
        if where == "queue":
            self.queue[0]["n"] += 1
        elif where == "ordered":
            self.ordered["a"]["n"] += 1
        else:
            self.grouped["x"][0]["n"] += 1
        self.counts[where] += 1
        return self.plain["a"]["n"]

    def seen(self) -> dict:
        """What the plain dicts see."""
        return {"n": self.plain["a"]["n"], "counts": dict(self.tally["c"])}
''', (("bump", {"where": "queue"}), ("bump", {"where": "ordered"}), ("bump", {"where": "grouped"}), ("seen", {}))),
    "a long linked list": Case("Chain", '''
class Node:
    def __init__(self, value, next=None):
        self.value = value
        self.next = next


class Chain:
    def __init__(self):
        self.head = None
        for value in range(250):
            self.head = Node(value, self.head)

    def push(self, value: int) -> int:
        """Add a node."""
        self.head = Node(value, self.head)
        return self.length()

    def length(self) -> int:
        """How many nodes."""
        n, node = 0, self.head
        while node is not None:
            n, node = n + 1, node.next
        return n
''', (("length", {}), ("push", {"value": 1}), ("length", {}))),
    "dunder attribute": Case("Versioned", '''
class Versioned:
    def __init__(self):
        self.items = []

    def bump_version(self) -> int:
        """Set a version."""
        self.__version__ = getattr(self, "__version__", 0) + 1
        return self.__version__

    def add(self, item: str) -> int:
        """Add an item."""
        self.items.append(item)
        return len(self.items)
''', (("bump_version", {}), ("add", {"item": "a"}), ("bump_version", {}), ("add", {"item": "b"}))),
    "a seeded generator": Case("Dice", '''
import random


class Dice:
    def __init__(self):
        random.seed(42)
        self.rolls = []

    def roll(self) -> int:
        """Roll a die."""
        value = random.randint(1, 6)
        self.rolls.append(value)
        return value
''', (("roll", {}), ("roll", {}), ("roll", {}), ("roll", {}))),
    "a failed call is rolled back": Case("Safe", '''
class Safe:
    def __init__(self):
        self.items = ["a"]

    def take(self, fail: bool) -> int:
        """Take an item; may fail half way."""
        self.items.append("half")
        if fail:
            raise ValueError("no")
        return len(self.items)

    def count(self) -> int:
        """How many items."""
        return len(self.items)
''', (("take", {"fail": True}), ("count", {}), ("take", {"fail": False}), ("count", {}))),
}

REFUSED = {
    "module global": ('''
_next_id = 100


class Orders:
    def __init__(self):
        self.orders = {}

    def place(self) -> str:
        """Place an order."""
        global _next_id
        _next_id += 1
        self.orders[_next_id] = "placed"
        return f"ORD{_next_id}"
''', "Orders"),
    "class counter": ('''
class Order:
    next_id = 1


class Shop:
    def __init__(self):
        self.orders = {}

    def place(self) -> int:
        """Place an order."""
        Order.next_id += 1
        self.orders[Order.next_id] = "placed"
        return Order.next_id
''', "Shop"),
    "class-level dict changed through self": ('''
class Registry:
    entries = {}

    def __init__(self):
        self.count = 0

    def register(self, key: str) -> int:
        """Register a key."""
        self.entries[key] = True
        return len(self.entries)
''', "Registry"),
    "mutable default argument": ('''
class Tags:
    def __init__(self):
        self.n = 0

    def tag(self, name: str, seen: list = []) -> int:
        """Tag something."""
        seen.append(name)
        return len(seen)
''', "Tags"),
    "module constant changed": ('''
ITEMS = []


class Cart:
    def __init__(self):
        self.n = 0

    def add(self, item: str) -> int:
        """Add an item."""
        ITEMS.append(item)
        return len(ITEMS)
''', "Cart"),
    "method replaced at run time": ('''
class Shop:
    def __init__(self):
        self.sales = 0

    def price(self) -> int:
        """The price."""
        return 10

    def discounted(self) -> int:
        return 5

    def sale(self) -> str:
        """Start a sale."""
        type(self).price = Shop.discounted
        return "on sale"
''', "Shop"),
    "lru_cache on a method": ('''
import functools


class Rates:
    def __init__(self):
        self.base = 1

    @functools.lru_cache
    def rate(self, n: int) -> int:
        """A rate."""
        return self.base * n

    def raise_base(self) -> int:
        """Raise the base."""
        self.base += 1
        return self.base
''', "Rates"),
}


def in_process(case: Case, calls: tuple[tuple[str, dict[str, Any]], ...]) -> list[Any]:
    """Each call's answer (``ok``, result or error type) with the class simply run here."""
    drawn = random.getstate()  # (a class may seed the module's generator: this process's is put back)
    depth = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # (the rollback's deepcopy of a long chain recurses, as Python may)
    try:
        return _run_plainly(case, calls)
    finally:
        random.setstate(drawn)
        sys.setrecursionlimit(depth)


def _run_plainly(case: Case, calls: tuple[tuple[str, dict[str, Any]], ...]) -> list[Any]:
    module = types.ModuleType(f"plain_{secrets.token_hex(4)}")
    exec(compile(case.code, module.__name__, "exec"), module.__dict__)
    instance = instantiate(getattr(module, case.class_name), {})
    answers = []
    for name, arguments in calls:
        kept = copy.deepcopy(instance.__dict__)
        try:
            answers.append({"ok": True, "result": _json(getattr(instance, name)(**arguments))})
        except Exception:
            instance.__dict__.clear()
            instance.__dict__.update(kept)  # the service rolls a failed call back
            answers.append({"ok": False, "result": None})
    return answers


def _json(value: Any) -> Any:
    return httpx.Response(200, json=value).json()


def served(http: httpx.Client, session: str, calls: tuple[tuple[str, dict[str, Any]], ...]) -> list[Any]:
    answers = []
    for name, arguments in calls:
        answer = http.post(f"/v1/sessions/{session}/calls", json={"name": name, "arguments": arguments})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        if not body["ok"]:
            assert body["error"]["type"] == "tool_exception", body["error"]
        answers.append({"ok": body["ok"], "result": body["result"] if body["ok"] else None})
    return answers


@pytest.fixture(scope="module", params=["memory-process", "redis-process", "memory-docker", "redis-docker",
                                        "redis-process-lodged"])
def rebuilding(request: pytest.FixtureRequest) -> Iterator[AppServer]:
    store, backend, *lodged = request.param.split("-")
    env = {"ENVFOUNDRY_REBUILD_EVERY_CALL": "1", "ENVFOUNDRY_SANDBOX": backend}
    if lodged:  # one session's process per worker: the other sessions live in lodges
        env = {"ENVFOUNDRY_RESIDENTS": "1", "ENVFOUNDRY_SANDBOX": backend}
    if backend == "docker":
        request.getfixturevalue("docker_client")
        env["ENVFOUNDRY_SANDBOX_IMAGE"] = SANDBOX_IMAGE
    url = None
    if store == "redis":
        url = request.getfixturevalue("redis_url")
        env["ENVFOUNDRY_KEY_PREFIX"] = f"eftest-{secrets.token_hex(4)}"
    server = start_app(redis_url=url, extra_env=env)
    yield server
    server.stop()
    if url:
        drop_keys(url, env["ENVFOUNDRY_KEY_PREFIX"])


@pytest.fixture(scope="module")
def http(rebuilding: AppServer) -> Iterator[httpx.Client]:
    with rebuilding.client() as client:
        yield client


def _added(http: httpx.Client, code: str, class_name: str) -> httpx.Response:
    return http.post("/v1/environments", json={"env_id": f"contract-{secrets.token_hex(4)}",
                                               "class_name": class_name, "code": code})


@pytest.mark.parametrize("kind", sorted(CASES))
def test_every_call_and_every_fork_answers_as_the_class_run_plainly(http: httpx.Client, kind: str) -> None:
    case = CASES[kind]
    added = _added(http, case.code, case.class_name)
    assert added.status_code == 201, added.text
    env_id = added.json()["env_id"]
    session = http.post("/v1/sessions", json={"env_id": env_id}).json()["session_id"]
    assert served(http, session, case.calls) == in_process(case, case.calls)
    for step in sorted({0, 1, len(case.calls) // 2, len(case.calls) - 1}):
        forked = http.post(f"/v1/sessions/{session}/fork", json={"step": step})
        assert forked.status_code == 201, forked.text
        fork = forked.json()["session_id"]
        rest = case.calls[step:]
        # a fork at ``step`` continues from there: the plain run's answers after it
        assert served(http, fork, rest) == in_process(case, case.calls)[step:], f"fork at step {step}"
        http.delete(f"/v1/sessions/{fork}")
    http.delete(f"/v1/sessions/{session}")


@pytest.mark.parametrize("kind", ["set order", "back-references", "a seeded generator", "bound methods in state"])
def test_group_members_and_forks_of_forks_answer_as_the_class_run_plainly(http: httpx.Client, kind: str) -> None:
    case = CASES[kind]
    added = _added(http, case.code, case.class_name)
    assert added.status_code == 201, added.text
    plain = in_process(case, case.calls)
    group = http.post("/v1/sessions", json={"env_id": added.json()["env_id"], "n": 2, "group_seeds": "same"})
    assert group.status_code == 201, group.text
    for member in group.json()["session_ids"]:
        assert served(http, member, case.calls) == plain
    session = group.json()["session_ids"][0]
    first = http.post(f"/v1/sessions/{session}/fork", json={"step": 1}).json()["session_id"]
    assert served(http, first, case.calls[1:2]) == plain[1:2]
    second = http.post(f"/v1/sessions/{first}/fork").json()["session_id"]  # a fork of a fork, at its step 2
    assert served(http, second, case.calls[2:]) == plain[2:]


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_state_outside_the_instance_is_refused_when_added(http: httpx.Client, kind: str) -> None:
    code, class_name = REFUSED[kind]
    refused = _added(http, code, class_name)
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert "state_outside_instance" in refused.text and re.search(r"line \d+: `", detail), detail


def test_with_one_session_process_per_worker_the_others_were_lodged(http: httpx.Client,
                                                                    request: pytest.FixtureRequest) -> None:
    """(after the tests above, on the same server) Where each worker keeps one session's process,
    forks and group members above lived in lodges and answered as the plain run; where every call
    rebuilds, nothing was lodged."""
    mode = request.node.callspec.params["rebuilding"]
    found = re.search(r'envfoundry_sandbox_session_calls\{instance="lodged"\} (\S+)', http.get("/metrics").text)
    assert found is not None
    assert (float(found.group(1)) > 0) == mode.endswith("lodged"), mode


@pytest.fixture
def replicas(redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Two replicas on one Redis: ``live`` keeps sessions in their processes, ``cold`` keeps none
    (every call it serves rebuilds); ``restart`` replaces ``live`` with a new process."""
    env = {"ENVFOUNDRY_KEY_PREFIX": f"eftest-{secrets.token_hex(4)}"}
    started = {"live": start_server(tmp_path, redis_url=redis_url, extra_env=env),
               "cold": start_server(tmp_path, redis_url=redis_url, extra_env={**env, "ENVFOUNDRY_RESIDENTS": "0"})}

    def restart() -> None:
        started["live"].stop()
        started["live"] = start_server(tmp_path, redis_url=redis_url, extra_env=env)

    yield {"servers": started, "restart": restart}
    for server in started.values():
        server.stop()
    drop_keys(redis_url, env["ENVFOUNDRY_KEY_PREFIX"])


def _state(server: Server, session: str, step: int | None = None) -> Any:
    params = {} if step is None else {"step": step}
    shown = httpx.get(f"{server.url}/v1/sessions/{session}/state", params=params, timeout=60)
    assert shown.status_code == 200, shown.text
    return shown.json()["state"]


def test_replicas_taking_turns_and_a_restart_half_way_answer_as_the_class_run_plainly(
        replicas: dict[str, Any]) -> None:
    """Every case at once: calls alternate between a replica keeping the session live and one that
    rebuilds it for every call, the live one is restarted half way through every session, and the
    state after every step, shown later by either replica, is what it was when that step was made."""
    servers = replicas["servers"]
    sessions: dict[str, str] = {}
    with servers["live"].client() as http:
        for kind, case in CASES.items():
            added = _added(http, case.code, case.class_name)
            assert added.status_code == 201, added.text
            sessions[kind] = http.post("/v1/sessions", json={"env_id": added.json()["env_id"]}).json()["session_id"]
    shown = {kind: [_state(servers["live"], session)] for kind, session in sessions.items()}
    answers: dict[str, list[Any]] = {kind: [] for kind in CASES}
    longest = max(len(case.calls) for case in CASES.values())
    for step in range(longest):
        if step == longest // 2:
            replicas["restart"]()
        server = servers["live" if step % 2 == 0 else "cold"]
        with server.client() as http:
            for kind, case in CASES.items():
                if step < len(case.calls):
                    answers[kind] += served(http, sessions[kind], case.calls[step:step + 1])
                    shown[kind].append(_state(server, sessions[kind]))
    for kind, case in CASES.items():
        assert answers[kind] == in_process(case, case.calls), kind
        for server in servers.values():
            assert [_state(server, sessions[kind], k) for k in range(len(case.calls) + 1)] == shown[kind], kind
