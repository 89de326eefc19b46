"""SFT export: the two layouts, and which records are dropped for which reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
from envfoundry_client.sft import export, read_jsonl, well_formed

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look up.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def tc(call_id: str, name: str, arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def record(messages: list[dict[str, Any]], reward: float | None = 1.0, finish: str = "stop") -> dict[str, Any]:
    return {"scenario_id": "s", "env_id": "e", "sample": 0, "tools": TOOLS, "messages": messages, "reward": reward,
            "finish_reason": finish}


GOOD: list[dict[str, Any]] = [
    {"role": "system", "content": "You run a desk."},
    {"role": "user", "content": "Do it."},
    {"role": "assistant", "content": None, "tool_calls": [tc("c1", "lookup", '{"id": "A"}')]},
    {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": '{"success": true}'},
    {"role": "assistant", "content": "Two more.", "tool_calls": [tc("c2", "lookup"), tc("c3", "lookup", '{"x": 1}')]},
    {"role": "tool", "tool_call_id": "c2", "name": "lookup", "content": "r2"},
    {"role": "tool", "tool_call_id": "c3", "name": "lookup", "content": "r3"},
    {"role": "assistant", "content": "Done."},
    {"role": "user", "content": "Thanks, bye. ###STOP###"},  # a simulated user's closing words: trimmed
]


def test_openai_layout_keeps_tools_and_tool_calls() -> None:
    examples, report = export([record(GOOD)], "openai")
    assert report.kept == 1 and not report.dropped
    assert examples == [{"tools": TOOLS, "messages": [
        {"role": "system", "content": "You run a desk."},
        {"role": "user", "content": "Do it."},
        {"role": "assistant", "content": None, "tool_calls": [tc("c1", "lookup", '{"id": "A"}')]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"success": true}'},
        {"role": "assistant", "content": "Two more.", "tool_calls": [tc("c2", "lookup"), tc("c3", "lookup", '{"x": 1}')]},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        {"role": "tool", "tool_call_id": "c3", "content": "r3"},
        {"role": "assistant", "content": "Done."},
    ]}]


def test_sharegpt_layout_for_llamafactory() -> None:
    examples, _ = export([record(GOOD)], "sharegpt")
    assert examples == [{
        "system": "You run a desk.",
        "tools": json.dumps([t["function"] for t in TOOLS]),
        "conversations": [
            {"from": "human", "value": "Do it."},
            {"from": "function_call", "value": '{"name": "lookup", "arguments": {"id": "A"}}'},
            {"from": "observation", "value": '{"success": true}'},
            {"from": "function_call",
             "value": '[{"name": "lookup", "arguments": {}}, {"name": "lookup", "arguments": {"x": 1}}]'},
            {"from": "observation", "value": "r2\nr3"},
            {"from": "gpt", "value": "Done."},
        ]}]


BAD: list[tuple[str, dict[str, Any]]] = [
    ("reward_below_minimum", record(GOOD, reward=0.5)),
    ("reward_below_minimum", record(GOOD, reward=None)),
    ("episode_failed", record(GOOD, finish="llm_error")),
    ("not_a_rollout_record", {"scenario_id": "s"}),
    ("unparsable_assistant_turn", record(GOOD[:2] + [{"role": "assistant", "content": None,
                                                       "tool_calls": [tc("c1", "lookup", "{broken")]}])),
    ("unparsable_assistant_turn", record(GOOD[:2] + [{"role": "assistant",
                                                       "content": '<tool_call>{"name": </tool_call>'}])),
    ("tool_call_left_in_text", record(GOOD[:2] + [{"role": "assistant", "content":
                                                    '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'}])),
    ("unanswered_tool_call", record(GOOD[:3] + [{"role": "assistant", "content": "Done."}])),
    ("unanswered_tool_call", record(GOOD[:3])),
    ("tool_message_without_call", record(GOOD[:2] + [GOOD[3], {"role": "assistant", "content": "Done."}])),
    ("not_ended_by_assistant", record(GOOD[:4])),
    ("not_ended_by_assistant", record(GOOD[:2])),
]


@pytest.mark.parametrize(("reason", "bad"), BAD)
def test_drops_say_why(reason: str, bad: dict[str, Any]) -> None:
    examples, report = export([bad, record(GOOD)], "openai", min_reward=0.9)
    assert report.kept == 1 and dict(report.dropped) == {reason: 1} and len(examples) == 1


def test_report_lines_count_each_reason() -> None:
    _, report = export([r for _, r in BAD] + [record(GOOD)], "sharegpt", min_reward=0.9)
    assert report.lines() == [
        "kept 1, dropped 12", "  dropped 1: episode_failed", "  dropped 1: not_a_rollout_record",
        "  dropped 2: not_ended_by_assistant", "  dropped 2: reward_below_minimum",
        "  dropped 1: tool_call_left_in_text", "  dropped 1: tool_message_without_call",
        "  dropped 2: unanswered_tool_call", "  dropped 2: unparsable_assistant_turn"]


def test_lines_that_are_not_json_are_dropped_not_fatal() -> None:
    records = read_jsonl(json.dumps(record(GOOD)) + "\n{oops\n\n")
    _, report = export(records, "openai")
    assert report.kept == 1 and dict(report.dropped) == {"not_a_rollout_record": 1}


def test_well_formed_trims_the_closing_user_turn_only() -> None:
    assert well_formed(GOOD)[-1] == {"role": "assistant", "content": "Done."}
