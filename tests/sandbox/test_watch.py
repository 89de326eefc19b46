"""A watched state: what a call changed is found from the bytes of its parts and from who holds
their objects, and what is stored is always exactly the whole state's encoding, whatever the
tool did (shared an object without changing a byte, kept a reference in its module, swapped a
value for an equal one of another type)."""

from __future__ import annotations

import json
import random
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.state import encoder, view
from sandbox.state.parts import Parts
from sandbox.state.readonly import ReadOnly
from sandbox.worker.resident import LiveSession, public_state

CODE = '''
KEPT = []


class Shop:
    def __init__(self, config=None):
        self.items = {f"I{i:03d}": {"name": f"item {i}", "tags": [i % 3], "price": i} for i in range(200)}
        self.other = {"x": [1], "y": [1]}
        self.count = 0
        self.log = []

    def get(self, key):
        return self.items[key]

    def set_price(self, key, price):
        self.items[key]["price"] = price
        return {"success": True}

    def tag(self, key, tag):
        self.items[key]["tags"].append(tag)
        return self.items[key]

    def add(self, key, item):
        self.items[key] = item
        return {"success": True}

    def remove(self, key):
        del self.items[key]

    def move_to_end(self, key):
        self.items[key] = self.items.pop(key)

    def alias_items(self, a, b):
        self.items[b] = self.items[a]

    def alias_deep(self, a, b):
        self.items[b]["tags"] = self.items[a]["tags"]

    def alias_other(self):
        self.other["x"] = self.other["y"]

    def keep(self, key):
        KEPT.append(self.items[key]["tags"])

    def put_kept(self, key):
        self.items[key]["tags"] = KEPT[-1]

    def unkeep(self):
        KEPT.clear()

    def set_count(self, value):
        self.count = value

    def as_bool(self):
        self.count = bool(self.count)

    def as_float(self):
        self.count = float(self.count)

    def as_bytes(self, text, mutable=False):
        self.count = bytearray(text.encode()) if mutable else text.encode()

    def as_tuple_set(self):
        self.count = {(1, 2)}

    def copy_entry(self, key):
        self.items[key] = {k: (list(v) if isinstance(v, list) else v) for k, v in self.items[key].items()}

    def log_line(self, line):
        self.log.append(line)

    def replace_items(self):
        self.items = dict(reversed(list(self.items.items())))

    def add_attribute(self):
        self.fresh = {"deep": [1]}
'''


@pytest.fixture
def module() -> Iterator[types.ModuleType]:
    mod = types.ModuleType("watchenv")
    exec(CODE, mod.__dict__)
    sys.modules["watchenv"] = mod
    yield mod
    del sys.modules["watchenv"]


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """How each call's change was found: 'watched' when the watch told, else 'walked'."""
    seen: list[str] = []
    original = Parts.watch

    def spy(self: Parts, state: dict[str, Any], footprint: Any = None) -> Any:
        try:
            out = original(self, state, footprint)
        except Exception:
            seen.append("walked")
            raise
        seen.append("watched")
        return out

    monkeypatch.setattr(Parts, "watch", spy)
    return seen


def _expected(session: LiveSession) -> str:
    """The whole state's encoding, made without keeping any reference to the state."""
    return encoder.encode_state(public_state(session.instance), session.module.__name__)


class Run:
    def __init__(self, module: types.ModuleType, proven: bool = False) -> None:
        proof = ReadOnly(module, CODE, module.Shop) if proven else None
        self.session = LiveSession(module, module.Shop, proof)
        answer, _ = self.session.handle({"op": "init", "init_config": {}})
        self.text = answer["state"]

    def call(self, name: str, **arguments: Any) -> dict[str, Any]:
        before = self.text
        answer, kept = self.session.handle({"op": "call", "name": name, "arguments": arguments})
        assert kept and answer["ok"], answer
        if answer["state"] is not None:
            self.text = answer["state"]
        assert self.text == _expected(self.session), f"{name} stored something else than its state"
        if answer["state"] is None:
            assert answer["diff"] == {"added": [], "removed": [], "changed": []}
        else:
            assert answer["diff"] == view.diff(view.view_encoded(json.loads(before)),
                                               view.view_encoded(json.loads(self.text)))
        return answer


def test_a_plain_state_is_watched_and_reads_and_writes_are_told_by_it(module: Any, watched: list[str]) -> None:
    run = Run(module)
    assert run.session.parts is not None and run.session.parts.watched
    assert run.call("get", key="I007")["state"] is None
    assert run.call("set_price", key="I007", price=99)["state"] is not None
    assert run.call("tag", key="I008", tag=5)["result"]["tags"] == [2, 5]  # returns an object of the state
    assert run.call("set_price", key="I007", price=99)["state"] is None  # the same value again
    assert run.call("copy_entry", key="I009")["state"] is None  # an equal copy changes nothing stored
    assert watched == ["watched"] * 5


@pytest.mark.parametrize("proven", [False, True], ids=["looked", "proven"])
def test_randomized_calls_store_exactly_the_state(module: Any, watched: list[str], proven: bool) -> None:
    """With the proofs, reads are not looked at and writes only at the entries they name."""
    rng = random.Random(11)
    run = Run(module, proven)
    for _ in range(120):
        keys = sorted(json.loads(run.text)["items"])
        key = rng.choice(keys)
        choice = rng.randrange(8)
        if choice == 0:
            run.call("set_price", key=key, price=rng.choice([1, 1.0, True, None, "1"]))
        elif choice == 1:
            run.call("tag", key=key, tag=rng.randrange(4))
        elif choice == 2:
            run.call("add", key=f"N{rng.randrange(50):02d}", item={"name": "new", "tags": [], "price": 0})
        elif choice == 3 and len(keys) > 5:
            run.call("remove", key=key)
        elif choice == 4:
            run.call("move_to_end", key=key)
        elif choice == 5:
            run.call("log_line", line="x" * rng.randrange(3))
        elif choice == 6:
            run.call("set_count", value=rng.randrange(3))
        else:
            run.call("get", key=key)
    # Every call here keeps the state plain and each object held once: the watch told them all.
    assert watched and set(watched) == {"watched"}
    assert len(watched) < 120 if proven else len(watched) == 120  # proven reads skip the watch


def test_an_object_shared_without_changing_a_byte_is_stored_shared(module: Any, watched: list[str]) -> None:
    run = Run(module)
    run.call("alias_other")  # other.x and other.y were equal lists: now one list
    assert '"id"' in run.text  # the codec writes the list once and refers to it
    assert watched[-1] == "walked"


@pytest.mark.parametrize("tool", ["alias_items", "alias_deep"])
def test_entries_made_to_share_are_stored_shared(module: Any, watched: list[str], tool: str) -> None:
    run = Run(module)
    run.call("set_price", key="I004", price=0)  # I003 and I004 now hold equal entries but for tags
    run.call(tool, a="I003", b="I004")
    assert watched[-1] == "walked"


def test_a_reference_kept_in_the_module_is_noticed(module: Any, watched: list[str]) -> None:
    run = Run(module)
    run.call("keep", key="I001")  # the module now holds the entry's tags: its count says so
    assert watched[-1] == "walked"
    run.call("set_price", key="I002", price=5)
    run.call("put_kept", key="I004")  # tags [1] of I001 now also I004's, where equal tags were
    run.call("unkeep")
    run.call("set_price", key="I005", price=7)


@pytest.mark.parametrize("tool", ["as_bool", "as_float"])
def test_an_equal_value_of_another_type_is_a_change(module: Any, watched: list[str], tool: str) -> None:
    run = Run(module)
    run.call("set_count", value=1)
    answer = run.call(tool)
    assert answer["state"] is not None and answer["diff"]["changed"]


def test_bytes_and_bytearray_are_told_apart(module: Any, watched: list[str]) -> None:
    run = Run(module)
    run.call("as_bytes", text="ab")
    answer = run.call("as_bytes", text="ab", mutable=True)
    assert answer["state"] is not None
    assert run.call("as_bytes", text="ab", mutable=True)["state"] is None


def test_sets_of_tuples_and_new_attributes_fall_back_to_the_whole_state(module: Any, watched: list[str]) -> None:
    run = Run(module)
    run.call("as_tuple_set")
    run.call("set_count", value=3)
    run.call("add_attribute")
    run.call("replace_items")
    run.call("set_price", key="I010", price=1)


def test_an_argument_kept_in_the_state_is_the_state_own(module: Any, watched: list[str]) -> None:
    run = Run(module)
    run.call("add", key="NEW", item={"name": "n", "tags": [1], "price": 1})
    run.call("tag", key="NEW", tag=2)
    assert json.loads(run.text)["items"]["NEW"]["tags"] == [1, 2]
    assert watched == ["watched", "watched"]


@pytest.mark.parametrize("tool", ["alias_items", "alias_deep", "put_kept", "move_to_end"])
def test_with_the_proofs_what_they_do_not_cover_is_still_found(module: Any, tool: str) -> None:
    run = Run(module, proven=True)
    run.call("set_price", key="I004", price=0)
    run.call("keep", key="I001")
    if tool == "move_to_end":
        run.call(tool, key="I002")
    elif tool == "put_kept":
        run.call(tool, key="I004")
    else:
        run.call(tool, a="I003", b="I004")
    run.call("unkeep")
    run.call("tag", key="I005", tag=1)


def test_a_confined_write_looks_only_at_the_entries_it_names(module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sandbox.state.parts as parts

    run = Run(module, proven=True)
    whole: list[str] = []
    original = parts._watch_entries
    monkeypatch.setattr(parts, "_watch_entries", lambda value, old: whole.append("x") or original(value, old))
    assert run.call("set_price", key="I010", price=7)["state"] is not None
    assert run.call("set_price", key="I010", price=7)["state"] is None
    assert run.call("tag", key="I011", tag=9)["state"] is not None
    assert whole == []
    run.call("add", key="NEW", item={"name": "n", "tags": [], "price": 1})  # an entry added: keys looked at
    run.call("remove", key="I012")  # one that may delete: its dict looked at
    assert whole == ["x", "x"]


@pytest.mark.parametrize("seed", range(6))
def test_a_cold_session_is_rebuilt_from_its_template_and_delta_exactly(
        module: Any, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """A session kept as a template's initial state plus a delta comes back in a fork of the
    template by decoding only the parts its delta names, to exactly the stored state."""
    from sandbox.state.deltas import Base, compose

    # (two sessions in this one process share its ``random``: one's fresh start must not read as the
    # other's draw, as it never could in sessions of their own processes)
    monkeypatch.setattr(random, "seed", lambda *args, **kwargs: None)
    rng = random.Random(seed)
    live = LiveSession(module, module.Shop)
    live.handle({"op": "init", "init_config": {}, "deltas": True})
    for _ in range(rng.randrange(1, 25)):
        key = rng.choice(sorted(vars(live.instance)["items"]))
        name, arguments = rng.choice([("set_price", {"key": key, "price": rng.randrange(9)}),
                                      ("tag", {"key": key, "tag": 1}),
                                      ("add", {"key": f"N{rng.randrange(9)}", "item": {"name": "n", "tags": [], "price": 0}}),
                                      ("remove", {"key": key}), ("move_to_end", {"key": key}),
                                      ("log_line", {"line": "x"})])
        answer, _ = live.handle({"op": "call", "name": name, "arguments": arguments, "deltas": True})
        assert answer["ok"], answer
    assert live.delta is not None
    fields = dict(live.delta.fields)
    template = LiveSession(module, module.Shop)
    template.prepare({"op": "init", "init_config": {}})
    stored = compose(Base(template.text), fields)
    assert stored == live.text
    decoded: list[str] = []
    original = LiveSession._adopt
    monkeypatch.setattr(LiveSession, "_adopt", lambda self, text: decoded.append("whole") or original(self, text))
    request = {"op": "call", "name": "set_price", "arguments": {"key": "I001", "price": 42}, "deltas": True,
               "state": stored, "delta": fields, "known": template.digest}
    answer, kept = template.handle(request)
    assert kept and answer["ok"] and decoded == []
    live_answer, _ = live.handle({k: v for k, v in request.items() if k not in ("state", "delta", "known")})
    assert template.text == live.text == _expected(template)
    assert (answer.get("delta"), answer["diff"]) == (live_answer.get("delta"), live_answer["diff"])


def test_a_delta_against_another_base_decodes_the_whole_state(module: Any) -> None:
    template = LiveSession(module, module.Shop)
    template.prepare({"op": "init", "init_config": {}})
    other = LiveSession(module, module.Shop)
    other.handle({"op": "init", "init_config": {}, "deltas": True})
    other.handle({"op": "call", "name": "set_price", "arguments": {"key": "I001", "price": 5}, "deltas": True})
    assert other.delta is not None
    request = {"op": "call", "name": "get", "arguments": {"key": "I001"}, "deltas": True, "state": other.text,
               "delta": dict(other.delta.fields), "known": "0" * 64}
    answer, kept = template.handle(request)
    assert kept and answer["result"]["price"] == 5 and template.text == other.text
