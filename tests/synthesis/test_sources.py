"""The parsers of code answers: the state class, one method, one check function, and their lints."""

from __future__ import annotations

import pytest

from synthesis.errors import ParseError
from synthesis.parsing.sources import parse_check_func, parse_class_code, parse_method
from tests.synthesis.conftest import ANSWERS, latest

CLINIC = ANSWERS / "clinic_appointments"


def code(text: str) -> str:
    return f"```python\n{text}\n```"


def test_class_code_from_fixture_sets_every_planned_attribute() -> None:
    source = parse_class_code(latest(CLINIC / "state_code"), "ClinicAppointmentSystem",
                              ["owners", "pets", "vets", "appointments", "current_date", "slots"])  # fmt: skip
    assert "class ClinicAppointmentSystem" in source


def test_class_code_names_the_attributes_init_forgets() -> None:
    with pytest.raises(ParseError, match=r"does not set self\.rooms, self\.beds$"):
        parse_class_code(latest(CLINIC / "state_code"), "ClinicAppointmentSystem", ["pets", "rooms", "vets", "beds"])


@pytest.mark.parametrize(("source", "message"), [
    ("class Other:\n    def __init__(self):\n        self.a = 1", "no top-level class Clinic"),
    ("class Clinic:\n    pass", "has no __init__"),
    ("class Clinic:\n    def __init__(self):\n        self.a = 1\n    def book(self):\n        return {}", "remove book"),
    ("print('hi')\nclass Clinic:\n    def __init__(self):\n        self.a = 1", "line 1: only imports, classes"),
])  # fmt: skip
def test_class_code_rejects(source: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_class_code(code(source), "Clinic", ["a"])


def test_method_keeps_imports_helpers_and_decorator_free_source() -> None:
    method = parse_method(latest(CLINIC / "operation_code", "find_available_slots"), "find_available_slots")
    assert method.imports == ["import datetime", "from typing import Optional"]
    assert list(method.functions) == ["find_available_slots", "_check_date"]
    assert method.functions["_check_date"].startswith("def _check_date(self, date: str)")


def test_method_pasted_with_class_indentation_is_accepted() -> None:
    method = parse_method(latest(CLINIC / "operation_code", "list_pet_appointments"), "list_pet_appointments")
    assert method.functions["list_pet_appointments"].startswith("def list_pet_appointments(self, pet_id: str)")


def test_truncated_method_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="not closed"):
        parse_method((CLINIC / "operation_code" / "book_appointment.0.md").read_text(), "book_appointment")


def test_method_that_raises_is_refused_but_a_guarded_raise_is_fine() -> None:
    with pytest.raises(ParseError, match="line 8: a raise escapes reset"):
        parse_method(latest(ANSWERS / "tally_counter" / "operation_code", "reset"), "reset")
    guarded = code('def f(self, x):\n    try:\n        raise ValueError(x)\n    except ValueError:\n'
                   '        return {"success": False, "error": "bad"}')  # fmt: skip
    assert parse_method(guarded, "f").name == "f"


@pytest.mark.parametrize(("source", "message"), [
    ("def _g(self):\n    return {'success': True}", "defines no method f"),
    ("def g(self):\n    return {'success': True}", "give only the method f"),
    ("def f(x):\n    return {'success': True}", "self as its first parameter"),
    ("def f(self):\n    return {'ok': True}", 'never returns a dict literal with a "success" key'),
    ("def f(self):\n    return {'success': True}\ndef other(self):\n    return {'success': True}", "not other"),
    ("class C:\n    def f(self):\n        return {'success': True}", "not inside a class"),
    ("x = 1\ndef f(self):\n    return {'success': True}", "only imports and the method"),
])  # fmt: skip
def test_method_rejects(source: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_method(code(source), "f")


def test_check_func_from_fixture_reads_initial_state_without_mutating() -> None:
    source = parse_check_func(latest(ANSWERS / "warehouse_inventory" / "check_func", "s01-c3"))
    assert "initial_state" in source


def test_check_func_that_mutates_its_input_is_refused() -> None:
    with pytest.raises(ParseError, match="line 4: the check modifies the state"):
        parse_check_func((ANSWERS / "warehouse_inventory" / "check_func" / "s01-c3.0.md").read_text())


@pytest.mark.parametrize("body", [
    "final_state['x'] = 1",
    "del final_state['x']",
    "final_state.setdefault('x', {})",
    "pets = final_state['pets']\n    pets['P1'] = None",
    "for appt in final_state['appointments'].values():\n        appt['status'] = 'x'",
    "initial_state['stock'].clear()",
    "final_state.get('stock', {}).update({})",
])  # fmt: skip
def test_mutation_is_found_through_aliases_and_loops(body: str) -> None:
    with pytest.raises(ParseError, match="modifies the state"):
        parse_check_func(code(f"def check_func(final_state):\n    {body}\n    return True"))


def test_copies_and_local_collections_may_change() -> None:
    source = ("import copy\n\ndef check_func(final_state):\n    mine = copy.deepcopy(final_state)\n    mine['x'] = 1\n"
              "    seen = set()\n    for key in final_state.get('pets', {}):\n        seen.add(key)\n"
              "    rows = dict(final_state)\n    rows.pop('pets', None)\n    return bool(seen)")  # fmt: skip
    assert parse_check_func(code(source))


@pytest.mark.parametrize(("source", "message"), [
    ("def check(final_state):\n    return True", "no top-level function check_func"),
    ("def check_func(final_state, initial_state):\n    return True", "exactly one parameter"),
    ("def check_func(final_state):\n    pass", "never returns"),
    ("check_func = lambda s: True", "no top-level function check_func"),
    ("def check_func(final_state):\n    return True\nprint(check_func({}))", "only imports, constants and functions"),
])  # fmt: skip
def test_check_func_rejects(source: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_check_func(code(source))
