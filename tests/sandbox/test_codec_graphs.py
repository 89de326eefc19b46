"""The state codec on object graphs: cycles and shared objects round-trip with identity, views
mark repeated objects with ``$ref`` pointers, and views and diffs stay bounded."""

from __future__ import annotations

import collections
import json
import pickle
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import sandbox.state.view
from sandbox.state.decoder import decode
from sandbox.state.encoder import encode_state
from sandbox.state.view import diff, view, view_encoded

ENV_MODULE = "ef_env_graph_test"

ENV_SOURCE = '''
import dataclasses


class Node:
    def __init__(self, name, parent=None):
        self.name = name
        self.parent = parent
        self.children = {}

    def add(self, name):
        child = Node(name, self)
        self.children[name] = child
        return child


class Box:
    def __init__(self, content=None):
        self.content = content


@dataclasses.dataclass(frozen=True)
class Tag:
    label: str
'''


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    module = types.ModuleType(ENV_MODULE)
    monkeypatch.setitem(sys.modules, ENV_MODULE, module)
    exec(compile(ENV_SOURCE, f"<{ENV_MODULE}>", "exec"), module.__dict__)
    yield module


def _resolve(qualname: str) -> Any:
    target: Any = sys.modules[ENV_MODULE]
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def roundtrip(state: dict[str, Any]) -> Any:
    text = encode_state(state, ENV_MODULE)
    return decode(json.loads(text), _resolve)


def pointed(document: Any, pointer: str) -> Any:
    """Follow an RFC 6901 pointer."""
    target = document
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        target = target[int(part)] if isinstance(target, list) else target[part]
    return target


def refs(shown: Any, at: str = "") -> list[tuple[str, str]]:
    """Every (place, pointer) of a ``$ref`` in a view."""
    if isinstance(shown, dict):
        if set(shown) == {"$ref"}:
            return [(at, shown["$ref"])]
        return [r for k, v in shown.items() for r in refs(v, f"{at}/{k.replace('~', '~0').replace('/', '~1')}")]
    if isinstance(shown, list):
        return [r for i, v in enumerate(shown) for r in refs(v, f"{at}/{i}")]
    return []


def assert_view_is_sound(state: dict[str, Any]) -> Any:
    """view_encoded(encoded) equals view(state); every $ref points at a place shown in full."""
    shown = view_encoded(json.loads(encode_state(state, ENV_MODULE)))
    assert shown == view(state)
    json.dumps(shown, allow_nan=False)
    for _, pointer in refs(shown):
        target = pointed(shown, pointer)
        assert not (isinstance(target, dict) and set(target) == {"$ref"}), pointer
    return shown


def file_tree(env: types.ModuleType) -> dict[str, Any]:
    root = env.Node("/")
    docs = root.add("docs")
    docs.add("a.txt")
    root.add("tmp")
    return {"root": root, "current_dir": docs}


# --- round trips with identity --------------------------------------------------


def test_tree_with_parent_pointers_round_trips_with_identity(env: types.ModuleType) -> None:
    back = roundtrip(file_tree(env))
    root = back["root"]
    docs = root.children["docs"]
    assert type(root) is env.Node and root.parent is None
    assert docs.parent is root and root.children["tmp"].parent is root
    assert docs.children["a.txt"].parent is docs
    assert back["current_dir"] is docs


def test_mutation_through_one_alias_is_seen_through_the_other_after_a_round_trip(env: types.ModuleType) -> None:
    back = roundtrip(file_tree(env))
    back["current_dir"].add("new.txt")
    again = roundtrip(back)
    assert "new.txt" in again["root"].children["docs"].children
    assert again["current_dir"] is again["root"].children["docs"]


@pytest.mark.parametrize("kind", ["list", "dict", "tuple-list", "env-object", "set-of-boxes"])
def test_reference_cycle_round_trips(env: types.ModuleType, kind: str) -> None:
    value: Any
    check: Callable[[Any], bool]
    if kind == "list":
        value = []
        value.append(value)
        check = lambda v: v[0] is v  # noqa: E731
    elif kind == "dict":
        value = {}
        value["self"] = value
        check = lambda v: v["self"] is v  # noqa: E731
    elif kind == "tuple-list":
        inner: list[Any] = []
        value = (inner,)
        inner.append(value)
        check = lambda v: v[0][0] is v  # noqa: E731
    elif kind == "env-object":
        value = env.Box()
        value.content = [value]
        check = lambda v: v.content[0] is v  # noqa: E731
    else:
        value = set()
        value.add(env.Box(value))
        check = lambda v: next(iter(v)).content is v  # noqa: E731
    back = roundtrip({"a": value, "b": value})
    assert check(back["a"]) and back["b"] is back["a"]
    assert_view_is_sound({"a": value, "b": value})


@pytest.mark.parametrize("container", ["tuple", "frozenset"])
def test_cycle_through_an_immutable_container_round_trips(env: types.ModuleType, container: str) -> None:
    """A tuple or frozenset holding an object that points back at it, met first from outside."""
    box = env.Box()
    holder: Any = (box,) if container == "tuple" else frozenset({box})
    box.content = holder
    back = roundtrip({"holder": holder, "again": holder, "box": box})
    assert type(back["holder"]) is type(holder)
    (inner,) = tuple(back["holder"])
    assert inner is back["box"] and inner.content is back["holder"] and back["again"] is back["holder"]
    assert_view_is_sound({"holder": holder, "again": holder, "box": box})


def test_parent_pointers_through_frozensets_round_trip(env: types.ModuleType) -> None:
    root = env.Box()
    kids = [env.Box(root) for _ in range(3)]
    root.content = frozenset(kids)
    back = roundtrip({"root": root})
    assert len(back["root"].content) == 3
    assert all(kid.content is back["root"] for kid in back["root"].content)


def test_shared_containers_stay_shared(env: types.ModuleType) -> None:
    pair = [1, 2]
    common = {"k": pair}
    point = env.Box("x")
    numbers = (1, 2)
    words = {("a", 1), ("b", 2)}
    state = {"l": [pair] * 3, "d1": common, "d2": common, "t": [numbers, numbers], "p": [point, point],
             "s": words, "f": frozenset(words), "od": collections.OrderedDict(a=1), "deque": None}
    state["deque"] = [state["od"], state["od"]]
    back = roundtrip(state)
    assert back["l"][0] is back["l"][1] is back["l"][2] is back["d1"]["k"]
    assert back["d1"] is back["d2"]
    assert back["t"][0] is back["t"][1]
    assert back["p"][0] is back["p"][1]
    assert {id(t) for t in back["s"]} == {id(t) for t in back["f"]}
    assert back["deque"][0] is back["deque"][1] is back["od"]
    assert_view_is_sound(state)


def test_check_style_walk_of_parent_pointers_works_on_decoded_state(env: types.ModuleType) -> None:
    back = roundtrip(file_tree(env))
    node = back["current_dir"].children["a.txt"]
    names = []
    while node is not None:
        names.append(node.name)
        node = node.parent
    assert names == ["a.txt", "docs", "/"]


def test_state_without_shared_objects_is_written_as_before(env: types.ModuleType) -> None:
    """States written before graphs were supported read the same, and trees are written the same."""
    old = ('{"n":{"$ef":"object","v":{"name":"x","parent":null,"children":{}},"cls":"Node"},'
           '"t":{"$ef":"tuple","v":[1,{"$ef":"set","v":[1,2]}]},"e":{"$ef":"tuple","v":[]},"l":[[1],[1]]}')
    back = decode(json.loads(old), _resolve)
    assert type(back["n"]) is env.Node and back["t"] == (1, {1, 2}) and back["l"][0] is not back["l"][1]
    assert encode_state(back, ENV_MODULE) == old
    assert '"id"' not in encode_state({"x": (), "y": (), "z": frozenset(), "w": frozenset()})


def test_sets_of_shared_objects_keep_identity_and_iteration_order(env: types.ModuleType) -> None:
    shared = [env.Tag(f"t{i}") for i in range(30)]
    views = set()
    for order in (shared, shared[::-1], shared[10:] + shared[:10]):
        state = {"s": set(order), "f": frozenset(reversed(order)), "l": list(shared)}
        text = encode_state(state, ENV_MODULE)
        views.add(json.dumps(view_encoded(json.loads(text))))
        back = roundtrip(state)
        assert {id(t) for t in back["s"]} == {id(t) for t in back["l"]} == {id(t) for t in back["f"]}
        pickled = pickle.loads(pickle.dumps(state))
        assert [t.label for t in back["s"]] == [t.label for t in pickled["s"]]
        assert [t.label for t in back["f"]] == [t.label for t in pickled["f"]]
    assert len(views) == 1  # the view sorts members: it does not depend on the order


def test_corrupt_reference_fails_decode_clearly_and_views_as_invalid() -> None:
    encoded = {"a": {"$ef": "ref", "id": 7}, "b": {"$ef": "ref", "id": [1]}}
    with pytest.raises(ValueError, match="never written"):
        decode(encoded)
    assert view_encoded(encoded) == {"a": {"$truncated": "invalid"}, "b": {"$truncated": "invalid"}}
    chain: Any = [1]
    for i in range(5000):
        chain = {"$ef": "id", "id": i, "v": chain}
    assert view_encoded({"c": chain}) == {"c": {"$truncated": "invalid"}}


# --- the view ---------------------------------------------------------------------


def test_view_marks_repeated_objects_with_json_pointers(env: types.ModuleType) -> None:
    shown = assert_view_is_sound(file_tree(env))
    assert shown["current_dir"] == {"$ref": "/root/children/docs"}
    assert shown["root"]["parent"] is None
    assert shown["root"]["children"]["docs"]["parent"] == {"$ref": "/root"}
    assert shown["root"]["children"]["docs"]["children"]["a.txt"]["parent"] == {"$ref": "/root/children/docs"}


def test_user_keys_starting_with_dollar_are_escaped_in_the_view(env: types.ModuleType) -> None:
    state = {"$ref": "/x", "d": {"$ref": "/root", "$$a": 1, "a$": 2}, "$": 3, "box": env.Box({"$ref": 0})}
    shown = assert_view_is_sound(state)
    assert shown == {"$$ref": "/x", "d": {"$$ref": "/root", "$$$a": 1, "a$": 2}, "$$": 3,
                     "box": {"__type__": "Box", "content": {"$$ref": 0}}}
    assert refs(shown) == []
    assert decode(json.loads(encode_state(state, ENV_MODULE)), _resolve)["d"] == state["d"]


def test_pointer_escapes_slash_and_tilde_in_keys(env: types.ModuleType) -> None:
    target = [1]
    shown = assert_view_is_sound({"a/b": {"m~n": target}, "again": target})
    assert shown["again"] == {"$ref": "/a~1b/m~0n"}


def test_cycle_inside_a_pickled_value_points_into_the_state_view() -> None:
    value: Any = collections.OrderedDict()
    value["self"] = value
    shown = assert_view_is_sound({"a": {"b": value}})
    assert shown["a"]["b"]["self"] == {"$ref": "/a/b"}
    back = decode(json.loads(encode_state({"a": value})))["a"]
    assert back["self"] is back


def test_view_of_a_tool_result_with_parent_pointers_is_finite(env: types.ModuleType) -> None:
    docs = file_tree(env)["current_dir"]
    shown = view(docs)
    assert shown["parent"]["children"]["docs"] == {"$ref": ""}
    assert shown["children"]["a.txt"]["parent"] == {"$ref": ""}


def test_exponential_sharing_stays_linear_in_encoding_and_view() -> None:
    """Without references, 2**60 copies; with them, one of each."""
    value: Any = []
    for _ in range(60):
        value = [value, value]
    state = {"v": value}
    text = encode_state(state)
    assert len(text) < 10_000
    shown = assert_view_is_sound(state)
    assert shown["v"][1] == {"$ref": "/v/0"}
    back = decode(json.loads(text))["v"]
    assert back[0] is back[1]


def test_view_past_the_depth_bound_is_marked_truncated() -> None:
    deep: Any = "leaf"
    for _ in range(300):
        deep = [deep]
    shown = view({"deep": deep})
    cursor = shown
    depth = 0
    while isinstance(cursor, list) or (isinstance(cursor, dict) and "deep" in cursor):
        cursor = cursor[0] if isinstance(cursor, list) else cursor["deep"]
        depth += 1
    assert cursor == {"$truncated": "depth"}
    assert depth == sandbox.state.view.MAX_DEPTH
    assert view_encoded(json.loads(json.dumps({"deep": view(deep)}))) == shown


def test_view_past_the_size_bound_is_marked_truncated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.state.view, "MAX_VIEW_NODES", 50)
    state = {"items": [[i] for i in range(100)]}
    for shown in (view(state), view_encoded(json.loads(encode_state(state)))):
        assert shown["items"][:48] == [[i] for i in range(48)]
        assert shown["items"][48:] == [{"$truncated": "size"}] * 52


def test_deep_chain_of_objects_round_trips(env: types.ModuleType) -> None:
    head = env.Box()
    cursor = head
    for _ in range(1000):
        cursor.content = env.Box()
        cursor = cursor.content
    back = roundtrip({"head": head})["head"]
    for _ in range(1000):
        assert type(back) is env.Box
        back = back.content
    assert back.content is None


def test_large_graph_round_trips(env: types.ModuleType) -> None:
    root = env.Node("/")
    for d in range(200):
        folder = root.add(f"d{d}")
        for f in range(100):
            folder.add(f"f{f}")
    state = {"root": root, "cwd": root.children["d7"], "recent": [root.children["d3"].children["f1"]] * 5}
    text = encode_state(state, ENV_MODULE)
    back = decode(json.loads(text), _resolve)
    assert back["cwd"] is back["root"].children["d7"]
    assert back["recent"][0] is back["root"].children["d3"].children["f1"]
    assert back["root"].children["d199"].children["f99"].parent.parent is back["root"]
    shown = view_encoded(json.loads(text))
    assert shown["cwd"] == {"$ref": "/root/children/d7"}
    assert len(refs(shown)) == 200 * 101 + 1 + 5


# --- diffs ------------------------------------------------------------------------


def test_change_through_an_alias_is_reported_once_at_the_shown_place(env: types.ModuleType) -> None:
    state = file_tree(env)
    before = view_encoded(json.loads(encode_state(state, ENV_MODULE)))
    state["current_dir"].add("new.txt")
    after = view_encoded(json.loads(encode_state(state, ENV_MODULE)))
    assert diff(before, after) == {
        "added": [{"path": "/root/children/docs/children/new.txt",
                   "value": {"__type__": "Node", "name": "new.txt", "parent": {"$ref": "/root/children/docs"},
                             "children": {}}}],
        "removed": [],
        "changed": [],
    }


def test_moving_an_alias_is_a_changed_reference(env: types.ModuleType) -> None:
    state = file_tree(env)
    before = view(state)
    state["current_dir"] = state["root"].children["tmp"]
    assert diff(before, view(state))["changed"] == [
        {"path": "/current_dir", "old": {"$ref": "/root/children/docs"}, "new": {"$ref": "/root/children/tmp"}},
    ]


def test_graph_codec_is_not_slow_on_a_large_graph(env: types.ModuleType) -> None:
    """A guard against quadratic walks, not a timing assertion: sets of linked objects must not
    each walk the whole graph for their sort keys (this would take minutes)."""
    root = env.Box()
    members = {env.Box(root) for _ in range(3000)}
    root.content = [members, frozenset(members)]
    start = time.process_time()
    text = encode_state({"root": root}, ENV_MODULE)
    view_encoded(json.loads(text))
    back = decode(json.loads(text), _resolve)
    assert all(m.content is back["root"] for m in back["root"].content[0])
    assert time.process_time() - start < 60
