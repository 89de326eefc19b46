"""Strict extraction from LLM answers: one fenced block, valid JSON or Python, typed fields.

Every failure is a ``ParseError`` whose reason is written for the model: it is
sent back verbatim when the answer is re-asked.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from typing import Any

from synthesis.errors import ParseError

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
_CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]*$")
# A list marker some models put inside JSON strings: "- ", "* ", "• ", "1. ", "2) ".
_BULLET = re.compile(r"^\s*(?:[-*•]|\d{1,3}[.)])\s+")


def blocks(text: str) -> list[tuple[str, str]]:
    """Fenced code blocks as (language, body)."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def _unclosed(text: str) -> bool:
    return len(re.findall(r"^[ \t]*```", text, re.MULTILINE)) % 2 == 1


def json_answer(text: str) -> Any:
    """The JSON value in the answer's single ```json block (or the whole answer when it has no block)."""
    found = [body for lang, body in blocks(text) if lang in ("json", "")]
    if len(found) > 1:
        raise ParseError(f"the answer holds {len(found)} JSON blocks; give exactly one ```json block")
    if found:
        body = found[0]
    elif _unclosed(text):
        raise ParseError("the ```json block is not closed: the answer looks cut off; give the complete JSON")
    else:
        body = text.strip()
        if not body.startswith(("{", "[")):
            raise ParseError("the answer holds no ```json block (and is not JSON itself); give exactly one ```json block")
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        raise ParseError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def python_answer(text: str) -> tuple[str, ast.Module]:
    """The source in the answer's single ```python block, and its syntax tree."""
    found = [body for lang, body in blocks(text) if lang in ("python", "py", "")]
    if len(found) > 1:
        raise ParseError(f"the answer holds {len(found)} code blocks; give exactly one ```python block")
    if not found:
        if _unclosed(text):
            raise ParseError("the ```python block is not closed: the code looks cut off; give the complete code")
        raise ParseError("the answer holds no ```python block")
    # Models often paste a method as it sits inside a class, indented; dedenting is harmless otherwise.
    source = textwrap.dedent(found[0])
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        hint = " (the code looks cut off)" if exc.lineno and exc.lineno >= source.count("\n") else ""
        raise ParseError(f"the code does not parse: line {exc.lineno}: {exc.msg}{hint}") from None
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"the code does not parse: {exc}") from None
    return source, tree


# -- fields -------------------------------------------------------------------------------


def obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ParseError(f"{where} must be a JSON object, not {_kind(value)}")
    return value


def array(data: dict[str, Any], key: str, where: str, *, min_items: int = 0, max_items: int | None = None) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list):
        raise ParseError(f"{where}.{key} must be a JSON array, not {_kind(value)}")
    if len(value) < min_items:
        raise ParseError(f"{where}.{key} needs at least {min_items} entries, got {len(value)}")
    if max_items is not None and len(value) > max_items:
        raise ParseError(f"{where}.{key} allows at most {max_items} entries, got {len(value)}")
    return value


def text(data: dict[str, Any], key: str, where: str, *, min_len: int = 1, single_line: bool = False) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ParseError(f"{where}.{key} must be a string, not {_kind(value)}")
    value = value.strip()
    if len(value) < min_len:
        raise ParseError(f"{where}.{key} is too short (at least {min_len} characters)")
    if single_line and "\n" in value:
        raise ParseError(f"{where}.{key} must be a single line")
    return value


def integer(data: dict[str, Any], key: str, where: str, low: int, high: int) -> int:
    value = data.get(key)
    if type(value) is not int or not low <= value <= high:
        raise ParseError(f"{where}.{key} must be an integer from {low} to {high}, not {json.dumps(value)}")
    return value


def choice(data: dict[str, Any], key: str, where: str, options: tuple[str, ...]) -> str:
    value = data.get(key)
    normal = value.strip().lower() if isinstance(value, str) else None
    if normal not in options:
        raise ParseError(f"{where}.{key} must be one of {', '.join(options)}, not {json.dumps(value)}")
    return normal


def identifier(value: Any, where: str, style: str = "snake") -> str:
    pattern = _SNAKE if style == "snake" else _CAMEL
    if not isinstance(value, str) or not pattern.match(value) or len(value) > 64:
        shape = "snake_case (a-z, 0-9, _)" if style == "snake" else "CamelCase"
        raise ParseError(f"{where} must be a {shape} identifier of at most 64 characters, not {json.dumps(value)}")
    return value


def strip_bullet(line: str) -> str:
    """Remove one leading list marker. A regex, never ``str.strip(chars)``, which eats name characters."""
    return _BULLET.sub("", line, count=1).strip()


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )
