"""A tool result that is plain JSON is shown without the full viewer (``view._plain``): the view
must be the one the viewer gives, for every value, plain or not."""

from __future__ import annotations

import enum
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.state import view
from sandbox.state.stateformat import BIG_INT_BITS, MAX_DEPTH


def _viewer(value: Any) -> Any:
    return view.ValueViewer().show(value, None, 0)


class Color(enum.IntEnum):
    RED = 1


leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1 << BIG_INT_BITS, -(1 << BIG_INT_BITS), Color.RED, b"\x00b", (), frozenset()]),
)
keys = st.one_of(st.text(max_size=4), st.sampled_from(["$ref", "$x", "$", "a"]), st.integers(-3, 3),
                 st.tuples(st.integers(0, 2)))
values = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4), st.tuples(inner, inner),
    st.frozensets(st.integers(0, 5), max_size=3)), max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(values)
def test_any_value_is_shown_as_the_viewer_shows_it(value: Any) -> None:
    expected = _viewer(value)
    shown = view.view(value)
    assert _same(shown, expected), (value, shown, expected)


@settings(max_examples=200, deadline=None)
@given(values, st.integers(0, 3))
def test_a_container_met_twice_is_a_reference_the_second_time(value: Any, where: int) -> None:
    shared = {"inner": [value]}
    tree = {"a": shared, "b": [shared] * (where % 2 + 1), "c": where}
    shown = view.view(tree)
    assert _same(shown, _viewer(tree))
    assert shown["b"][-1] == {"$ref": "/a"}


def test_plain_results_are_copies_that_hold_nothing_of_the_value() -> None:
    result = {"data": {"user_id": "U1", "order_ids": ["O1", "O2"], "n": 3, "price": 1.5, "ok": True, "none": None}}
    shown = view.view(result)
    assert shown == result and shown["data"] is not result["data"] and shown["data"]["order_ids"] is not \
        result["data"]["order_ids"]


@pytest.mark.parametrize("value", [
    {"$ref": "/x"}, {"a": float("nan")}, {"a": math.inf}, [1 << BIG_INT_BITS], {1: "x"}, {"a": ("t",)},
    {"a": Color.RED}, {"a": {"b": set()}},
])
def test_values_the_plain_path_leaves_to_the_viewer(value: Any) -> None:
    assert _same(view.view(value), _viewer(value))


def test_nesting_past_the_view_depth_is_cut_as_the_viewer_cuts_it() -> None:
    deep: Any = "leaf"
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    assert view.view(deep) == _viewer(deep)
    assert view.view({"d": deep}) == _viewer({"d": deep})


def test_a_view_past_the_node_budget_is_cut_as_the_viewer_cuts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(view, "MAX_VIEW_NODES", 5)
    value = {"a": [[1], [2], [3], [4], [5], [6]]}
    shown = view.view(value)
    assert shown == _viewer(value) and {"$truncated": "size"} in shown["a"]


def test_a_cycle_is_shown_as_a_reference_to_where_it_started() -> None:
    loop: dict[str, Any] = {"name": "x"}
    loop["self"] = loop
    assert view.view(loop) == _viewer(loop) == {"name": "x", "self": {"$ref": ""}}


def _same(a: Any, b: Any) -> bool:
    """Equal views, NaN equal to NaN (the viewer shows it as text, but a float may sit in a key's text)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)
