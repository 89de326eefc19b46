"""Static checks of a generated ``init_config`` against the class it will initialise.

Nothing runs here: the class source is read with ``ast`` and the defaults come
from the sandbox as a JSON view. The checks are those a reviewer would make:
every key is an attribute the class has; values have the types ``__init__``
annotates (record types included: required fields present, no unknown ones);
a record stored under a key carries that key in its id field; and a field
named like another container's id field refers to an entry that exists.
The id conventions are heuristics (a field ``id``, ``*_id``, ``*_code`` or
``sku`` first in a record type is its id); the reference-solution replay is
the real test of a state.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

MAX_PROBLEMS = 8
_STR, _INT, _FLOAT, _BOOL = {"str"}, {"int"}, {"float"}, {"bool"}
_DICTS = {"dict", "Dict", "Mapping", "MutableMapping", "DefaultDict", "defaultdict", "OrderedDict"}
_LISTS = {"list", "List", "Sequence", "Set", "set", "FrozenSet", "frozenset", "Tuple", "tuple", "Iterable", "deque"}


@dataclass
class StateSchema:
    defaults: dict[str, Any]  # the JSON view of the state __init__ builds from {}
    annotations: dict[str, ast.expr] = field(default_factory=dict)
    records: dict[str, list[tuple[str, ast.expr, bool]]] = field(default_factory=dict)  # TypedDict fields

    def record_id(self, name: str) -> str | None:
        fields = self.records.get(name) or []
        if fields and _is_id(fields[0][0]):
            return fields[0][0]
        return None


def _is_id(name: str) -> bool:
    return name == "id" or name.endswith(("_id", "_code")) or name == "sku"


def schema_of(code: str, class_name: str, defaults: dict[str, Any]) -> StateSchema:
    schema = StateSchema(defaults)
    tree = ast.parse(code)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(_name(b) == "TypedDict" for b in node.bases):
            total = not any(k.arg == "total" and isinstance(k.value, ast.Constant) and k.value.value is False
                            for k in node.keywords)  # fmt: skip
            schema.records[node.name] = [
                (s.target.id, *_required(s.annotation, total))
                for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            ]  # fmt: skip
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            for stmt in ast.walk(init) if init else []:
                if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Attribute):
                    continue
                if isinstance(stmt.target.value, ast.Name) and stmt.target.value.id == "self":
                    schema.annotations[stmt.target.attr] = stmt.annotation
    return schema


def problems(config: dict[str, Any], schema: StateSchema) -> list[str]:
    """Everything wrong with ``config``, most important first; empty when it looks consistent."""
    known = ", ".join(sorted(k for k in schema.defaults if not k.startswith("_")))
    out = [f"init_config sets '{key}', which the class does not have (its attributes: {known})"
           for key in config if key not in schema.defaults]  # fmt: skip
    for key, value in config.items():
        if key not in schema.defaults:
            continue
        annotation = schema.annotations.get(key)
        if annotation is not None:
            _check(value, annotation, key, schema, out)
        elif schema.defaults[key] is not None and _coarse(value) != _coarse(schema.defaults[key]):
            out.append(f"{key} must be {_coarse(schema.defaults[key])} like its default, not {_coarse(value)}")
    _references(config, schema, out)
    return out[:MAX_PROBLEMS]


def _check(value: Any, node: ast.expr, where: str, schema: StateSchema, out: list[str]) -> None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        _union(value, [node.left, node.right], where, schema, out)
        return
    base = _name(node.value if isinstance(node, ast.Subscript) else node)
    args = _args(node)
    if base in ("Optional",):
        _union(value, [*args, ast.Constant(None)], where, schema, out)
    elif base == "Union":
        _union(value, args, where, schema, out)
    elif base == "Literal":
        allowed = [a.value for a in args if isinstance(a, ast.Constant)]
        if value not in allowed:
            out.append(f"{where} must be one of {json.dumps(allowed)}, not {json.dumps(value)}")
    elif base in ("Required", "NotRequired", "Annotated", "ReadOnly") and args:
        _check(value, args[0], where, schema, out)
    elif base is not None and base in schema.records:
        _record(value, base, where, schema, out)
    else:
        expected = _expected(base, node)
        if expected is not None and not _is(value, expected):
            out.append(f"{where} must be {expected}, not {_kind(value)} {json.dumps(value)[:60]}")
        elif expected == "an object" and len(args) == 2:
            for k, v in value.items():
                _check(v, args[1], f"{where}[{k!r}]", schema, out)
        elif expected == "an array" and len(args) == 1:
            for i, v in enumerate(value):
                _check(v, args[0], f"{where}[{i}]", schema, out)


def _union(value: Any, options: list[ast.expr], where: str, schema: StateSchema, out: list[str]) -> None:
    attempts: list[list[str]] = []
    for option in options:
        found: list[str] = []
        _check(value, option, where, schema, found)
        if not found:
            return
        attempts.append(found)
    if attempts:
        closest: list[str] = min(attempts, key=len)
        out.extend(closest)


def _record(value: Any, name: str, where: str, schema: StateSchema, out: list[str]) -> None:
    if not isinstance(value, dict):
        out.append(f"{where} must be a {name} object, not {_kind(value)}")
        return
    fields = schema.records[name]
    known = {f for f, _, _ in fields}
    for field_name, annotation, required in fields:
        if field_name in value:
            _check(value[field_name], annotation, f"{where}.{field_name}", schema, out)
        elif required:
            out.append(f"{where} lacks the field '{field_name}' that {name} requires")
    for extra in sorted(set(value) - known):
        out.append(f"{where} has the field '{extra}', which {name} does not define")


def _references(config: dict[str, Any], schema: StateSchema, out: list[str]) -> None:
    tables: dict[str, tuple[str, dict[str, Any]]] = {}  # id field -> (container, entries)
    for key, value in config.items():
        record = _record_type(schema.annotations.get(key), schema)
        id_field = schema.record_id(record) if record else None
        if id_field and isinstance(value, dict):
            tables[id_field] = (key, value)
            for entry_key, entry in value.items():
                if isinstance(entry, dict) and id_field in entry and entry[id_field] != entry_key:
                    out.append(f"{key}[{entry_key!r}] is stored under '{entry_key}' but its {id_field} is {json.dumps(entry[id_field])}")
    for key, value in config.items():
        entries = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            for id_field, (container, table) in tables.items():
                if container == key or id_field not in entry:
                    continue
                refs = entry[id_field] if isinstance(entry[id_field], list) else [entry[id_field]]
                for ref in refs:
                    if ref is not None and ref not in table:
                        out.append(f"{key}: {id_field} {json.dumps(ref)} refers to no entry of {container}")


def _record_type(node: ast.expr | None, schema: StateSchema) -> str | None:
    """``Dict[str, Record]`` -> ``Record`` when Record is a TypedDict."""
    if isinstance(node, ast.Subscript) and _name(node.value) in _DICTS:
        args = _args(node)
        if len(args) == 2 and _name(args[1]) in schema.records:
            return _name(args[1])
    return None


def _required(annotation: ast.expr, total: bool) -> tuple[ast.expr, bool]:
    if isinstance(annotation, ast.Subscript) and _name(annotation.value) in ("NotRequired", "Required"):
        return annotation, _name(annotation.value) == "Required"
    return annotation, total


def _expected(base: str | None, node: ast.expr) -> str | None:
    if base in _STR:
        return "a string"
    if base in _BOOL:
        return "a boolean"
    if base in _INT:
        return "an integer"
    if base in _FLOAT:
        return "a number"
    if base in _DICTS:
        return "an object"
    if base in _LISTS:
        return "an array"
    if base == "None" or (isinstance(node, ast.Constant) and node.value is None):
        return "null"
    return None  # Any, classes, datetimes: not checked statically


def _is(value: Any, expected: str) -> bool:
    return {
        "a string": isinstance(value, str), "a boolean": isinstance(value, bool),
        "an integer": isinstance(value, int) and not isinstance(value, bool),
        "a number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "an object": isinstance(value, dict), "an array": isinstance(value, list), "null": value is None,
    }[expected]  # fmt: skip


def _kind(value: Any) -> str:
    for expected in ("a boolean", "an integer", "a number", "a string", "an object", "an array", "null"):
        if _is(value, expected):
            return expected
    return type(value).__name__


def _coarse(value: Any) -> str:
    kind = _kind(value)
    return "a number" if kind == "an integer" else kind


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _args(node: ast.expr) -> list[ast.expr]:
    if not isinstance(node, ast.Subscript):
        return []
    return list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
