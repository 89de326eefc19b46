"""The arguments a tool's schema certainly accepts, told without the general validator.

Every tool call checks its arguments against the tool's JSON Schema on the event loop, and the
general validator (``jsonschema``) costs more there than anything else in the call but the
sandbox: it resolves references, builds error iterators and descends through scopes even when
the arguments are fine. Tool schemas are nearly always a closed object of a few typed
properties, so such a schema is compiled here once into a plain function that answers whether
the arguments are valid. It says yes only where the general validator would find no error;
anything it cannot tell (a keyword outside the few it knows, an ``enum`` of objects, a value
that fails) goes to the general validator, which then also words the problem.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

# Keywords that never make an instance invalid (annotations; ``format`` too, as the validator is
# built without a format checker).
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
                         "writeOnly", "format", "$schema", "$id"})
KNOWN = ANNOTATIONS | {"type", "properties", "required", "additionalProperties", "enum", "items", "anyOf", "allOf"}


def _is_integer(value: Any) -> bool:
    kind = type(value)
    return kind is int or kind is float and value.is_integer()


TYPES: dict[str, Check] = {  # as the 2020-12 type checker tells them (true is no number)
    "string": lambda v: type(v) is str,
    "integer": _is_integer,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "null": lambda v: v is None,
}


def compile_schema(schema: Any) -> Check | None:
    """A function that is True only for instances ``schema`` accepts (False: not told); None when
    the schema uses what this module does not know."""
    if schema is True:
        return lambda _: True
    if schema is False:
        return lambda _: False
    if not isinstance(schema, dict) or not KNOWN.issuperset(schema):
        return None
    checks: list[Check] = []
    for keyword in ("type", "enum", "properties", "required", "additionalProperties", "items", "anyOf", "allOf"):
        if keyword in schema:
            check = KEYWORDS[keyword](schema[keyword], schema)
            if check is None:
                return None
            checks.append(check)
    if not checks:
        return lambda _: True
    if len(checks) == 1:
        return checks[0]
    return lambda value: all(check(value) for check in checks)


def _type(named: Any, _: dict[str, Any]) -> Check | None:
    names = [named] if isinstance(named, str) else named
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n in TYPES for n in names):
        return None
    tests = [TYPES[n] for n in names]
    if len(tests) == 1:
        return tests[0]
    return lambda value: any(test(value) for test in tests)


def _enum(values: Any, _: dict[str, Any]) -> Check | None:
    """Scalars only: JSON Schema equality of containers is left to the validator."""
    if not isinstance(values, list):
        return None
    keys = set()
    for value in values:
        key = scalar_key(value)
        if key is not None:
            keys.add(key)
    return lambda value: scalar_key(value) in keys


def scalar_key(value: Any) -> tuple[str, Any] | None:
    """A hashable stand-in with JSON Schema equality (true is not 1; 1 is 1.0), or None for containers."""
    if value is None:
        return ("null", None)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    return None


def _properties(named: Any, _: dict[str, Any]) -> Check | None:
    if not isinstance(named, dict):
        return None
    compiled: dict[str, Check] = {}
    for name, sub in named.items():
        check = compile_schema(sub)
        if check is None:
            return None
        compiled[name] = check

    def properties(value: Any) -> bool:
        if type(value) is not dict:
            return True
        for name, check in compiled.items():
            if name in value and not check(value[name]):
                return False
        return True

    return properties


def _required(names: Any, _: dict[str, Any]) -> Check | None:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return lambda value: type(value) is not dict or all(name in value for name in names)


def _additional(sub: Any, schema: dict[str, Any]) -> Check | None:
    named = schema.get("properties", {})
    if not isinstance(named, dict):
        return None
    check = compile_schema(sub)
    if check is None:
        return None
    known = frozenset(named)
    return lambda value: type(value) is not dict or all(check(v) for k, v in value.items() if k not in known)


def _items(sub: Any, _: dict[str, Any]) -> Check | None:
    check = compile_schema(sub)
    if check is None:
        return None
    return lambda value: type(value) is not list or all(check(item) for item in value)


def _any_of(subs: Any, _: dict[str, Any]) -> Check | None:
    """(``Optional[...]`` in a signature becomes ``anyOf`` with ``null``.)"""
    checks = _each(subs)
    return None if checks is None else lambda value: any(check(value) for check in checks)


def _all_of(subs: Any, _: dict[str, Any]) -> Check | None:
    checks = _each(subs)
    return None if checks is None else lambda value: all(check(value) for check in checks)


def _each(subs: Any) -> list[Check] | None:
    if not isinstance(subs, list) or not subs:
        return None
    checks = [compile_schema(sub) for sub in subs]
    return None if any(check is None for check in checks) else checks  # type: ignore[return-value]


KEYWORDS: dict[str, Callable[[Any, dict[str, Any]], Check | None]] = {
    "type": _type, "enum": _enum, "properties": _properties, "required": _required,
    "additionalProperties": _additional, "items": _items, "anyOf": _any_of, "allOf": _all_of,
}
