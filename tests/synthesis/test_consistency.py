"""Static checks of generated initial states against the class (types, record fields, ids, references)."""

from __future__ import annotations

import copy
import json
from typing import Any

from synthesis.build.consistency import problems, schema_of
from synthesis.parsing.answers import parse_init_state
from tests.synthesis.conftest import ANSWERS, fixture_skeleton, latest

CLINIC = fixture_skeleton("clinic_appointments")
DEFAULTS = {"owners": {}, "pets": {}, "vets": {}, "appointments": {}, "current_date": "2024-06-10",
            "slots": ["09:00", "10:00"]}  # fmt: skip
SCHEMA = schema_of(CLINIC["code"], CLINIC["class_name"], DEFAULTS)


def state(name: str = "assessment") -> dict[str, Any]:
    return copy.deepcopy(parse_init_state(latest(ANSWERS / "clinic_appointments" / "init_states", name)).init_config)


def test_fixture_states_are_consistent() -> None:
    assert problems(state(), SCHEMA) == []
    assert problems(state("state-02"), SCHEMA) == []


def test_schema_reads_record_types_and_id_fields() -> None:
    assert SCHEMA.record_id("PetInfo") == "pet_id" and "appointments" in SCHEMA.annotations


def test_the_first_bad_answer_of_the_fixture_is_caught() -> None:
    bad = parse_init_state((ANSWERS / "clinic_appointments" / "init_states" / "state-02.0.md").read_text())
    found = problems(bad.init_config, SCHEMA)
    assert "pets['P006'] has the field 'notes', which PetInfo does not define" in found
    assert 'appointments: pet_id "P009" refers to no entry of pets' in found


def test_unknown_attribute_wrong_types_and_literals() -> None:
    config = state()
    config["rooms"] = {}
    config["current_date"] = 20240610
    config["pets"]["P001"]["species"] = "hamster"
    del config["vets"]["V001"]["services"]
    config["slots"] = "09:00"
    found = problems(config, SCHEMA)
    assert found[0].startswith("init_config sets 'rooms', which the class does not have")
    assert any(p.startswith("current_date must be a string, not an integer") for p in found)
    assert "pets['P001'].species must be one of [\"dog\", \"cat\", \"rabbit\", \"bird\"], not \"hamster\"" in found
    assert "vets['V001'] lacks the field 'services' that VetInfo requires" in found
    assert any(p.startswith("slots must be an array") for p in found)


def test_a_record_stored_under_another_key_is_reported() -> None:
    config = state()
    config["owners"]["O009"] = config["owners"].pop("O004")
    config["pets"]["P002"]["owner_id"] = "O009"
    assert problems(config, SCHEMA) == ["owners['O009'] is stored under 'O009' but its owner_id is \"O004\""]


def test_untyped_attributes_are_compared_with_their_defaults() -> None:
    code = "class Counter:\n    def __init__(self):\n        self.count = 0\n        self.names = []\n"
    schema = schema_of(code, "Counter", {"count": 0, "names": []})
    assert problems({"count": 2.5, "names": ["a"]}, schema) == []  # an int default admits a float
    assert problems({"names": {"a": 1}}, schema) == ["names must be an array like its default, not an object"]


def test_optional_union_and_nested_containers() -> None:
    code = ("from typing import Dict, List, Optional, Union\n\nclass Store:\n    def __init__(self):\n"
            "        self.stock: Dict[str, Dict[str, int]] = {}\n        self.note: Optional[str] = None\n"
            "        self.tags: List[Union[int, str]] = []\n        self.limit: 'int | None' = None\n")  # fmt: skip
    schema = schema_of(code, "Store", {"stock": {}, "note": None, "tags": [], "limit": None})
    assert problems({"stock": {"W1": {"A": 1}}, "note": None, "tags": [1, "x"], "limit": 3}, schema) == []
    found = problems({"stock": {"W1": {"A": "many"}}, "tags": [None], "limit": "3"}, schema)
    assert found[0].startswith("stock['W1']['A'] must be an integer, not a string")
    assert len(found) == 3, json.dumps(found)
