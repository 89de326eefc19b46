"""A tree state as a base plus the parts it changed: randomized mutations compose back to exactly the
whole state's encoding, and what a sandbox process could forge is refused."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from sandbox.state.deltas import Base, Delta, DeltaError, compose, field, problem
from sandbox.state.encoder import encode_state
from sandbox.state.parts import Parts


def _mutate(state: dict[str, Any], rng: random.Random) -> None:
    name = rng.choice(["users", "tags", "orders"])
    box = state.get(name)
    if not isinstance(box, dict):
        box = state[name] = {}
    keys = list(box)
    op = rng.randrange(10)
    if op == 0 and keys:
        del box[rng.choice(keys)]
    elif op == 1:
        box[f"k{rng.randrange(12)}"] = {"v": rng.random(), "s": "é" * rng.randrange(3)}
    elif op == 2 and keys:
        box[rng.choice(keys)] = rng.randrange(100)
    elif op == 3:
        state["count"] = state.get("count", 0) + 1
    elif op == 4 and keys:  # out and back in: the entry moves to the end
        key = rng.choice(keys)
        box[key] = box.pop(key)
    elif op == 5 and len(state) > 1:
        state.pop(rng.choice(list(state)))
    elif op == 6:
        state[f"new{rng.randrange(3)}"] = [rng.random()]
    elif op == 7:
        state[name] = dict(reversed(list(box.items())))  # reordered: the delta cannot say it
    elif op == 8 and keys:
        item = box[rng.choice(keys)]
        if isinstance(item, dict):
            item["v"] = rng.random()  # a change deep inside one entry
    elif op == 9:
        value = state.pop("count", 0)
        state["count"] = value  # an attribute moved to the end


@pytest.mark.parametrize("seed", range(40))
def test_randomized_mutations_compose_to_the_whole_state_encoding(seed: int) -> None:
    rng = random.Random(seed)
    state: dict[str, Any] = {"users": {f"u{i}": {"n": i, "$odd": "$"} for i in range(6)}, "count": 0,
                             "log": [], "tags": {"a": 1, "$b": 2}, "orders": {}}
    text = encode_state(state, "envmod")
    base, parts, delta = Base(text), Parts("envmod", state, json.loads(text)), Delta()
    rebased = 0
    for _ in range(30):
        _mutate(state, rng)
        before = dict(parts.parts)
        whole, _ = parts.update(state)
        assert whole == encode_state(state, "envmod")
        changes = delta.step(before, parts.parts)
        if changes is None:  # the top level was reordered: the caller sends the whole state
            base, delta, rebased = Base(whole), Delta(), rebased + 1
            continue
        assert problem(changes, 1 << 20) is None
        assert compose(base, delta.fields) == whole
        if rng.random() < 0.3:  # a cold rebuild: the delta from its stored fields goes on as the live one
            delta = Delta(delta.fields)
    assert rebased < 30


def test_a_delta_holds_only_the_parts_that_changed() -> None:
    state: dict[str, Any] = {"records": {f"R{i:05d}": {"status": "open", "note": "x" * 60} for i in range(2000)},
                             "count": 0}
    text = encode_state(state, "envmod")
    parts, delta = Parts("envmod", state, json.loads(text)), Delta()
    for n in range(5):
        state["records"][f"R{n:05d}"]["status"] = "closed"
        before = dict(parts.parts)
        parts.update(state)
        changes = delta.step(before, parts.parts)
        assert changes is not None and list(changes["set"]) == [field("records", f"R{n:05d}")]
    assert delta.size < 700 and len(text) > 150_000
    assert compose(Base(text), delta.fields) == encode_state(state, "envmod")


@pytest.mark.parametrize("forged", [
    "not a dict", {"set": [], "unset": []}, {"set": {"x": "=1"}, "unset": []}, {"set": {'["a"]': "?1"}, "unset": []},
    {"set": {'["a"]': "=not json"}, "unset": []}, {"set": {'["a"]': "+x:1"}, "unset": []},
    {"set": {'["a","b","c"]': "=1"}, "unset": []}, {"set": {}, "unset": [7]},
    {"set": {'["a"]': "=" + "1" * 5000}, "unset": []},
])
def test_a_forged_delta_is_named_as_such(forged: Any) -> None:
    assert problem(forged, 4096) is not None


@pytest.mark.parametrize("fields", [
    {'["missing"]': "=1"},  # in place, but the base has no such part
    {'["a"]': "+1:2"},  # added, but the base has it
    {'["a","x"]': "=1"},  # an entry of a part that is not a dict
    {'["d","zz"]': "-"},
])
def test_a_delta_that_does_not_fit_its_base_is_refused(fields: dict[str, str]) -> None:
    with pytest.raises(DeltaError):
        compose(Base('{"a":1,"d":{"k":2}}'), fields)
