"""The state codec: tagged-JSON round trips, the client view, errors and diffs."""

from __future__ import annotations

import base64
import collections
import datetime as dt
import decimal
import enum
import json
import os
import pickle
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.state import stateformat
from sandbox.state.decoder import decode
from sandbox.state.encoder import CodecError, encode_state
from sandbox.state.view import OVER, diff, view, view_encoded, view_encoded_within
from sandbox.wire import protocol

ENV_MODULE = "ef_env_test"

ENV_SOURCE = '''
import dataclasses
import enum


class Color(enum.Enum):
    RED = "red"
    GREEN = 2


class Size(enum.Enum):
    LARGE = "l"
    SMALL = "s"


class Flip(enum.Enum):
    A = "z"
    B = "a"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 10


class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y


@dataclasses.dataclass
class Item:
    name: str
    tags: set
    where: Point | None = None
    color: Color = Color.RED


@dataclasses.dataclass(frozen=True)
class Key:
    parts: tuple


class Outer:
    class Inner:
        def __init__(self, value):
            self.value = value
'''


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A synthetic environment module, registered in sys.modules for the test only."""
    module = types.ModuleType(ENV_MODULE)
    monkeypatch.setitem(sys.modules, ENV_MODULE, module)
    exec(compile(ENV_SOURCE, f"<{ENV_MODULE}>", "exec"), module.__dict__)
    yield module


def _resolver(module: types.ModuleType) -> Callable[[str], type]:
    def resolve(qualname: str) -> type:
        target: Any = module
        for part in qualname.split("."):
            target = getattr(target, part)
        return target  # type: ignore[no-any-return]

    return resolve


def _roundtrip(state: dict[str, Any], module: types.ModuleType | None = None) -> Any:
    text = encode_state(state, ENV_MODULE if module is not None else None)
    assert isinstance(text, str)
    return decode(json.loads(text), _resolver(module) if module is not None else None)


def _view_key(value: Any) -> str:
    return json.dumps(view(value), sort_keys=True)


def assert_same(a: Any, b: Any, where: str = "$") -> None:
    """Equal values of exactly the same types, recursively (NaN equals NaN)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} became {type(b).__name__}"
    if isinstance(a, float):
        assert repr(a) == repr(b), f"{where}: {a!r} became {b!r}"  # NaN, -0.0 and precision
    elif isinstance(a, decimal.Decimal):
        assert str(a) == str(b), f"{where}: {a} became {b}"
    elif isinstance(a, (list, tuple, collections.deque)):
        assert len(a) == len(b), f"{where}: length {len(a)} became {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            assert_same(x, y, f"{where}[{i}]")
        if isinstance(a, collections.deque):
            assert a.maxlen == b.maxlen
    elif isinstance(a, dict):
        assert len(a) == len(b), f"{where}: {len(a)} keys became {len(b)}"
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=False):  # insertion order is kept too
            assert_same(ka, kb, f"{where} key {ka!r}")
            assert_same(va, vb, f"{where}[{ka!r}]")
    elif isinstance(a, (set, frozenset)):
        assert len(a) == len(b), f"{where}: {len(a)} items became {len(b)}"
        for i, (x, y) in enumerate(zip(sorted(a, key=_view_key), sorted(b, key=_view_key), strict=False)):
            assert_same(x, y, f"{where}{{{i}}}")
    elif isinstance(a, enum.Enum):
        assert a is b, f"{where}: {a!r} became {b!r}"
    elif isinstance(a, (dt.datetime, dt.time)):
        assert a == b and a.isoformat() == b.isoformat(), f"{where}: {a!r} became {b!r}"
    elif type(a).__module__ == ENV_MODULE:
        assert a is not b
        assert_same(vars(a), vars(b), f"{where}.__dict__")
    else:
        assert a == b, f"{where}: {a!r} became {b!r}"


def _builtin_cases() -> dict[str, Any]:
    tz = dt.timezone(dt.timedelta(hours=5, minutes=30))
    return {
        "nested": {"a": {"b": [1, [2, {"c": None}], True, False, "x"]}, "empty": {}, "none": None, "l": []},
        "set": {1, 2, 3},
        "set_of_strings": {"b", "a", "c"},
        "frozenset": frozenset({"x", "y"}),
        "empty_set": set(),
        "tuple": (1, "two", 3.5, None),
        "nested_tuple": ((1, 2), (), ([3], {"k": (4,)})),
        "tuple_keys": {(1, 2): "a", (3, (4, 5)): "b"},
        "set_of_tuples": {(1, 2), (3, 4), (5, (6, 7))},
        "frozenset_of_tuples": frozenset({(1, 2), ()}),
        "int_keys": {1: "one", 2: "two", -7: "minus"},
        "mixed_keys": {1: "int", "1": "str", None: "none", False: "bool", 2.5: "float"},
        "tag_key": {"$ef": "pickle", "v": "not really", "view": 1},
        "nested_tag_key": [{"inner": {"$ef": "tuple", "v": [1, 2]}}],
        "datetime": dt.datetime(2024, 2, 29, 13, 45, 1, 123456),
        "aware_datetime": dt.datetime(2024, 1, 1, 0, 0, tzinfo=tz),
        "utc_datetime": dt.datetime(2000, 1, 1, tzinfo=dt.UTC),
        "date": dt.date(1999, 12, 31),
        "time": dt.time(23, 59, 59, 999999),
        "aware_time": dt.time(8, 0, tzinfo=tz),
        "timedelta": dt.timedelta(days=-3, seconds=7, microseconds=11),
        "decimal": decimal.Decimal("3.14159265358979323846264338327950288"),
        "decimals": [decimal.Decimal("1.10"), decimal.Decimal("-0.00"), decimal.Decimal("1E+3"),
                     decimal.Decimal("NaN"), decimal.Decimal("-Infinity")],
        "bytes": b"\x00\xff\x10binary",
        "utf8_bytes": "héllo".encode(),
        "empty_bytes": b"",
        "nan": float("nan"),
        "inf": float("inf"),
        "neg_inf": float("-inf"),
        "neg_zero": -0.0,
        "floats": [0.1, 1e308, 5e-324, -2.5],
        "big_int": 2**200,
        "neg_big_int": -(10**50) - 1,
        "huge_int": 10**4000,
        "unicode": "żółć 日本語 🎉 \u0000 \ud7ff \"quoted\" \\ back",
        "unicode_key": {"ключ 🔑": "значение", "a/b~c": 1},
        "shared": [[1, 2]] * 3,  # the same list three times is not a cycle
    }


CASE_NAMES = list(_builtin_cases())


@pytest.mark.parametrize("name", CASE_NAMES)
def test_builtin_value_round_trips_exactly(name: str) -> None:
    value = _builtin_cases()[name]
    state = {"value": value}
    assert_same(state, _roundtrip(state))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_view_of_encoded_builtin_value_equals_its_view(name: str) -> None:
    state = {"value": _builtin_cases()[name]}
    viewed = view_encoded(json.loads(encode_state(state)))
    assert viewed == view(state)
    json.dumps(viewed, allow_nan=False)  # plain, strict JSON


def test_all_builtin_values_round_trip_together() -> None:
    state = _builtin_cases()
    text = encode_state(state)
    assert_same(state, decode(json.loads(text)))
    assert view_encoded(json.loads(text)) == view(state)


def test_plain_json_state_is_stored_untagged() -> None:
    state = {"a": [1, 2.5, "x", None, True], "b": {"c": {}}}
    assert json.loads(encode_state(state)) == state


def test_view_is_plain_json() -> None:
    state = _builtin_cases()
    assert view(state)["set"] == [1, 2, 3]
    assert view(state)["tuple"] == [1, "two", 3.5, None]
    assert view(state)["nan"] == "nan"
    assert view(state)["timedelta"] == dt.timedelta(days=-3, seconds=7, microseconds=11).total_seconds()
    assert view(state)["int_keys"] == {"1": "one", "2": "two", "-7": "minus"}
    assert json.loads(json.dumps(view(state), allow_nan=False)) == view(state)


# --- classes of the environment's own module --------------------------------


def _env_cases(env: types.ModuleType) -> dict[str, Any]:
    point = env.Point(1, {"deep": (2, 3)})
    return {
        "enum": env.Color.RED,
        "enum_int_value": env.Color.GREEN,
        "int_enum": env.Level.HIGH,
        "enum_in_list": [env.Color.GREEN, env.Level.LOW],
        "enum_key": {env.Color.RED: 1, env.Color.GREEN: 2},
        "enum_set": {env.Size.SMALL, env.Size.LARGE},
        "plain_object": point,
        "dataclass": env.Item("widget", {"a", "b"}, env.Point(0, 0), env.Color.GREEN),
        "dataclass_defaults": env.Item("bare", set()),
        "frozen_dataclass": env.Key(("a", 1)),
        "frozen_dataclass_set": {env.Key((1,)), env.Key((2,))},
        "object_with_tag_attr": _with_attrs(env.Point(1, 2), **{"$ef": "object"}),
        "nested_class": env.Outer.Inner([env.Point(5, 6)]),
        "objects_in_dict": {"p": env.Point(1, 2), "q": [env.Point(3, 4)]},
    }


def _with_attrs(obj: Any, **attrs: Any) -> Any:
    obj.__dict__.update(attrs)
    return obj


ENV_CASE_NAMES = [
    "enum", "enum_int_value", "int_enum", "enum_in_list", "enum_key", "enum_set", "plain_object", "dataclass",
    "dataclass_defaults", "frozen_dataclass", "frozen_dataclass_set", "object_with_tag_attr", "nested_class",
    "objects_in_dict",
]


def test_env_case_names_are_complete(env: types.ModuleType) -> None:
    assert sorted(ENV_CASE_NAMES) == sorted(_env_cases(env))


@pytest.mark.parametrize("name", ENV_CASE_NAMES)
def test_env_class_value_round_trips_as_the_same_classes(env: types.ModuleType, name: str) -> None:
    state = {"value": _env_cases(env)[name]}
    text = encode_state(state, ENV_MODULE)
    assert '"pickle"' not in text  # stored by class name, not pickled
    assert_same(state, decode(json.loads(text), _resolver(env)))


@pytest.mark.parametrize("name", ENV_CASE_NAMES)
def test_view_of_encoded_env_value_equals_its_view(env: types.ModuleType, name: str) -> None:
    state = {"value": _env_cases(env)[name]}
    viewed = view_encoded(json.loads(encode_state(state, ENV_MODULE)))
    assert viewed == view(state)
    json.dumps(viewed, allow_nan=False)


def test_env_objects_come_back_as_instances_with_equal_attributes(env: types.ModuleType) -> None:
    item = env.Item("widget", {"a", "b"}, env.Point(1.5, [env.Color.RED]), env.Color.GREEN)
    back = _roundtrip({"item": item, "color": env.Color.RED}, env)
    assert type(back["item"]) is env.Item
    assert back["item"] is not item
    assert (back["item"].name, back["item"].tags, back["item"].color) == ("widget", {"a", "b"}, env.Color.GREEN)
    assert type(back["item"].where) is env.Point
    assert vars(back["item"].where) == {"x": 1.5, "y": [env.Color.RED]}
    assert back["color"] is env.Color.RED
    assert view(back) == view({"item": item, "color": env.Color.RED})


def test_env_object_needs_the_resolver(env: types.ModuleType) -> None:
    encoded = json.loads(encode_state({"p": env.Point(1, 2)}, ENV_MODULE))
    with pytest.raises(ValueError):
        decode(encoded)


def test_env_classes_without_env_module_fall_back_to_pickle(env: types.ModuleType) -> None:
    state = {"p": env.Point(1, 2)}
    encoded = json.loads(encode_state(state))  # no env_module named
    assert encoded["p"]["$ef"] == "pickle"
    assert view_encoded(encoded) == view(state)
    assert_same(state, decode(encoded))


# --- the pickle fallback ----------------------------------------------------


def _foreign_cases() -> dict[str, Any]:
    return {
        "ordered_dict": collections.OrderedDict([("b", 1), ("a", [2, 3])]),
        "deque": collections.deque([1, "two", (3,)], maxlen=5),
        "counter": collections.Counter("abracadabra"),
        "bytearray": bytearray(b"\x00abc"),
        "namespace": types.SimpleNamespace(a=1, b=[2]),
        "complex": 3 + 4j,
        "range": range(2, 10, 3),
    }


# Collections the codec writes as containers of the graph (their aliasing is kept), not pickled.
_NATIVE = {"ordered_dict": "odict", "deque": "deque", "counter": "counter"}


@pytest.mark.parametrize("name", list(_foreign_cases()))
def test_foreign_class_round_trips_via_pickle(env: types.ModuleType, name: str) -> None:
    state = {"value": _foreign_cases()[name]}
    encoded = json.loads(encode_state(state, ENV_MODULE))
    assert encoded["value"]["$ef"] == _NATIVE.get(name, "pickle")
    back = decode(encoded, _resolver(env))
    assert type(back["value"]) is type(state["value"])
    assert back["value"] == state["value"]
    if name in ("ordered_dict", "deque"):
        assert_same(state, back)


@pytest.mark.parametrize("name", list(_foreign_cases()))
def test_view_of_pickled_value_equals_its_view(env: types.ModuleType, name: str) -> None:
    state = {"value": _foreign_cases()[name]}
    viewed = view_encoded(json.loads(encode_state(state, ENV_MODULE)))
    assert viewed == view(state)
    json.dumps(viewed, allow_nan=False)


class _Boom:
    """Unpickling this creates a directory: proof that something was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def _malicious(marker: Path) -> dict[str, Any]:
    blob = base64.b64encode(pickle.dumps(_Boom(marker))).decode("ascii")
    return {"$ef": "pickle", "v": blob, "view": "x"}


def test_view_encoded_never_unpickles(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    assert view_encoded(_malicious(marker)) == "x"
    nested = {"a": [_malicious(marker), {"b": _malicious(marker)}],
              "t": {"$ef": "tuple", "v": [_malicious(marker)]},
              "d": {"$ef": "dict", "v": [[1, _malicious(marker)]]}}
    assert view_encoded(nested) == {"a": ["x", {"b": "x"}], "t": ["x"], "d": {"1": "x"}}
    assert not marker.exists()


def test_the_malicious_payload_is_real(tmp_path: Path) -> None:
    """Control for the test above: decode (sandbox only) does unpickle it."""
    marker = tmp_path / "unpickled"
    decode(_malicious(marker))
    assert marker.is_dir()


# --- sets: deterministic order ------------------------------------------------


def test_set_encoding_keeps_iteration_order_as_pickle_does() -> None:
    """Sets are written in their iteration order and added back in it, as pickle does: the rebuilt
    set iterates as ``pickle.loads(pickle.dumps(s))`` would (the view still sorts them)."""
    small: set[int] = set()
    for x in [8, 1, 16, 3]:
        small.add(x)
    big = set(range(1000)) | {8, 1, 16, 3}
    big -= set(range(1000)) - {8, 1, 16, 3}
    assert small == big and list(small) != list(big)  # same set, different iteration order
    for value in (small, big, frozenset(small), frozenset(big)):
        back = decode(json.loads(encode_state({"s": value})))["s"]
        assert type(back) is type(value) and back == value
        assert list(back) == list(pickle.loads(pickle.dumps(value)))
    assert view_encoded(json.loads(encode_state({"s": small}))) == view_encoded(json.loads(encode_state({"s": big})))


def test_set_of_strings_and_tuples_iterates_as_pickle_rebuilds_it() -> None:
    words = [f"w{i}" for i in range(50)] + [(i, str(i)) for i in range(20)]
    forward: set[Any] = set()
    for w in words:
        forward.add(w)
    backward = set(reversed(words))
    padded = set(range(5000)) | set(words)
    padded -= set(range(5000))
    views = set()
    for s in (forward, backward, padded):
        state = {"s": s, "f": frozenset(s)}
        text = encode_state(state)
        back = decode(json.loads(text))
        assert list(back["s"]) == list(pickle.loads(pickle.dumps(s)))
        assert list(back["f"]) == list(pickle.loads(pickle.dumps(frozenset(s))))
        views.add(json.dumps(view_encoded(json.loads(text))))
    assert len(views) == 1  # the view does not depend on the order


def test_set_views_are_sorted() -> None:
    state = {"s": {"pear", "apple", "fig"}, "n": {10, -1, 3}, "t": {(2, 1), (1, 9)}}
    viewed = view_encoded(json.loads(encode_state(state)))
    assert viewed["s"] == ["apple", "fig", "pear"]
    assert viewed["t"] == [[1, 9], [2, 1]]
    assert sorted(viewed["n"]) == [-1, 3, 10]
    assert viewed == view(state)
    rebuilt = {"s": set(sorted(state["s"], reverse=True)), "n": {3, 10, -1}, "t": {(1, 9), (2, 1)}}
    assert view(rebuilt) == viewed
    assert view_encoded(json.loads(encode_state(rebuilt))) == viewed


# --- view and view_encoded agree on awkward values ---------------------------


@pytest.mark.parametrize("value", [
    {1.5, float("nan")},
    {1, "a", dt.date(2024, 1, 1)},
    {decimal.Decimal("1.5"), 2},
], ids=["float-nan", "int-str-date", "decimal-int"])
def test_view_encoded_of_mixed_kind_set_equals_view(value: Any) -> None:
    state = {"s": value}
    assert view_encoded(json.loads(encode_state(state))) == view(state)


@pytest.mark.parametrize("members", [("Color", "RED", "GREEN"), ("Flip", "A", "B")], ids=["mixed-values", "name-vs-value"])
def test_view_encoded_of_enum_set_equals_view(env: types.ModuleType, members: tuple[str, str, str]) -> None:
    cls = getattr(env, members[0])
    state = {"s": {cls[members[1]], cls[members[2]]}}
    assert view_encoded(json.loads(encode_state(state, ENV_MODULE))) == view(state)


@pytest.mark.parametrize("key", [("a", "b"), frozenset({"x"})], ids=["tuple", "frozenset"])
def test_view_encoded_of_string_tuple_key_equals_view(key: Any) -> None:
    state = {"d": {key: 1}}
    assert view_encoded(json.loads(encode_state(state))) == view(state)


@pytest.mark.parametrize("key", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_view_encoded_of_non_finite_float_key_equals_view(key: float) -> None:
    state = {"d": {key: 1}}
    assert view_encoded(json.loads(encode_state(state))) == view(state)


# --- values that cannot be encoded ------------------------------------------


def _gen() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(("state", "path"), [
    ({"gen": _gen()}, "/gen"),
    ({"gen": (i for i in range(3))}, "/gen"),
    ({"s": {1, lambda: 0}}, "/s"),
    ({"lock": threading.Lock()}, "/lock"),
    ({"a": {"b": [0, 1, threading.RLock()]}}, "/a/b/2"),
    ({"t": (1, (2, _gen()))}, "/t/1/1"),
    ({"a/b": {"m~n": _gen()}}, "/a~1b/m~0n"),
    ({"d": {7: _gen()}}, "/d/7"),
    ({"fn": lambda: 1}, "/fn"),
], ids=["generator", "genexpr", "lambda-in-set", "lock", "nested-rlock", "in-tuple", "escaped-keys", "int-key",
        "lambda"])
def test_unserializable_value_raises_codec_error_with_pointer(state: dict[str, Any], path: str) -> None:
    with pytest.raises(CodecError) as excinfo:
        encode_state(state)
    assert excinfo.value.path == path
    assert path in str(excinfo.value)


def test_unserializable_attribute_of_env_object_is_pointed_at(env: types.ModuleType) -> None:
    state = {"items": [env.Point(1, 2), env.Point(3, threading.Lock())]}
    with pytest.raises(CodecError) as excinfo:
        encode_state(state, ENV_MODULE)
    assert excinfo.value.path == "/items/1/y"


def test_deep_nesting_round_trips_in_shallow_json() -> None:
    deep: list[Any] = []
    cursor = deep
    for _ in range(5000):
        cursor.append([])
        cursor = cursor[0]
    text = encode_state({"deep": deep})
    assert protocol.depth_within(json.loads(text), 2 * stateformat.FLAT_DEPTH)  # flat blocks below FLAT_DEPTH
    back = decode(json.loads(text))["deep"]
    for _ in range(5000):
        assert len(back) == 1
        back = back[0]
    assert back == []


def test_moderate_nesting_round_trips() -> None:
    deep: Any = "leaf"
    for i in range(150):
        deep = [deep] if i % 2 else {"k": deep}
    state = {"deep": deep}
    assert_same(state, _roundtrip(state))


def test_int_too_long_for_json_text_round_trips() -> None:
    text = encode_state({"n": 10**5000, "m": -(2**20000)})
    assert decode(json.loads(text)) == {"n": 10**5000, "m": -(2**20000)}
    assert view_encoded(json.loads(text))["n"] == hex(10**5000)


# --- diff ---------------------------------------------------------------------


def test_diff_of_equal_views_is_empty() -> None:
    value = view(_builtin_cases())
    assert diff(value, json.loads(json.dumps(value))) == {"added": [], "removed": [], "changed": []}
    assert diff({}, {}) == {"added": [], "removed": [], "changed": []}


def test_diff_reports_added_removed_and_changed_pointers() -> None:
    before = {"keep": 1, "gone": [1], "nested": {"x": 1, "y": {"z": "old"}}}
    after = {"keep": 1, "new": {"a": 1}, "nested": {"x": 2, "y": {"z": "new", "w": None}}}
    assert diff(before, after) == {
        "added": [{"path": "/new", "value": {"a": 1}}, {"path": "/nested/y/w", "value": None}],
        "removed": [{"path": "/gone", "value": [1]}],
        "changed": [{"path": "/nested/x", "old": 1, "new": 2}, {"path": "/nested/y/z", "old": "old", "new": "new"}],
    }


def test_diff_escapes_slash_and_tilde_in_keys() -> None:
    before = {"a/b": 1, "m~n": {"~1": 0}, "gone/~": 1}
    after = {"a/b": 2, "m~n": {"~1": 1}, "new/": 1}
    assert diff(before, after) == {
        "added": [{"path": "/new~1", "value": 1}],
        "removed": [{"path": "/gone~1~0", "value": 1}],
        "changed": [{"path": "/a~1b", "old": 1, "new": 2}, {"path": "/m~0n/~01", "old": 0, "new": 1}],
    }


def test_diff_of_same_length_lists_is_per_index() -> None:
    before = {"l": [1, 2, 3, {"a": 1}]}
    after = {"l": [1, 5, 3, {"a": 1, "b": 2}]}
    assert diff(before, after) == {
        "added": [{"path": "/l/3/b", "value": 2}],
        "removed": [],
        "changed": [{"path": "/l/1", "old": 2, "new": 5}],
    }


def test_diff_of_lists_of_different_length_replaces_the_list() -> None:
    assert diff({"l": [1, 2]}, {"l": [1, 2, 3]}) == {
        "added": [], "removed": [], "changed": [{"path": "/l", "old": [1, 2], "new": [1, 2, 3]}],
    }


def test_diff_reports_type_changes() -> None:
    assert diff({"a": 1}, {"a": "1"})["changed"] == [{"path": "/a", "old": 1, "new": "1"}]
    assert diff({"a": [1]}, {"a": {"0": 1}})["changed"] == [{"path": "/a", "old": [1], "new": {"0": 1}}]
    assert diff({"a": None}, {"a": 0})["changed"] == [{"path": "/a", "old": None, "new": 0}]


def test_diff_reports_nested_int_to_bool_change() -> None:
    assert diff(1, True)["changed"] == [{"path": "", "old": 1, "new": True}]  # RFC 6901: "" is the root
    assert diff({"a": 1}, {"a": True})["changed"] == [{"path": "/a", "old": 1, "new": True}]


def test_diff_of_encoded_state_views(env: types.ModuleType) -> None:
    before = {"items": {"a", "b"}, "when": dt.date(2024, 1, 1), "p": env.Point(1, 2)}
    after = {"items": {"a", "b", "c"}, "when": dt.date(2024, 1, 2), "p": env.Point(1, 3)}
    old = view_encoded(json.loads(encode_state(before, ENV_MODULE)))
    new = view_encoded(json.loads(encode_state(after, ENV_MODULE)))
    assert diff(old, new) == {
        "added": [],
        "removed": [],
        "changed": [
            {"path": "/items", "old": ["a", "b"], "new": ["a", "b", "c"]},
            {"path": "/when", "old": "2024-01-01", "new": "2024-01-02"},
            {"path": "/p/y", "old": 2, "new": 3},
        ],
    }


def test_a_shared_object_under_many_keys_is_charged_every_time_it_is_shown() -> None:
    shared = tuple(range(2000))
    many = json.loads(encode_state({"index": {(i, shared): i for i in range(100)}}))
    # small as stored (the tuple is written once), but each key shows it in full
    assert len(json.dumps(many)) < 20_000
    assert view_encoded_within(many, 20_000) is OVER
    plain = json.loads(encode_state({"index": {(i, "x"): i for i in range(100)}, "shared": shared}))
    assert view_encoded_within(plain, 20_000) == view_encoded(plain)


def test_keys_showing_a_long_shared_string_spend_the_whole_views_budget() -> None:
    text = "x" * 50_000
    state = {"index": {(i, text): i for i in range(200)}}
    encoded = json.loads(encode_state(state))
    assert view_encoded_within(encoded, 20_000) is OVER
