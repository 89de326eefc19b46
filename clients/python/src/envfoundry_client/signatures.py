"""Python functions whose signature and Google-style docstring say what a tool's JSON Schema says.

Trainers that take Python methods as tools (TRL's ``environment_factory``) rebuild each tool's
schema from the method's type hints and docstring (``transformers.utils.get_json_schema``). The
functions made here give back the service's schema that way: the same names, types, required
parameters and descriptions. JSON Schema maps onto hints as ``string`` to ``str``, ``integer`` to
``int``, ``number`` to ``float``, ``boolean`` to ``bool``, ``null`` to ``None``, ``array`` to
``list[...]``, ``object`` to ``dict``, ``enum`` to ``Literal[...]`` and type lists or ``anyOf``
to unions; what has no hint (a schema without a type) becomes ``Any``. Item and property schemas
nested inside arrays and objects are sent to the model by the trainer only as far as the hints
carry them; the service checks the full schema on every call.

No code is generated from text: each function is one closure with ``__signature__``,
``__annotations__`` and ``__doc__`` set, and a name the caller has checked is a plain identifier.
"""

from __future__ import annotations

import inspect
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


def tool_function(tool: JSON, forward: Callable[[Any, str, JSON], Any]) -> Callable[..., Any]:
    """A method ``name(self, <the tool's parameters>)`` that calls ``forward(self, name, arguments)``.

    Required parameters come first and have no default; the others default to the schema's
    ``default``, or to None, which is not sent (the service applies its own default then).

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
    sent_when_none = {p for p in ordered if p in required or "default" in properties[p]}
    signature = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=hints[p],
                             default=inspect.Parameter.empty if p in required else properties[p].get("default"))
           for p in ordered],
        return_annotation=str)

    def method(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        this = bound.arguments.pop("self")
        arguments = {k: v for k, v in bound.arguments.items() if v is not None or k in sent_when_none}
        return forward(this, name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = {**hints, "return": str}
    description = function.get("description") or name.replace("_", " ")
    method.__doc__ = docstring(description, [(p, properties[p].get("description") or p) for p in ordered])
    return method
