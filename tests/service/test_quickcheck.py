"""The compiled argument check says "valid" exactly where the general validator does."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from service.catalog.arguments import ArgumentChecker
from service.catalog.quickcheck import compile_schema

NAMES = st.sampled_from(["a", "b", "c"])
TYPES = st.sampled_from(["string", "integer", "number", "boolean", "object", "array", "null"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from([0.0, 1.0, 1.5, -2.0]),
                    st.sampled_from(["", "a", "x"]))
ENUMS = st.lists(SCALARS, min_size=1, max_size=4)
NOTES = st.fixed_dictionaries({}, optional={"description": st.text(max_size=5), "default": SCALARS,
                                            "format": st.sampled_from(["date", "email", "uuid"])})


def _schema(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.builds(lambda notes, rest: {**notes, **rest}, NOTES, st.fixed_dictionaries({}, optional={
        "type": TYPES | st.lists(TYPES, min_size=1, max_size=3),
        "enum": ENUMS,
        "properties": st.dictionaries(NAMES, inner, max_size=3),
        "required": st.lists(NAMES, max_size=3, unique=True),
        "additionalProperties": inner,
        "items": inner,
        "anyOf": st.lists(inner, min_size=1, max_size=3),
        "allOf": st.lists(inner, min_size=1, max_size=2),
    }))


# Where JSON Schema's types are easy to get wrong (1.0 is an integer, true is no number), checked
# against every generated schema beside the generated values.
TRICKY = [1.0, 1, True, False, 0, 0.5, None, "", "a", [], {}, [1.0, True], {"a": 1.0}, {"a": None, "b": "x"},
          {"c": [1]}, {"a": True, "b": 2, "c": "x"}]
SCHEMAS = st.recursive(st.booleans() | st.builds(dict, NOTES), _schema, max_leaves=10)
VALUES = st.recursive(SCALARS | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=2),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
                      max_leaves=8)


@settings(max_examples=600, deadline=None)
@given(SCHEMAS, st.lists(VALUES, min_size=1, max_size=6))
def test_the_compiled_check_agrees_with_the_validator(schema: Any, values: list[Any]) -> None:
    check = compile_schema(schema)
    assert check is not None, schema
    validator = Draft202012Validator(schema)
    for value in [*values, *TRICKY]:
        assert check(value) == validator.is_valid(value), (schema, value)


@settings(max_examples=200, deadline=None)
@given(st.lists(VALUES, min_size=1, max_size=4), st.lists(VALUES, min_size=1, max_size=6))
def test_an_enum_of_objects_is_left_to_the_validator(allowed: list[Any], values: list[Any]) -> None:
    schema = {"enum": allowed}
    check = compile_schema(schema)
    assert check is not None
    validator = Draft202012Validator(schema)
    for value in [*values, *allowed]:
        if check(value):
            assert validator.is_valid(value), (schema, value)
        elif not isinstance(value, dict | list):
            assert not validator.is_valid(value), (schema, value)


def test_schemas_with_other_keywords_are_not_compiled() -> None:
    for schema in ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}},
                   {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
                   {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
                   {"oneOf": [{"type": "string"}, {"type": "null"}]},
                   {"type": "decimal"}, {"type": []}, {"anyOf": []}, {"items": [{"type": "string"}]}):
        assert compile_schema(schema) is None, schema


def test_arguments_are_judged_as_before_either_way() -> None:
    """The checker gives the same verdicts and words with the compiled check as without it."""
    schema = {"type": "object", "additionalProperties": False, "required": ["user_id"],
              "properties": {"user_id": {"type": "string"}, "limit": {"type": "integer"},
                             "status": {"anyOf": [{"type": "string", "enum": ["open", "closed"]}, {"type": "null"}]}}}
    quick, plain = ArgumentChecker(schema), ArgumentChecker(schema)
    plain.accepts = None
    assert quick.accepts is not None
    for arguments in ({"user_id": "U1"}, {"user_id": "U1", "limit": 3.0, "status": None}, {"user_id": 5},
                      {"user_id": "U1", "limit": True}, {"user_id": "U1", "status": "gone"}, {"limit": 2},
                      {"user_id": "U1", "usr": 1}, {"user_id": "U1", "limit": 2.5}):
        assert quick.problem(arguments) == plain.problem(arguments), arguments
    assert quick.problem({"user_id": "U1", "limit": 3}) is None
    assert "is not of type 'string'" in (quick.problem({"user_id": 5}) or "")
