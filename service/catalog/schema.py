"""Extract OpenAI function-calling tool schemas from the source of a Python class.

The environment code is written by an LLM and must never run in the API process,
so everything here is static: the source is parsed with ``ast`` and read, never
imported or executed. Anything this module does not understand degrades to an
unconstrained schema (``{}``) instead of failing.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Schema = dict[str, Any]
_Function = ast.FunctionDef | ast.AsyncFunctionDef


MAX_DOC_TYPE = 200


class SchemaError(Exception):
    """The source does not parse, or does not define the requested class.

    ``reason`` is ``syntax_error``, ``missing_class`` or ``invalid_code``.
    """

    def __init__(self, message: str, reason: str = "syntax_error") -> None:
        super().__init__(message)
        self.reason = reason


# --- type names ------------------------------------------------------------

_NAMED: dict[str, Schema] = {
    "str": {"type": "string"}, "int": {"type": "integer"}, "float": {"type": "number"},
    "bool": {"type": "boolean"}, "None": {"type": "null"}, "NoneType": {"type": "null"},
    "datetime": {"type": "string", "format": "date-time"}, "date": {"type": "string", "format": "date"},
}  # fmt: skip
_OBJECTS = {"dict", "Dict", "Mapping", "MutableMapping", "OrderedDict", "DefaultDict", "defaultdict"}
_ARRAYS = {
    "list", "List", "Sequence", "MutableSequence", "Iterable", "Iterator", "Collection",
    "set", "Set", "frozenset", "FrozenSet", "AbstractSet", "MutableSet", "deque", "Deque",
}  # fmt: skip
_TUPLES = {"tuple", "Tuple"}
# Wrappers whose first argument is the real type (TypedDict requiredness is read separately).
_WRAPPERS = {"Annotated", "Required", "NotRequired", "ReadOnly", "Final", "ClassVar"}
_ENUM_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}
# Decorators that turn a ``def`` into something an agent cannot call.
_NOT_TOOLS = {"property", "cached_property", "setter", "getter", "deleter", "abstractproperty", "overload"}


@dataclass
class _TypedDict:
    fields: list[tuple[str, ast.expr]]
    total: bool
    bases: list[str]


@dataclass
class _Module:
    """The module-level names that annotations may refer to."""

    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    typed_dicts: dict[str, _TypedDict] = field(default_factory=dict)
    enums: dict[str, ast.ClassDef] = field(default_factory=dict)
    aliases: dict[str, ast.expr] = field(default_factory=dict)
    # Schema nodes left to build: aliases or TypedDicts that reuse each other can
    # grow the output exponentially, and the API process must not hang on them.
    budget: int = 20_000


# --- public API ------------------------------------------------------------


def extract_tools(source: str, class_name: str) -> list[dict[str, Any]]:
    """Return one OpenAI tool per public method of ``class_name``, in source order.

    Raises:
        SchemaError: the source does not parse, or defines no top-level ``class_name``.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        where = f" at line {exc.lineno}" if exc.lineno else ""  # null bytes have no line
        raise SchemaError(f"syntax error{where}: {exc.msg}") from exc
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes (some 3.11s), absurd nesting
        raise SchemaError(f"source cannot be parsed: {exc}") from exc
    module = _scan(tree)
    if class_name not in module.classes:
        raise SchemaError(f"class {class_name!r} is not defined", "missing_class")
    try:
        return [_tool(fn, module) for fn in _public_methods(class_name, module)]
    except RecursionError as exc:
        raise SchemaError("class hierarchy or annotations are nested too deeply", "invalid_code") from exc


# --- module scan -----------------------------------------------------------


def _final_name(node: ast.expr) -> str | None:
    """``List`` for ``List``, ``typing.List``, ``List[int]`` and ``lru_cache()``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _final_name(node.value)
    if isinstance(node, ast.Call):
        return _final_name(node.func)
    return None


def _scan(tree: ast.Module) -> _Module:
    module = _Module()
    # Source order suffices: a base must be defined before a class that uses it.
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef):
            module.classes[stmt.name] = stmt
            bases = [name for name in map(_final_name, stmt.bases) if name]
            if any(b == "TypedDict" or b in module.typed_dicts for b in bases):
                module.typed_dicts[stmt.name] = _class_typed_dict(stmt, bases)
            elif any(b in _ENUM_BASES or b in module.enums for b in bases):
                module.enums[stmt.name] = stmt
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                functional = _functional_typed_dict(stmt.value)
                if functional is not None:
                    module.typed_dicts[target.id] = functional
                elif isinstance(stmt.value, (ast.Subscript, ast.BinOp, ast.Name, ast.Attribute)):
                    module.aliases[target.id] = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if stmt.value is not None and _final_name(stmt.annotation) == "TypeAlias":
                module.aliases[stmt.target.id] = stmt.value
    return module


def _total(keywords: list[ast.keyword]) -> bool:
    return not any(k.arg == "total" and isinstance(k.value, ast.Constant) and not k.value.value for k in keywords)


def _class_typed_dict(node: ast.ClassDef, bases: list[str]) -> _TypedDict:
    fields = [
        (stmt.target.id, stmt.annotation)
        for stmt in node.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    ]
    return _TypedDict(fields, _total(node.keywords), [b for b in bases if b != "TypedDict"])


def _functional_typed_dict(value: ast.expr) -> _TypedDict | None:
    """``X = TypedDict("X", {"a": int}, total=False)``."""
    if not (isinstance(value, ast.Call) and _final_name(value.func) == "TypedDict"):
        return None
    if len(value.args) < 2 or not isinstance(value.args[1], ast.Dict):
        return None
    fields = [
        (key.value, annotation)
        for key, annotation in zip(value.args[1].keys, value.args[1].values, strict=False)
        if isinstance(key, ast.Constant) and isinstance(key.value, str)
    ]
    return _TypedDict(fields, _total(value.keywords), [])


# --- methods ---------------------------------------------------------------


def _bases_first(name: str, bases_of: Callable[[str], list[str]]) -> list[str]:
    """``name`` and its ancestors, most basic first: the reversed MRO for ordinary hierarchies.

    A post-order walk visiting bases right to left; each class is visited once,
    so diamonds stay linear and inheritance cycles terminate.
    """
    order: list[str] = []
    visited: set[str] = set()

    def visit(cls: str) -> None:
        visited.add(cls)
        for base in reversed(bases_of(cls)):
            if base not in visited:
                visit(base)
        order.append(cls)

    visit(name)
    return order


def _class_bases(module: _Module, name: str) -> list[str]:
    """Bases of a class that are defined in this source (``Base`` or ``Base[T]``, not ``mod.Base``)."""
    bases = [_final_name(b) for b in module.classes[name].bases if isinstance(b, (ast.Name, ast.Subscript))]
    return [b for b in bases if b is not None and b in module.classes]


def _members(node: ast.ClassDef) -> dict[str, _Function | None]:
    """Names bound in a class body; ``None`` for anything that is not a callable method."""
    members: dict[str, _Function | None] = {}
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decorators = {_final_name(d) for d in stmt.decorator_list}
            members[stmt.name] = None if decorators & _NOT_TOOLS else stmt
        elif isinstance(stmt, ast.ClassDef):
            members[stmt.name] = None
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            # A class attribute hides an inherited method of the same name.
            for sub in ast.walk(stmt):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    members[sub.id] = None
    return members


def _public_methods(class_name: str, module: _Module) -> list[_Function]:
    resolved: dict[str, _Function | None] = {}
    # Bases first so inherited methods keep their place; a subclass binding overrides the value.
    for cls in _bases_first(class_name, lambda name: _class_bases(module, name)):
        resolved.update(_members(module.classes[cls]))
    return [fn for name, fn in resolved.items() if fn is not None and not name.startswith("_")]


def _tool(fn: _Function, module: _Module) -> dict[str, Any]:
    doc = ast.get_docstring(fn) or ""
    descriptions, doc_types = _param_docs(doc)
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    padding: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    params = list(zip(positional, [*padding, *args.defaults], strict=False))
    if "staticmethod" not in {_final_name(d) for d in fn.decorator_list}:
        params = params[1:]  # self / cls
    params += list(zip(args.kwonlyargs, args.kw_defaults, strict=False))

    properties: dict[str, Schema] = {}
    required: list[str] = []
    for arg, default in params:
        annotation = arg.annotation or _doc_type(doc_types.get(arg.arg))
        schema = _schema(annotation, module)
        if default is None:
            required.append(arg.arg)
        else:
            ok, value = _literal(default)
            if ok:
                # ``x: int = None`` accepts null in practice, so say so.
                schema = {**(_nullable(schema) if value is None else schema), "default": value}
        if descriptions.get(arg.arg):
            schema = {**schema, "description": descriptions[arg.arg]}
        properties[arg.arg] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    parameters["additionalProperties"] = args.kwarg is not None  # **kwargs accepts any extra key
    return {"type": "function", "function": {"name": fn.name, "description": _summary(doc), "parameters": parameters}}


def _literal(node: ast.expr) -> tuple[bool, Any]:
    """The JSON value of a literal expression, or ``(False, None)``."""
    try:
        value = ast.literal_eval(node)
        return True, json.loads(json.dumps(value, allow_nan=False))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


# --- annotations -----------------------------------------------------------


def _parse_type(text: str | None) -> ast.expr | None:
    if not text:
        return None
    try:
        return ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _doc_type(text: str | None) -> ast.expr | None:
    """A docstring's type text: ``"str, optional"`` is ``str``; prose is nothing."""
    if not text or len(text) > MAX_DOC_TYPE:
        return None  # a type is short; anything longer is prose (and would cost the regex dearly)
    text = re.sub(r"(,\s*|\s+|^)(optional|default\b.*)$", "", text.strip(), flags=re.IGNORECASE)
    node = _parse_type(text)
    return None if isinstance(node, ast.Tuple) else node  # "str, int" is prose, not a type


def _schema(node: ast.expr | None, module: _Module, seen: frozenset[str] = frozenset()) -> Schema:
    """JSON schema for an annotation; ``seen`` names what is being expanded (cycle guard)."""
    module.budget -= 1
    if node is None or module.budget < 0:
        return {}
    if isinstance(node, ast.Constant):
        if node.value is None:
            return {"type": "null"}
        if isinstance(node.value, str):  # forward reference or __future__-style string
            return _schema(_parse_type(node.value), module, seen)
        return {}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([_schema(node.left, module, seen), _schema(node.right, module, seen)])
    if isinstance(node, ast.Subscript):
        base = _final_name(node.value)
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        return _generic(base, args, module, seen) if base else {}
    name = _final_name(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
    return _named(name, module, seen) if name else {}


def _named(name: str, module: _Module, seen: frozenset[str]) -> Schema:
    if name in seen:
        return {"type": "object"} if name in module.typed_dicts else {}
    if name in module.typed_dicts:
        return _typed_dict_schema(name, module, seen | {name})
    if name in module.enums:
        return _enum_schema(module.enums[name])
    if name in module.aliases:
        return _schema(module.aliases[name], module, seen | {name})
    if name in _NAMED:
        return dict(_NAMED[name])
    if name in _OBJECTS:
        return {"type": "object"}
    if name in _ARRAYS or name in _TUPLES:
        return {"type": "array"}
    return {}  # Any, object, classes we cannot see


def _generic(base: str, args: list[ast.expr], module: _Module, seen: frozenset[str]) -> Schema:
    def sub(node: ast.expr) -> Schema:
        return _schema(node, module, seen)

    if not args:  # X[()]: only an empty tuple means anything
        return {"type": "array", "maxItems": 0} if base in _TUPLES else _named(base, module, seen)
    if base == "Optional":
        return _nullable(sub(args[0]))
    if base == "Union":
        return _union([sub(a) for a in args])
    if base == "Literal":
        return _enum([value for ok, value in map(_literal, args) if ok])
    if base in _WRAPPERS:
        return sub(args[0])
    if base in _ARRAYS:
        items = sub(args[0])
        return {"type": "array", "items": items} if items else {"type": "array"}
    if base in _TUPLES:
        if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is Ellipsis:
            items = sub(args[0])
            return {"type": "array", "items": items} if items else {"type": "array"}
        n = len(args)
        return {"type": "array", "prefixItems": [sub(a) for a in args], "minItems": n, "maxItems": n}
    if base in _OBJECTS:
        values = sub(args[1]) if len(args) == 2 else {}
        return {"type": "object", "additionalProperties": values} if values else {"type": "object"}
    return _named(base, module, seen)  # a generic TypedDict, or something unknown


def _nullable(schema: Schema) -> Schema:
    if not schema:
        return {}  # already accepts null
    kind = schema.get("type")
    if list(schema) == ["type"] and isinstance(kind, str):
        return schema if kind == "null" else {"type": [kind, "null"]}
    if list(schema) == ["type"] and isinstance(kind, list):
        return schema if "null" in kind else {"type": [*kind, "null"]}
    if list(schema) == ["anyOf"]:
        options = schema["anyOf"]
        return schema if {"type": "null"} in options else {"anyOf": [*options, {"type": "null"}]}
    return {"anyOf": [schema, {"type": "null"}]}


def _union(schemas: list[Schema]) -> Schema:
    members: list[Schema] = []
    nullable = False
    for schema in schemas:
        # Flatten nested unions so ``A | B | None`` reads like ``Union[A, B, None]``.
        parts = schema["anyOf"] if list(schema) == ["anyOf"] else [schema]
        if list(schema) == ["type"] and isinstance(schema["type"], list):
            parts = [{"type": t} for t in schema["type"]]
        for part in parts:
            if not part:
                return {}  # Any absorbs every other member
            if part == {"type": "null"}:
                nullable = True
            elif part not in members:
                members.append(part)
    if not members:
        return {"type": "null"}
    result = members[0] if len(members) == 1 else {"anyOf": members}
    return _nullable(result) if nullable else result


# Keyed by exact type (values have been through JSON, so no subclasses; bool is not int here).
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}


def _enum(values: list[Any]) -> Schema:
    if not values:
        return {}
    kinds = {_JSON_TYPES.get(type(v)) for v in values}
    kind = kinds.pop() if len(kinds) == 1 else None
    return {"type": kind, "enum": values} if kind else {"enum": values}


def _enum_schema(node: ast.ClassDef) -> Schema:
    values: list[Any] = []
    for stmt in node.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            continue
        target = stmt.targets[0]
        if isinstance(target, ast.Name) and not target.id.startswith("_"):
            ok, value = _literal(stmt.value)
            if not ok:
                return {}  # auto() and friends: values unknown, so no honest enum
            values.append(value)
    return _enum(values)


def _typed_dict_fields(name: str, module: _Module) -> list[tuple[str, ast.expr, bool]]:
    """Fields with the totality of the class that declares them, inherited ones first."""
    specs = module.typed_dicts
    order = _bases_first(name, lambda td: [b for b in specs[td].bases if b in specs])
    return [(key, annotation, specs[td].total) for td in order for key, annotation in specs[td].fields]


def _typed_dict_schema(name: str, module: _Module, seen: frozenset[str]) -> Schema:
    properties: dict[str, Schema] = {}
    is_required: dict[str, bool] = {}
    for key, annotation, total in _typed_dict_fields(name, module):
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            annotation = _parse_type(annotation.value) or annotation
        required = total
        # Required/NotRequired may sit inside Annotated or ReadOnly.
        inner = annotation
        while isinstance(inner, ast.Subscript) and _final_name(inner.value) in _WRAPPERS:
            wrapper = _final_name(inner.value)
            if wrapper in ("Required", "NotRequired"):
                required = wrapper == "Required"
            inner = inner.slice.elts[0] if isinstance(inner.slice, ast.Tuple) else inner.slice
        properties[key] = _schema(inner, module, seen)
        is_required[key] = required
    return {"type": "object", "properties": properties, "required": [k for k in properties if is_required[k]]}


# --- docstrings ------------------------------------------------------------
# Parsed here rather than by docstring_parser, which reads less of what LLM-written docstrings hold:
# one Google entry without a colon drops the whole section, indented or lower-case headers and
# NumPy's "a, b : int" go unread, and all three styles in one docstring need three parses merged.
# Over the stdlib's and common packages' 81,741 docstrings it described 1 in 10 documented ones differently.

_SECTIONS = (
    "args|arguments|parameters|params|keyword args|keyword arguments|other parameters|returns?|"
    "yields?|raises|examples?|notes?|attributes|see also|warnings?|todo"
)
_SECTION_LINE = re.compile(rf"^({_SECTIONS})\s*:?\s*$|^:\w+", re.IGNORECASE)
_GOOGLE_HEADER = re.compile(
    r"^(\s*)(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters)\s*:\s*$"
)
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\((.*?)\))?\s*:\s*(.*)$")
_NUMPY_HEADERS = {"parameters", "other parameters", "keyword arguments"}
_NUMPY_ENTRY = re.compile(r"^(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::\s*(.*))?$")
_RULE = re.compile(r"^\s*-{3,}\s*$")
# ":param [type] name: text"; the type and name are split apart afterwards (a regex doing both backtracks badly).
_SPHINX_PARAM = re.compile(r"^:(?:param|parameter|arg|argument|key|keyword)\s+([^:]+):\s*(.*)$")
_SPHINX_TYPE = re.compile(r"^:type\s+\*{0,2}(\w+)\s*:\s*(.*)$")


def _summary(doc: str) -> str:
    """The first paragraph, stopping early at a section header."""
    lines: list[str] = []
    for line in doc.splitlines():
        text = line.strip()
        if not text or _SECTION_LINE.match(text):
            break
        lines.append(text)
    return " ".join(lines)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _param_docs(doc: str) -> tuple[dict[str, str], dict[str, str]]:
    """Per-parameter (descriptions, type texts) from Google, NumPy and Sphinx styles."""
    lines = doc.splitlines()
    texts: dict[str, list[str]] = {}
    types: dict[str, str] = {}
    _google(lines, texts, types)
    _numpy(lines, texts, types)
    _sphinx(lines, texts, types)
    return {name: " ".join(" ".join(parts).split()) for name, parts in texts.items()}, types


def _google(lines: list[str], texts: dict[str, list[str]], types: dict[str, str]) -> None:
    for start, line in enumerate(lines):
        header = _GOOGLE_HEADER.match(line)
        if not header:
            continue
        entry_indent: int | None = None
        current: str | None = None
        for body in lines[start + 1 :]:
            if not body.strip():
                continue
            indent = _indent(body)
            if indent <= len(header.group(1)):
                break  # dedent: the section is over
            entry_indent = indent if entry_indent is None else entry_indent
            entry = _GOOGLE_ENTRY.match(body.strip()) if indent <= entry_indent else None
            if entry:
                current = entry.group(1)
                texts[current] = [entry.group(3)]
                if entry.group(2):
                    types[current] = entry.group(2)
            elif current:
                texts[current].append(body.strip())


def _numpy(lines: list[str], texts: dict[str, list[str]], types: dict[str, str]) -> None:
    for start in range(len(lines) - 1):
        if lines[start].strip().lower() not in _NUMPY_HEADERS or not _RULE.match(lines[start + 1]):
            continue
        header_indent = _indent(lines[start])
        current: list[str] = []
        for i in range(start + 2, len(lines)):
            line = lines[i]
            if not line.strip():
                continue
            if i + 1 < len(lines) and _RULE.match(lines[i + 1]):
                break  # the next section's header
            if _indent(line) > header_indent:
                for name in current:
                    texts[name].append(line.strip())
                continue
            entry = _NUMPY_ENTRY.match(line.strip())
            current = [n.strip().lstrip("*") for n in entry.group(1).split(",")] if entry else []
            for name in current:
                texts[name] = []
                if entry and entry.group(2):
                    types[name] = entry.group(2).strip()


def _sphinx(lines: list[str], texts: dict[str, list[str]], types: dict[str, str]) -> None:
    current: str | None = None
    for line in lines:
        text = line.strip()
        param = _SPHINX_PARAM.match(text)
        type_field = _SPHINX_TYPE.match(text)
        if param and (words := param.group(1).split()):
            current = words[-1].lstrip("*")
            texts[current] = [param.group(2)]
            if len(words) > 1:
                types[current] = " ".join(words[:-1])
        elif type_field:
            types[type_field.group(1)] = type_field.group(2)
            current = None
        elif not text or text.startswith(":") or not line[:1].isspace():
            current = None
        elif current:
            texts[current].append(text)
