"""Python functions whose signature and Google-style docstring say what a tool's JSON Schema says.

Trainers that take Python methods as tools (TRL's ``environment_factory``) rebuild each tool's
schema from the method's type hints and docstring (``transformers.utils.get_json_schema``). The
functions made here give back the service's schema that way: the same names, types, required
parameters and descriptions. JSON Schema maps onto hints as ``string`` to ``str``, ``integer`` to
``int``, ``number`` to ``float``, ``boolean`` to ``bool``, ``null`` to ``None``, ``array`` to
``list[...]``, ``object`` to ``dict``, ``enum`` to ``Literal[...]`` and type lists or ``anyOf``
to unions; what has no hint (a schema without a type) becomes ``Any``. What hints cannot carry
(a default, the fields of objects inside arrays and objects) is written into the parameter's
description (see ``described``); the service checks the full schema on every call.

No code is generated from text: each function is one closure with ``__signature__``,
``__annotations__`` and ``__doc__`` set, and a name the caller has checked is a plain identifier.
"""

from __future__ import annotations

import inspect
import json
import keyword
from collections.abc import Callable
from types import GenericAlias
from typing import Any, Literal, Union

JSON = dict[str, Any]
SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "null": type(None)}


def plain_name(name: Any) -> bool:
    """A name a Python function or parameter can carry as it is (and a trainer does not hide)."""
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")


def annotation(schema: JSON) -> Any:
    """The type hint for one JSON Schema."""
    if "enum" in schema and schema["enum"]:
        return Literal[tuple(schema["enum"])]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return _union([annotation(part) for part in schema[key]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union([annotation({**schema, "type": one}) for one in kind])
    if kind == "array":
        items = schema.get("items")
        return GenericAlias(list, (annotation(items),)) if isinstance(items, dict) and items else list
    if kind == "object":
        return dict
    return SCALARS.get(kind, Any) if isinstance(kind, str) else Any


def _union(parts: list[Any]) -> Any:
    unique = list(dict.fromkeys(parts))
    return unique[0] if len(unique) == 1 else Union[tuple(unique)]  # noqa: UP007 (built from a list)


def docstring(description: str, parameters: list[tuple[str, str]]) -> str:
    """A Google-style docstring; each description on one line, as the trainers' parsers read it."""
    lines = [" ".join(description.split())]
    if parameters:
        lines += ["", "Args:"] + [f"    {name}: {' '.join(text.split())}" for name, text in parameters]
    return "\n".join(lines)


def described(schema: JSON, name: str) -> str:
    """A parameter's line in the docstring: the service's description (or the name), then what no
    type hint can carry, in words: the default, and the fields of the objects the parameter holds.

    A trainer that rebuilds the schema from the method (``get_json_schema``) thus renders the
    service's schema with three differences, which the model still reads in the text: no
    ``additionalProperties: false`` (the service refuses an unknown argument all the same, naming
    the one meant), no ``default`` keyword, and no ``properties`` inside items or objects.
    """
    text = " ".join((schema.get("description") or name).split())
    if "default" in schema:
        text += f" Default: {json.dumps(schema['default'])}."
    fields = _fields(schema)
    return f"{text} {fields}" if fields else text


def _fields(schema: JSON) -> str:
    items = schema.get("items")
    if schema.get("type") == "array" and isinstance(items, dict) and isinstance(items.get("properties"), dict):
        target, lead = items, "Each item is an object with"
    elif isinstance(schema.get("properties"), dict) and schema["properties"]:
        target, lead = schema, "An object with"
    else:
        return ""
    required = set(target.get("required") or [])
    parts = []
    for key, sub in target["properties"].items():
        kind = sub.get("type") if isinstance(sub, dict) else None
        kind = "/".join(kind) if isinstance(kind, list) else kind or "any"
        about = " ".join(str(sub.get("description") or "").split()) if isinstance(sub, dict) else ""
        parts.append(f"{key} ({kind}{', required' if key in required else ''}){' - ' + about if about else ''}")
    closed = "; no other fields" if target.get("additionalProperties") is False else ""
    return f"{lead} {', '.join(parts)}{closed}."


def tool_function(tool: JSON, forward: Callable[[Any, str, JSON], Any]) -> Callable[..., Any]:
    """A method ``name(self, <the tool's parameters>)`` that calls ``forward(self, name, arguments)``.

    Required parameters come first and have no default; the others default to the schema's
    ``default``, or to None. The signature only describes the tool: the method sends exactly the
    arguments it is given (the service applies its defaults and judges the rest).

    Raises:
        ValueError: the tool or one of its parameters has a name Python cannot carry.
    """
    function = tool.get("function", tool)
    name = function.get("name")
    if not plain_name(name):
        raise ValueError(f"tool {name!r} cannot be a Python method: its name is not a plain identifier")
    schema = function.get("parameters") or {}
    properties: dict[str, JSON] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    for parameter in properties:
        if not plain_name(parameter) or parameter == "self":
            raise ValueError(f"tool {name!r}: parameter {parameter!r} cannot be a Python parameter")
    ordered = [p for p in properties if p in required] + [p for p in properties if p not in required]
    hints = {p: annotation(properties[p]) for p in ordered}
    signature = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=hints[p],
                             default=inspect.Parameter.empty if p in required else properties[p].get("default"))
           for p in ordered],
        return_annotation=str)

    def method(this: Any, /, *args: Any, **kwargs: Any) -> Any:
        # The arguments go to the service as the caller wrote them: no binding against the signature
        # here, so a missing, misspelled or extra argument reaches the service, which records the
        # step and answers with its own hint ("unexpected argument 'loan' (did you mean
        # 'loan_id'?)"). Defaults are the service's to apply, so none are filled in.
        if len(args) > len(ordered):
            raise TypeError(f"{name}() takes {len(ordered)} positional arguments but {len(args)} were given")
        arguments: JSON = dict(zip(ordered, args, strict=False))
        for key, value in kwargs.items():
            if key in arguments:
                raise TypeError(f"{name}() got multiple values for argument {key!r}")
            arguments[key] = value
        return forward(this, name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = {**hints, "return": str}
    description = function.get("description") or name.replace("_", " ")
    method.__doc__ = docstring(description, [(p, described(properties[p], p)) for p in ordered])
    return method
