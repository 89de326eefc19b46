"""Extraction of fenced JSON and Python from answers, and the typed field readers."""

from __future__ import annotations

import pytest

from synthesis.errors import ParseError
from synthesis.parsing import parse as p


def test_json_answer_reads_the_single_json_block_and_ignores_prose() -> None:
    answer = 'Here you go:\n\n```json\n{"a": [1, 2]}\n```\n\nLet me know if you need more.'
    assert p.json_answer(answer) == {"a": [1, 2]}


def test_json_answer_accepts_a_bare_json_answer() -> None:
    assert p.json_answer('  {"a": 1}\n') == {"a": 1}


def test_json_answer_accepts_an_indented_fence_without_language() -> None:
    assert p.json_answer('  ```\n  {"a": 1}\n  ```') == {"a": 1}


def test_json_answer_rejects_two_blocks() -> None:
    with pytest.raises(ParseError, match="2 JSON blocks"):
        p.json_answer('```json\n{"a": 1}\n```\nor\n```json\n{"a": 2}\n```')


def test_json_answer_reports_a_cut_off_block() -> None:
    with pytest.raises(ParseError, match="not closed.*cut off"):
        p.json_answer('```json\n{"decision": "keep", "reason": "Ord')


def test_json_answer_reports_the_position_of_invalid_json() -> None:
    with pytest.raises(ParseError, match=r"invalid JSON at line 1 column \d+"):
        p.json_answer('```json\n{"a": 1,}\n```')


def test_json_answer_without_any_json_says_so() -> None:
    with pytest.raises(ParseError, match="the answer holds no ```json block"):
        p.json_answer("Sure! The environment is about parking permits.")


def test_python_answer_parses_and_dedents_an_indented_method() -> None:
    source, tree = p.python_answer("```python\n    def f(self):\n        return 1\n```")
    assert source.startswith("def f(self):") and tree.body


def test_python_answer_without_a_block_is_an_error() -> None:
    with pytest.raises(ParseError, match="no ```python block"):
        p.python_answer("def f(): pass")


def test_python_answer_reports_cut_off_code() -> None:
    with pytest.raises(ParseError, match="not closed"):
        p.python_answer("```python\ndef f(self):\n    return {")


def test_python_answer_reports_a_syntax_error_with_its_line() -> None:
    with pytest.raises(ParseError, match="line 2: invalid syntax$"):
        p.python_answer("```python\nx = 1\ny = = 2\nz = 3\n```")


def test_python_answer_rejects_two_code_blocks() -> None:
    with pytest.raises(ParseError, match="exactly one"):
        p.python_answer("```python\nx = 1\n```\n```python\ny = 2\n```")


def test_field_readers_name_the_field_and_the_problem() -> None:
    data = {"n": 11, "s": "  hi  ", "c": "Keep", "l": "x", "multi": "a\nb"}
    with pytest.raises(ParseError, match=r"answer\.n must be an integer from 1 to 10, not 11"):
        p.integer(data, "n", "answer", 1, 10)
    assert p.text(data, "s", "answer") == "hi"
    with pytest.raises(ParseError, match="single line"):
        p.text(data, "multi", "answer", single_line=True)
    assert p.choice(data, "c", "answer", ("keep", "drop")) == "keep"
    with pytest.raises(ParseError, match="must be a JSON array, not a string"):
        p.array(data, "l", "answer")
    with pytest.raises(ParseError, match="must be an integer"):
        p.integer({"n": True}, "n", "answer", 0, 10)  # a bool is not an integer here


def test_identifiers_are_checked_by_style() -> None:
    assert p.identifier("task_id", "x") == "task_id"
    assert p.identifier("BookInfo", "x", style="camel") == "BookInfo"
    for bad in ("Task", "task-id", "1task", "", None, "a" * 65):
        with pytest.raises(ParseError):
            p.identifier(bad, "x")


@pytest.mark.parametrize(("line", "expected"), [
    ("- Attributes: task_id, status", "Attributes: task_id, status"),
    ("* status must be open", "status must be open"),
    ("3. Ids are unique", "Ids are unique"),
    ("task_id is unique", "task_id is unique"),
    ("- - double", "- double"),
    ("-5 is not allowed", "-5 is not allowed"),
])  # fmt: skip
def test_strip_bullet_removes_one_list_marker_and_never_name_characters(line: str, expected: str) -> None:
    # EnvScaler's str.strip("- Attributes: ") turned task_id into ask_id.
    assert p.strip_bullet(line) == expected
