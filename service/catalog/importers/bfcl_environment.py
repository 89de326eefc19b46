"""BFCL's API classes as environments: one per distinct set of involved classes and excluded functions,
so each scenario sees exactly the tools BFCL offers it. The generated code embeds the classes'
sources, which only ever run in the sandbox; each runs in a namespace of its own there (BFCL's modules
reuse names such as ``DEFAULT_STATE``), with the names it imports from ``long_context`` supplied. A
tool method calls the API instance as BFCL's executor does and answers with BFCL's rendering of the
result (``Error during execution: ...`` for an exception), which it also records in
``execution_results``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from service.catalog.admission import build_environment
from service.catalog.arguments import ArgumentChecker
from service.catalog.importers.bfcl_data import Backend, Source, jsonl
from service.catalog.model import Environment, ToolCall

# BFCL's own spellings of JSON Schema types.
_TYPES = {"dict": "object", "float": "number", "tuple": "array"}

RENDER = '''
def _render(result):
    # BFCL's execute_multi_turn_func_call: strings as they are, dicts as JSON, the rest as str()
    if type(result) == str:
        return result
    if type(result) == dict:
        try:
            return json.dumps(result)
        except Exception:
            return str(result)
    return str(result)
'''


def _schema(value: Any) -> Any:
    """BFCL's parameter schema as JSON Schema (its ``dict``/``float``/``tuple``, and ``any`` as no type)."""
    if isinstance(value, dict):
        out = {key: _schema(item) for key, item in value.items()}
        kind = out.get("type")
        if kind == "any":
            del out["type"]
        elif isinstance(kind, str):
            out["type"] = _TYPES.get(kind, kind)
        return out
    if isinstance(value, list):
        return [_schema(item) for item in value]
    return value


def _signature(fn: ast.FunctionDef) -> tuple[str, str]:
    """A wrapper's parameter list (annotations dropped, defaults kept) and the dict of its arguments."""
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params, names = [], []
    for arg, default in list(zip(positional, defaults, strict=True))[1:]:  # after self
        params.append(arg.arg + (f"={ast.unparse(default)}" if default is not None else ""))
        names.append(arg.arg)
    if args.kwonlyargs:
        params.append("*")
        for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            params.append(arg.arg + (f"={ast.unparse(kw_default)}" if kw_default is not None else ""))
            names.append(arg.arg)
    return "".join(f", {p}" for p in params), "{" + ", ".join(f"{n!r}: {n}" for n in names) + "}"


def _positional_names(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in (fn.args.posonlyargs + fn.args.args)[1:]]


class Combination:
    """The environment for one set of involved classes and excluded functions."""

    def __init__(self, package: Path, backend: Backend, classes: list[str], excluded: list[str],
                 sources: dict[str, Source]) -> None:
        self.classes = classes
        self.excluded = sorted(excluded)
        self.owner: dict[str, str] = {}  # tool -> class; a later class wins, as in BFCL's name mapping
        self.functions: dict[str, ast.FunctionDef] = {}
        for name in classes:
            for method, fn in sources[backend.modules[name]].methods(name).items():
                self.owner[method], self.functions[method] = name, fn
        self.docs: dict[str, dict[str, Any]] = {}
        for name in classes:
            for doc in jsonl(package / "data" / "multi_turn_func_doc" / backend.docs[name]):
                if doc.get("name") in self.owner and self.owner[doc["name"]] == name:
                    self.docs[doc["name"]] = doc
        self.tools = [t for t in self.owner if t not in self.excluded]
        # (tool, parameter) -> the JSON types it accepts beyond BFCL's doc, where a ground truth needs them
        self.widened: dict[tuple[str, str], list[str]] = {}
        suffix = f"_without_{'-'.join(self.excluded)}" if self.excluded else ""
        self.env_id = "bfcl_" + "-".join(classes) + suffix
        self.class_name = "BfclMultiTurn"

    def call(self, text: str) -> ToolCall:
        """One ground-truth call such as ``sort('final_report.pdf')`` as a tool call with named arguments.

        Raises:
            ValueError: the text is not a call of one of this environment's tools with literal arguments.
        """
        node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError(f"not a function call: {text}")
        name = node.func.id
        if name not in self.tools:
            raise ValueError(f"{name} is not a tool here")
        names = _positional_names(self.functions[name])
        if len(node.args) > len(names):
            raise ValueError(f"too many positional arguments: {text}")
        arguments = {names[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise ValueError(f"'**' in {text}")
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        return ToolCall(name=name, arguments=arguments)


def environment_code(combo: Combination, backend: Backend, sources: dict[str, Source],
                     long_context: Source) -> str:
    modules = [backend.modules[name] for name in combo.classes]
    exported = sorted({cls for stem in modules for cls in sources[stem].classes})
    parts = [
        f'"""BFCL multi-turn: {", ".join(combo.classes)}. Generated by envfoundry catalog import-bfcl."""',
        "import json",
        "from copy import deepcopy",
        "",
        RENDER,
        f"_LONG_CONTEXT_SOURCE = {long_context.text!r}",
        *[f"_SOURCE_{stem} = {sources[stem].text!r}" for stem in dict.fromkeys(modules)],
        "",
        "",
        "def _run_module(source, names):",
        "    # Each BFCL module in a namespace of its own; its classes still belong to this module",
        "    namespace = {'__name__': __name__}",
        "    namespace.update(names)",
        "    exec(compile(source, '<bfcl ' + __name__ + '>', 'exec'), namespace)",
        "    return namespace",
        "",
        "",
        "_long_context = {k: v for k, v in _run_module(_LONG_CONTEXT_SOURCE, {}).items() if k.isupper()}",
        *[f"_module_{stem} = _run_module(_SOURCE_{stem}, _long_context)" for stem in dict.fromkeys(modules)],
        *[f"{cls} = {next(f'_module_{s}' for s in modules if cls in sources[s].classes)}[{cls!r}]"
          for cls in exported],
        "",
        "",
        f"class {combo.class_name}:",
        "    def __init__(self, init_config=None):",
        "        config = init_config or {}",
        "        initial = config.get('_initial_config') or {}",
        "        long_context = bool(config.get('_long_context', False))",
    ]
    for name in combo.classes:
        parts.append(f"        self.{name} = {name}()")
        if name not in backend.stateless:
            parts.append(f"        self.{name}._load_scenario(deepcopy(initial.get({name!r}, {{}})), "
                         "long_context=long_context)")
    parts += [
        "        self.execution_results = []",
        "",
        "    def _call(self, api, method, arguments):",
        "        try:",
        "            result = _render(getattr(getattr(self, api), method)(**arguments))",
        "        except Exception as exc:",
        '            result = f"Error during execution: {exc}"',
        "        self.execution_results.append(result)",
        "        return result",
    ]
    for tool in combo.tools:
        signature, arguments = _signature(combo.functions[tool])
        parts += ["", f"    def {tool}(self{signature}):",
                  f"        return self._call({combo.owner[tool]!r}, {tool!r}, {arguments})"]
    return "\n".join(parts) + "\n"


def tool_overrides(combo: Combination) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for tool in combo.tools:
        doc = combo.docs.get(tool)
        if doc:
            parameters = _schema(doc.get("parameters") or {"type": "dict", "properties": {}})
            for (name, param), types in combo.widened.items():
                if name == tool and isinstance(parameters.get("properties", {}).get(param), dict):
                    parameters["properties"][param]["type"] = types
            out[tool] = {"description": str(doc.get("description", "")), "parameters": parameters}
    return out


_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
               (dict, "object"))


def widen_parameters(combo: Combination, calls: list[ToolCall]) -> list[str]:
    """Let a parameter take the type a ground-truth call gives it where BFCL's doc says another (BFCL runs
    the call as it is; the service checks every call against the schema, so it could never replay it).
    Returns what was widened, for the report."""
    overrides = tool_overrides(combo)
    notes = []
    for call in calls:
        properties = (overrides.get(call.name, {}).get("parameters") or {}).get("properties") or {}
        for param, value in call.arguments.items():
            schema = properties.get(param)
            if not isinstance(schema, dict) or "type" not in schema:
                continue
            if ArgumentChecker({"type": "object", "properties": {param: schema}}).problem({param: value}) is None:
                continue
            kind = next((name for cls, name in _JSON_TYPES if isinstance(value, cls)), None)
            declared = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if kind is None or kind in declared:
                continue
            combo.widened[(call.name, param)] = [*declared, kind]
            notes.append(f"{combo.env_id}: {call.name}({param}) also takes {kind}: the ground truth passes "
                         f"{value!r} where BFCL's doc says {' or '.join(declared)}")
    return notes


def schema_mismatch(combo: Combination, calls: list[ToolCall]) -> str | None:
    overrides = tool_overrides(combo)
    for call in calls:
        schema = overrides.get(call.name, {}).get("parameters")
        problem = ArgumentChecker(schema).problem(call.arguments) if isinstance(schema, dict) else None
        if problem:
            return f"{call.name}: {problem}"
    return None


def environment(combo: Combination, backend: Backend, sources: dict[str, Source], long_context: Source,
                pinned: dict[str, str], needs: list[str]) -> Environment:
    return build_environment(
        env_id=combo.env_id, class_name=combo.class_name, code=environment_code(combo, backend, sources, long_context),
        summary=f"BFCL multi-turn with {', '.join(combo.classes)}",
        introduction=f"BFCL multi-turn environment: the tools of {', '.join(combo.classes)}, as bfcl-eval defines them.",
        tool_overrides=tool_overrides(combo), requirements=[pinned.get(n, n) for n in needs])
