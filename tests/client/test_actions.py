"""Every action shape an agent produces is read the same way; malformed ones say what is wrong."""

from __future__ import annotations

import json

import pytest
from envfoundry_client.actions import ParsedCall, parse_action, parse_text, render_call

CALL = ParsedCall("return_book", {"loan_id": "L0003"})


@pytest.mark.parametrize("action", [
    {"type": "function", "function": {"name": "return_book", "arguments": '{"loan_id": "L0003"}'}},
    {"type": "function", "function": {"name": "return_book", "arguments": {"loan_id": "L0003"}}},
    {"name": "return_book", "arguments": {"loan_id": "L0003"}},
    {"name": "return_book", "arguments": '{"loan_id": "L0003"}'},
    json.dumps({"name": "return_book", "arguments": {"loan_id": "L0003"}}),
    json.dumps({"type": "function", "function": {"name": "return_book", "arguments": '{"loan_id": "L0003"}'}}),
    '<tool_call>\n{"name": "return_book", "arguments": {"loan_id": "L0003"}}\n</tool_call>',
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "return_book", "arguments": '{"loan_id": "L0003"}'}}]},
])
def test_one_tool_call_in_every_accepted_shape(action: object) -> None:
    parsed = parse_action(action)
    assert parsed.error is None
    assert [(c.name, c.arguments) for c in parsed.calls] == [(CALL.name, CALL.arguments)]


def test_several_tool_call_blocks_and_the_text_around_them() -> None:
    text = ("Let me do both.\n<tool_call>\n" + json.dumps({"name": "a", "arguments": {"x": 1}}) + "\n</tool_call>"
            "\n<tool_call>" + json.dumps({"name": "b", "arguments": {}}) + "</tool_call>")
    parsed = parse_text(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("a", {"x": 1}), ("b", {})]
    assert parsed.text == "Let me do both."


def test_a_list_of_calls() -> None:
    parsed = parse_action([{"name": "a", "arguments": {}}, {"name": "b", "arguments": "{}"}])
    assert [c.name for c in parsed.calls] == ["a", "b"]


@pytest.mark.parametrize("text", ["All done: the book is returned.", "{not json, just braces}", ""])
def test_plain_text_is_a_message(text: str) -> None:
    parsed = parse_action(text)
    assert parsed.is_message and parsed.text == text.strip()


@pytest.mark.parametrize(("action", "says"), [
    ('<tool_call>{"name": "a", "arguments": {</tool_call>', "tool call 1 is not valid JSON"),
    ('<tool_call>{"name": "a", "arguments": {}}', "not closed"),
    ({"arguments": {}}, 'no "name"'),
    ({"name": "a", "arguments": "[1, 2"}, "arguments of a are not valid JSON"),
    ({"name": "a", "arguments": [1, 2]}, "must be a JSON object"),
    ({"role": "assistant", "tool_calls": "x"}, "tool_calls must be a list"),
    (42, "got int"),
])
def test_malformed_actions_are_values_that_say_why(action: object, says: str) -> None:
    parsed = parse_action(action)
    assert parsed.error is not None and says in parsed.error and not parsed.calls


def test_rendered_calls_parse_back() -> None:
    assert parse_text(render_call(CALL)).calls == [CALL]
