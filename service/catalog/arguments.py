"""Tool arguments checked against their JSON Schemas, in time proportional to their size.

Argument validation runs on the event loop, so its cost must not depend on
anything a client or an environment author can blow up: arguments are bounded
(nesting depth, number of values) before any schema is applied, only the first
error is built, and ``enum`` is a set lookup instead of a scan of every allowed
value (a ``Literal`` of 50,000 values costs the same as one of 5).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from itertools import islice
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators

from service.catalog.quickcheck import compile_schema, scalar_key

MAX_DEPTH = 32
MAX_VALUES = 10_000
MAX_MESSAGE = 1000
NAMED_UNEXPECTED = 5  # unexpected argument names listed in one message


class ArgumentLimit(Exception):
    """Arguments over a named bound; ``limit`` names it and ``value`` gives it."""

    def __init__(self, message: str, limit: str, value: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value


class EnumSet(list[Any]):
    """An ``enum`` list that also holds its scalar members as a set, built once per schema."""

    def __init__(self, values: list[Any]) -> None:
        super().__init__(values)
        self.scalars = {k for k in map(scalar_key, values) if k is not None}
        self.containers = [v for v in values if scalar_key(v) is None]


def _fast_enum(validator: Any, enums: list[Any], instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    allowed = enums if isinstance(enums, EnumSet) else EnumSet(enums)
    key = scalar_key(instance)
    if key is not None and key in allowed.scalars:
        return
    if key is None and any(validator.is_valid(instance, {"const": each}) for each in allowed.containers):
        return
    yield ValidationError(f"{_short(instance)} is not one of the {len(enums)} allowed values")


FastValidator = validators.extend(Draft202012Validator, {"enum": _fast_enum})


def _with_enum_sets(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: EnumSet(v) if k == "enum" and isinstance(v, list) else _with_enum_sets(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_with_enum_sets(v) for v in schema]
    return schema


class ArgumentChecker:
    """One per tool schema; keeps the compiled validator and its enum sets."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.validator = FastValidator(_with_enum_sets(schema))
        self.accepts = compile_schema(schema)  # (told without the validator: see ``quickcheck``)
        properties = schema.get("properties")
        # Only a closed schema (no **kwargs) makes a name unexpected.
        self.known: list[str] | None = None
        if schema.get("additionalProperties") is False and isinstance(properties, dict):
            self.known = sorted(properties)

    def problem(self, arguments: dict[str, Any]) -> str | None:
        """What is wrong with ``arguments``, or None. A misspelt name is reported with what it is
        probably meant to be, beside the first other problem (often the same name, missing).

        Raises:
            ArgumentLimit: the arguments are nested too deeply or hold too many values.
        """
        _bounded(arguments)
        if self.accepts is not None and self.accepts(arguments):
            return None
        unexpected = self._unexpected(arguments)
        # A few errors at most are built: the top-level unexpected-name one is said better above.
        errors = islice(self.validator.iter_errors(arguments), 3)
        error = next((e for e in errors if not (unexpected and e.validator == "additionalProperties"
                                                  and not e.absolute_path)), None)
        if error is None and not unexpected:
            return None
        parts = [unexpected] if unexpected else []
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            parts.append(f"argument '{where}': {error.message}" if where else error.message)
        message = "; ".join(parts)
        return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "..."

    def _unexpected(self, arguments: dict[str, Any]) -> str | None:
        if self.known is None:
            return None
        names = [k for k in arguments if k not in self.known]
        if not names:
            return None
        said = []
        for name in names[:NAMED_UNEXPECTED]:
            near = difflib.get_close_matches(name, self.known, n=1, cutoff=0.5) if len(name) <= 100 else []
            said.append(f"'{_clip(name)}' (did you mean '{near[0]}'?)" if near else f"'{_clip(name)}'")
        more = f" and {len(names) - NAMED_UNEXPECTED} more" if len(names) > NAMED_UNEXPECTED else ""
        expected = ", ".join(f"'{k}'" for k in self.known) or "none"
        return (f"unexpected argument{'s' if len(names) > 1 else ''} {', '.join(said)}{more}; "
                f"the tool takes {expected}")


def _bounded(arguments: Any) -> None:
    seen = 1
    stack: list[tuple[Any, int]] = [(arguments, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                raise ArgumentLimit(f"arguments are nested more than {MAX_DEPTH} levels deep", "max_argument_depth",
                                    MAX_DEPTH)
            children = value.values() if isinstance(value, dict) else value
            seen += len(children)
            # counted before anything is pushed, so a list of a million values costs one comparison
            if seen > MAX_VALUES:
                raise ArgumentLimit(f"arguments hold more than {MAX_VALUES} values", "max_argument_values",
                                    MAX_VALUES)
            stack.extend((child, depth + 1) for child in children)


def _clip(name: str) -> str:
    return name if len(name) <= 80 else name[:80] + "..."


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:80] + "..."
