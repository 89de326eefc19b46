"""The key naming an initial state never names two configs, and finds lone surrogates in the pass it
makes anyway (service/engine/template_keys.py)."""

from __future__ import annotations

import json
import marshal
import struct

import pytest

from service.engine.template_keys import NotUnicode, config_key


def key(config: object, tenant: str = "t", code: str = "c") -> str:
    return config_key(tenant, code, config)  # type: ignore[arg-type]


def test_the_same_config_parsed_twice_has_one_key() -> None:
    text = json.dumps({"users": {f"u{n}": {"name": f"N{n}", "tags": ["a", "b"], "n": n} for n in range(200)}})
    assert key(json.loads(text)) == key(json.loads(text))


def test_configs_that_differ_in_anything_a_state_keeps_have_other_keys() -> None:
    base = {"a": 1, "b": [1, 2]}
    others = [{"b": [1, 2], "a": 1},  # attribute order: the instance's attributes follow it
              {"a": 1.0, "b": [1, 2]}, {"a": True, "b": [1, 2]}, {"a": "1", "b": [1, 2]}, {"a": 1, "b": (1, 2)},
              {"a": 1, "b": [2, 1]}, {"a": 1, "b": [1, 2], "c": None}]
    keys = {key(base)} | {key(other) for other in others}
    assert len(keys) == len(others) + 1
    assert key(base, tenant="other") != key(base) and key(base, code="other") != key(base)


@pytest.mark.parametrize("config", [{"name": "a\ud800b"}, {"a\udfff": 1}, {"deep": [{"x": ["\udc00"]}]}])
def test_a_lone_surrogate_anywhere_is_found(config: dict[str, object]) -> None:
    with pytest.raises(NotUnicode):
        key(config)


def test_bytes_that_look_like_a_surrogate_in_a_number_are_not_one() -> None:
    number = struct.unpack("<d", b"\x00\x00\xed\xa0\x00\x00\xf0\x3f")[0]
    assert b"\xed\xa0" in marshal.dumps({"x": number})
    assert key({"x": number}) != key({"x": 1.0})  # keyed, not refused
    assert key({"text": "\u00e9\ud7ff\ue000"}) == key({"text": "\u00e9\ud7ff\ue000"})  # around the range: valid


def test_a_config_marshal_cannot_write_is_keyed_by_its_text() -> None:
    class Odd:
        def __repr__(self) -> str:
            return "Odd()"

    assert key({"odd": Odd()}) == key({"odd": Odd()}) != key({"odd": "Odd()!"})
