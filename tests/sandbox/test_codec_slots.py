"""The codec on instances that keep values in slots beside ``__dict__`` (pydantic v2 models)."""

from __future__ import annotations

import json
import pickle
import sys
import types
from collections.abc import Iterator

import pytest

from sandbox.state.decoder import decode
from sandbox.state.encoder import encode_state
from sandbox.state.parts import shares
from sandbox.state.view import view, view_encoded
from sandbox.worker.resident import resolver

ENV_MODULE = "ef_env_slots"

SOURCE = '''
from typing import Optional
from pydantic import BaseModel, Field, PrivateAttr


class Seat(BaseModel):
    number: str
    taken: bool = False


class Flight(BaseModel):
    model_config = {"extra": "allow"}
    code: str
    seats: dict[str, Seat] = Field(default_factory=dict)
    note: Optional[str] = None
    _holds: int = PrivateAttr(default=0)


class Plain:
    __slots__ = ("__dict__", "level")


class Guarded:
    __slots__ = ("__dict__", "lock")

    def __getstate__(self):
        return {"name": self.name}

    def __setstate__(self, state):
        self.__dict__.update(state)
'''


@pytest.fixture
def module() -> Iterator[types.ModuleType]:
    mod = types.ModuleType(ENV_MODULE)
    sys.modules[ENV_MODULE] = mod
    exec(SOURCE, mod.__dict__)
    yield mod
    del sys.modules[ENV_MODULE]


def round_trip(state: dict, mod: types.ModuleType) -> tuple[str, dict]:
    text = encode_state(state, ENV_MODULE)
    return text, decode(json.loads(text), resolver(mod))


def test_pydantic_models_round_trip_with_fields_set_extra_and_private(module: types.ModuleType) -> None:
    seat = module.Seat(number="1A")
    flight = module.Flight(code="UA1", seats={"1A": seat}, meal="veg")
    flight._holds = 2
    state = {"db": {"UA1": flight}, "last_seat": seat}
    text, back = round_trip(state, module)
    again = back["db"]["UA1"]
    assert again == flight
    assert again.model_fields_set == {"code", "seats", "meal"}
    assert again.__pydantic_extra__ == {"meal": "veg"}
    assert again._holds == 2
    assert again.seats["1A"].model_fields_set == {"number"}
    assert back["last_seat"] is again.seats["1A"]  # identity kept across the graph
    # the decoded state is pickle's round trip: the same text again (sets iterate as pickle rebuilds them)
    assert encode_state(back, ENV_MODULE) == encode_state(pickle.loads(pickle.dumps(state)), ENV_MODULE)
    assert "pickle" not in text  # stored as objects, readable by the service's view
    assert view_encoded(json.loads(text)) == view({"db": {"UA1": flight}, "last_seat": seat})
    again.seats["1A"].taken = True  # a validated model stays a model: assignment still works
    assert back["last_seat"].taken is True


def test_a_model_reached_once_is_a_tree(module: types.ModuleType) -> None:
    state = {"db": {"UA1": module.Flight(code="UA1", seats={"1A": module.Seat(number="1A")})}}
    assert not shares(state, ENV_MODULE)
    seat = module.Seat(number="2B")
    assert shares({"a": seat, "b": [seat]}, ENV_MODULE)


def test_slots_beside_dict_are_carried_and_unset_slots_stay_unset(module: types.ModuleType) -> None:
    kept, bare = module.Plain(), module.Plain()
    kept.name, kept.level = "a", 3
    bare.name = "b"
    text, back = round_trip({"kept": kept, "bare": bare}, module)
    assert back["kept"].level == 3 and back["kept"].name == "a"
    assert not hasattr(back["bare"], "level")
    assert encode_state(back, ENV_MODULE) == text


def test_a_class_with_its_own_state_protocol_is_pickled(module: types.ModuleType) -> None:
    guarded = module.Guarded()
    guarded.name, guarded.lock = "g", object()  # the lock is left out by its __getstate__
    text, back = round_trip({"g": guarded}, module)
    assert json.loads(text)["g"]["$ef"] == "pickle"
    assert back["g"].name == "g" and not hasattr(back["g"], "lock")
    assert pickle.loads(pickle.dumps(guarded)).__dict__ == back["g"].__dict__
