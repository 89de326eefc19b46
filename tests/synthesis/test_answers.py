"""The parsers of the JSON answers: one per prompt template."""

from __future__ import annotations

import json
from typing import Any

import pytest

from synthesis.errors import ParseError
from synthesis.parsing.answers import (
    parse_checklist,
    parse_env_texts,
    parse_init_state,
    parse_operation_plan,
    parse_probe_call,
    parse_solution,
    parse_state_plan,
    parse_task,
    parse_theme,
    parse_verdict,
)
from tests.synthesis.conftest import ANSWERS, latest


def block(value: Any) -> str:
    return f"```json\n{json.dumps(value)}\n```"


# -- theme ------------------------------------------------------------------------------------


def test_theme_keep_from_a_fixture_answer() -> None:
    theme = parse_theme(latest(ANSWERS / "corpus" / "theme_judge", "t01"))
    assert (theme.decision, theme.env_id, theme.usefulness, theme.modelability) == ("keep", "clinic_appointments", 8, 9)
    assert "\n" not in theme.summary


def test_theme_drop_needs_a_known_category() -> None:
    assert parse_theme(block({"decision": "drop", "category": "Chit_Chat", "reason": "hi"})).category == "chit_chat"
    with pytest.raises(ParseError, match="category must be one of open_qa"):
        parse_theme(latest(ANSWERS / "corpus" / "theme_judge", "t02.0"))


@pytest.mark.parametrize(("change", "message"), [
    ({"usefulness": 11}, "usefulness must be an integer from 1 to 10"),
    ({"usefulness": "8"}, "usefulness must be an integer"),
    ({"name": "Clinic Appointments"}, "snake_case"),
    ({"summary": "line one\nline two"}, "single line"),
    ({"introduction": "Too short."}, "too short"),
])  # fmt: skip
def test_theme_keep_fields_are_strict(change: dict[str, Any], message: str) -> None:
    env = {"name": "clinic_appointments", "summary": "A clinic front desk.", "introduction": "x" * 60,
           "usefulness": 8, "modelability": 9, **change}
    with pytest.raises(ParseError, match=message):
        parse_theme(block({"decision": "keep", "reason": "stateful", "environment": env}))


def test_theme_keep_without_environment_is_an_error() -> None:
    with pytest.raises(ParseError, match="environment must be a JSON object, not null"):
        parse_theme(block({"decision": "keep", "reason": "stateful"}))


# -- state plan -------------------------------------------------------------------------------


def _plan(**change: Any) -> dict[str, Any]:
    return {"class_name": "TaskTrackerSystem",
            "entities": [{"name": "TaskInfo", "container": "tasks", "description": "Tasks.",
                          "attributes": [{"name": "task_id", "type": "str", "description": "Id."},
                                         {"name": "status", "type": "str", "description": "Open or done."},
                                         {"name": "assignee_id", "type": "Optional[str]", "description": "Who."}]}],
            "rules": ["- Attributes: task_id values are unique.", "A done task cannot be reopened."], **change}  # fmt: skip


def test_state_plan_keeps_names_that_start_with_the_characters_of_a_label() -> None:
    plan = parse_state_plan(block(_plan()))
    names = [a.name for a in plan.entities[0].attributes]
    assert names == ["task_id", "status", "assignee_id"]  # not "ask_id", "atus", "ssignee_id"
    assert plan.rules == ["Attributes: task_id values are unique.", "A done task cannot be reopened."]
    assert plan.to_json()["entities"][0]["attributes"][0]["name"] == "task_id"


def test_state_plan_from_fixtures_strips_list_markers_from_rules() -> None:
    plan = parse_state_plan(latest(ANSWERS / "warehouse_inventory" / "state_plan"))
    assert plan.rules[0] == "Stock quantities are whole numbers and never negative."
    assert [s.name for s in plan.settings] == ["stock", "low_stock_threshold"]


@pytest.mark.parametrize(("change", "message"), [
    ({"class_name": "task_tracker"}, "CamelCase"),
    ({"entities": []}, "at least 1"),
    ({"rules": []}, "at least 1"),
    ({"settings": [{"name": "tasks", "type": "int", "description": "clash"}]}, "share one attribute name"),
])  # fmt: skip
def test_state_plan_rejects(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_state_plan(block(_plan(**change)))


def test_state_plan_rejects_a_repeated_attribute() -> None:
    plan = _plan()
    plan["entities"][0]["attributes"].append({"name": "status", "type": "str", "description": "again"})
    with pytest.raises(ParseError, match="names an attribute twice"):
        parse_state_plan(block(plan))


# -- operation plan ---------------------------------------------------------------------------


def test_operation_plan_groups_queries_and_changes() -> None:
    ops = parse_operation_plan(latest(ANSWERS / "clinic_appointments" / "operation_plan"), {"pets", "appointments"})
    assert [(o.name, o.kind) for o in ops][:2] == [("get_owner_pets", "query"), ("list_pet_appointments", "query")]
    assert {o.kind for o in ops} == {"query", "change"}


def test_operation_plan_refuses_a_name_that_shadows_state() -> None:
    with pytest.raises(ParseError, match="'appointments' is a state attribute"):
        parse_operation_plan((ANSWERS / "clinic_appointments" / "operation_plan" / "main.0.md").read_text(), {"appointments"})


def test_operation_plan_needs_both_groups_and_unique_names() -> None:
    op = {"name": "get_x", "description": "Read x.", "parameters": []}
    with pytest.raises(ParseError, match="changes needs at least 1"):
        parse_operation_plan(block({"queries": [op], "changes": []}), set())
    with pytest.raises(ParseError, match="repeated: get_x"):
        parse_operation_plan(block({"queries": [op], "changes": [op]}), set())


# -- assessment -------------------------------------------------------------------------------


def test_probe_call_must_name_a_listed_tool() -> None:
    tools = {"find_available_slots", "book_appointment"}
    with pytest.raises(ParseError, match="must be one of the listed tools"):
        parse_probe_call(latest(ANSWERS / "clinic_appointments" / "test_call", "r03.0"), tools)
    call = parse_probe_call(latest(ANSWERS / "clinic_appointments" / "test_call", "r03"), tools)
    assert (call.tool, call.intent, call.arguments["vet_id"]) == ("find_available_slots", "positive", "V002")


def test_probe_call_arguments_must_be_an_object() -> None:
    answer = block({"tool": "t", "arguments": "[]", "intent": "positive", "expectation": "works"})
    with pytest.raises(ParseError, match="arguments must be a JSON object"):
        parse_probe_call(answer, {"t"})


def test_verdict_labels_are_case_insensitive_and_closed() -> None:
    assert parse_verdict(block({"verdict": "Warning", "reason": "meh"})).label == "warning"
    with pytest.raises(ParseError, match="pass, warning, fail"):
        parse_verdict(block({"verdict": "ok", "reason": "fine"}))


# -- scenarios --------------------------------------------------------------------------------


def test_an_init_state_answer_holds_one_state_that_is_not_empty() -> None:
    state = parse_init_state(latest(ANSWERS / "clinic_appointments" / "init_states", "state-02"))
    assert state.init_config["current_date"] == "2024-06-11"
    with pytest.raises(ParseError, match="init_config is empty"):
        parse_init_state(block({"description": "x", "init_config": {}}))
    with pytest.raises(ParseError, match="answer.description must be a string"):
        parse_init_state(block({"init_config": {"pets": {}}}))


def test_task_needs_sub_goals_and_substance() -> None:
    spec = parse_task(latest(ANSWERS / "warehouse_inventory" / "task", "s01"))
    assert len(spec.sub_goals) == 3
    with pytest.raises(ParseError, match="at least 2"):
        parse_task(block({"task": "x" * 50, "sub_goals": ["one"]}))
    with pytest.raises(ParseError, match="too short"):
        parse_task(block({"task": "Do it.", "sub_goals": ["a", "b"]}))


def test_checklist_strips_markers_and_keeps_kinds() -> None:
    items = parse_checklist(latest(ANSWERS / "warehouse_inventory" / "checklist", "s02"))
    assert items[0].item == "Warehouse W03 (Glasgow North) holds 22 units of KET-STL."
    assert [i.kind for i in items] == ["change", "change", "change", "keep"]


def test_an_empty_checklist_is_a_parse_error_not_a_division_by_zero() -> None:
    with pytest.raises(ParseError, match="at least 1"):
        parse_checklist(block({"checklist": []}))


def test_a_checklist_that_changes_nothing_is_refused() -> None:
    with pytest.raises(ParseError, match="no item of kind 'change'"):
        parse_checklist(block({"checklist": [{"item": "Nothing else changed.", "kind": "keep"}]}))


def test_solution_calls_must_use_known_tools() -> None:
    calls = parse_solution(latest(ANSWERS / "clinic_appointments" / "solution", "s01"),
                           {"get_owner_pets", "list_pet_appointments", "list_vets", "find_available_slots",
                            "cancel_appointment", "book_appointment"})  # fmt: skip
    assert calls[-1].name == "book_appointment" and calls[-1].arguments["slot"] == "10:00"
    with pytest.raises(ParseError, match=r"calls\[0\]\.name must be one of the tools"):
        parse_solution(block({"calls": [{"name": "delete_everything", "arguments": {}}]}), {"get_owner_pets"})
    with pytest.raises(ParseError, match="at least 1"):
        parse_solution(block({"calls": []}), {"get_owner_pets"})


def test_rewritten_texts_that_still_name_a_removed_tool_are_sent_back() -> None:
    from synthesis.errors import ParseError

    texts = {"summary": "A permit office: look up and issue permits.", "rules": ["Permits need an existing zone."],
             "introduction": "Staff look up permits, issue them and call cancel_permit on old ones."}  # fmt: skip
    with pytest.raises(ParseError, match="answer.introduction still names the removed tool cancel_permit"):
        parse_env_texts(f"```json\n{json.dumps(texts)}\n```", ["cancel_permit"])
    texts["introduction"] = "Staff look up permits and issue new ones for existing zones."
    assert parse_env_texts(f"```json\n{json.dumps(texts)}\n```", ["cancel_permit"]).rules == ["Permits need an existing zone."]
