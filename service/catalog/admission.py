"""What submitted code must pass to enter a catalog, read statically (nothing is executed): an
environment's class parses, defines its tools and keeps no state outside the instance; a scenario's
checks parse and its turns name tools the environment has. Standard library only: the analysis child
(``python -S``) runs ``build_environment``.
"""

from __future__ import annotations

import ast
import sys
from typing import Any

from service.catalog import outside_state
from service.catalog.model import CatalogError, Environment, Scenario
from service.catalog.schema import SchemaError, extract_tools


def build_environment(
    *,
    env_id: str,
    class_name: str,
    code: str,
    summary: str = "",
    introduction: str = "",
    rules: list[str] | None = None,
    tool_overrides: dict[str, dict[str, Any]] | None = None,
    requirements: list[str] | None = None,
    check_state: bool = True,
) -> Environment:
    """Parse the class statically and extract its tools. Nothing is executed here.

    ``check_state``: refuse code that keeps state outside the instance (``service.catalog.outside_state``);
    off only for records stored before that check existed, which are served as they were accepted.

    Raises:
        CatalogError: the code does not parse or does not define ``class_name``; or (reason
            ``state_outside_instance``) it keeps state where a rebuilt session loses it.
    """
    try:
        tools = extract_tools(code, class_name)
    except SchemaError as exc:
        raise CatalogError(str(exc), field="code", reason=exc.reason) from exc
    if check_state:
        refuse_outside_state(code)
    overrides = tool_overrides or {}
    for tool in tools:
        fn = tool["function"]
        patch = overrides.get(fn["name"])
        if patch:
            fn.update({k: v for k, v in patch.items() if k in ("description", "parameters")})
    return Environment(
        env_id=env_id,
        class_name=class_name,
        code=code,
        summary=summary,
        introduction=introduction,
        rules=list(rules or []),
        tool_overrides=overrides,
        tools=tools,
        requirements=list(requirements or []),
        imports=third_party_imports(code),
    )


def check_turns(scenario: Scenario, env: Environment) -> None:
    """Raises CatalogError naming the field: a turn's check does not parse, or it names a tool the
    environment does not have."""
    if scenario.turns and scenario.checklist:
        raise CatalogError("checklist: a turn-based scenario's checks belong to its turns (turns[i].checklist)",
                           field="checklist")
    names = env.tool_names
    for i, turn in enumerate(scenario.turns):
        for j, check in enumerate(turn.checklist):
            parse_check(check.check, field_name=f"turns[{i}].checklist[{j}].check")
        for j, tool in enumerate(turn.tools):
            if tool not in names:
                raise CatalogError(f"turns[{i}].tools[{j}]: '{tool}' is not a tool of '{env.env_id}'",
                                   field=f"turns[{i}].tools[{j}]")


def refuse_outside_state(code: str) -> None:
    """Raises CatalogError (field ``code``, reason ``state_outside_instance``) naming each line that
    keeps state outside the instance: a session rebuilt from its stored attributes would lose it."""
    found = outside_state.findings(code)
    if found:
        raise CatalogError(outside_state.problem_text(found), field="code", reason=outside_state.REASON)


def third_party_imports(code: str) -> list[str]:
    """Top-level modules the code imports that are not in the standard library, sorted.

    Only absolute imports written as statements are seen; an import by computed name still finds
    nothing but the standard library and the environment's own layer in the sandbox."""
    names: set[str] = set()
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []  # extract_tools has reported why already
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return sorted(n for n in names if n not in sys.stdlib_module_names and n != "__future__")


def parse_check(source: str, *, field_name: str = "check") -> None:
    """Reject a check whose source does not parse. A missing ``check_func`` is not an
    error here: like a check that raises, it fails at scoring with the reason reported.

    Raises:
        CatalogError: naming ``field_name`` and the syntax error's line.
    """
    try:
        ast.parse(source)
    except SyntaxError as exc:
        raise CatalogError(
            f"{field_name}: syntax error at line {exc.lineno}: {exc.msg}", field=field_name
        ) from exc
    except (RecursionError, MemoryError, ValueError) as exc:
        raise CatalogError(f"{field_name}: source cannot be parsed ({type(exc).__name__})", field=field_name) from exc
