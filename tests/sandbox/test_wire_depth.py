"""How deep an untrusted answer may nest: ``protocol.depth_within`` against a plain recursive
count, on random JSON and at the bounds, and on input far too deep for recursion."""

from __future__ import annotations

import json
import random
import sys
from typing import Any

from sandbox.wire import protocol


def _depth(value: Any) -> int:
    """Containers on the deepest path (0 for a plain value)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _tree(rng: random.Random, depth: int) -> Any:
    if depth == 0 or rng.random() < 0.25:
        return rng.choice([None, True, 3, 2.5, "x", [], {}])
    if rng.random() < 0.5:
        return [_tree(rng, depth - 1) for _ in range(rng.randrange(4))]
    return {f"k{i}": _tree(rng, depth - 1) for i in range(rng.randrange(4))}


def test_depth_is_counted_as_a_recursive_walk_counts_it() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        value = json.loads(json.dumps(_tree(rng, 9)))
        depth = _depth(value)
        for limit in range(0, 11):
            assert protocol.depth_within(value, limit) == (depth <= limit), (value, limit)


def test_the_bound_itself_passes_and_one_more_level_does_not() -> None:
    limit = protocol.MAX_DEPTH
    at = json.loads("[" * limit + "]" * limit)
    over = json.loads("{\"a\":" * (limit + 1) + "1" + "}" * (limit + 1))
    assert protocol.depth_within(at) and not protocol.depth_within(over)


def test_input_nested_past_the_interpreter_recursion_limit_is_refused_without_recursing() -> None:
    value: Any = []
    for _ in range(sys.getrecursionlimit() * 20):
        value = [value]
    assert not protocol.depth_within(value)
    assert protocol.depth_within(value, sys.getrecursionlimit() * 20 + 1)
