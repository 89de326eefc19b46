"""Import BFCL's multi-turn categories from an installed ``bfcl-eval`` as catalog packages.

The package is read as files, never imported (its API modules import packages
such as mpmath and sentence-transformers, and the service runs none of its code): the entries and ground truth under ``data/``, the function docs under
``data/multi_turn_func_doc/``, and the API classes' source under
``eval_checker/multi_turn_eval/func_source_code/``. The sources are embedded in
the generated environment code, which only ever runs in the sandbox; each runs
in a namespace of its own there (BFCL's modules reuse names such as
``DEFAULT_STATE``), with the names it imports from ``long_context`` supplied.

One environment per distinct set of involved classes and excluded functions,
so each scenario sees exactly the tools BFCL offers it. A tool method calls the
API instance as BFCL's executor does and answers with BFCL's rendering of the
result (``Error during execution: ...`` for an exception), which it also
records in ``execution_results``.

Checks are BFCL's: for each involved class, every public attribute equals the
ground-truth instance's (``state_checker``), the ground truth being replayed
by the check on a copy of the session's initial instances; and every
ground-truth execution result appears among the session's results
(``response_checker``). Two differences, both stated in the README: the checks
run once, on the final state, where BFCL checks after every turn; and the
task gives all turns at once (the conversation mode's simulated user can
reveal them one by one).
"""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.catalog.arguments import ArgumentChecker
from service.catalog.admission import build_environment
from service.catalog.collection import Catalog
from service.catalog.folders import write_package
from service.catalog.model import CatalogError, CheckItem, Environment, Scenario, ToolCall, Turn
from service.catalog.importers.envscaler import ImportReport

CATEGORIES = ("multi_turn_base", "multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param")
# Categories also written all at once (every turn in the task, checks on the final state), as a split
# of their own: miss_func and miss_param make sense only turn by turn.
ALL_AT_ONCE = ("multi_turn_base", "multi_turn_long_context")
ALL_AT_ONCE_SUFFIX = "_all_at_once"
_PROMPTS = "constants/default_prompts.py"
# What BFCL's inference says in a turn that only brings functions (its question is empty), when
# bfcl-eval's own constant cannot be read.
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
_SOURCE_DIR = "eval_checker/multi_turn_eval/func_source_code"
_CONSTANTS = "constants/executable_backend_config.py"
# BFCL's own spellings of JSON Schema types.
_TYPES = {"dict": "object", "float": "number", "tuple": "array"}

_RENDER = '''
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

_REPLAY = '''import json
from copy import deepcopy
''' + _RENDER + '''

def _replay():
    instances = {{name: deepcopy(initial_state[name]) for name in {classes!r}}}
    results = []
    for api, method, arguments in {calls!r}:
        try:
            results.append(_render(getattr(instances[api], method)(**deepcopy(arguments))))
        except Exception as exc:
            results.append(f"Error during execution: {{exc}}")
    return instances, results
'''

_STATE_CHECK = '''

def check_func(final_state):
    expected = _replay()[0][{api!r}]
    model = final_state[{api!r}]
    return all(getattr(model, name, object()) == value
               for name, value in vars(expected).items() if not name.startswith("_"))
'''

_RESPONSE_CHECK = '''

def check_func(final_state):
    remaining = list(final_state.get("execution_results", []))
    for result in _replay()[1][{start}:]:
        if result not in remaining:
            return False
        remaining.remove(result)
    return True
'''

# BFCL fails a turn whose ground truth has calls when the model made none in it.
_ANSWERED_CHECK = '''
def check_func(final_state):
    return len(turn_responses["calls"]) > 0
'''


@dataclass
class _Backend:
    """What bfcl-eval's constants say about its API classes."""

    modules: dict[str, str]  # class name -> module file stem
    docs: dict[str, str]  # class name -> function doc file name
    stateless: list[str]


def find_package() -> Path:
    """The folder of the installed ``bfcl_eval`` package, found without importing it.

    Raises:
        CatalogError: bfcl-eval is not installed.
    """
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise CatalogError("bfcl-eval is not installed: pip install bfcl-eval (or pass --source DIR)")
    return Path(next(iter(spec.submodule_search_locations)))


def _literal_assignments(path: Path) -> dict[str, Any]:
    values: dict[str, Any] = {}
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            node = stmt.value
            if isinstance(node, ast.Dict):
                values[stmt.targets[0].id] = {
                    ast.literal_eval(k): _text(v) for k, v in zip(node.keys, node.values, strict=True) if k
                }
            else:
                try:
                    values[stmt.targets[0].id] = ast.literal_eval(node)
                except ValueError:
                    continue
    return values


def _text(node: ast.expr) -> str:
    # Module paths are f-strings on a prefix constant: the literal parts are enough.
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
    return str(ast.literal_eval(node))


def _backend(package: Path) -> _Backend:
    path = package / _CONSTANTS
    try:
        values = _literal_assignments(path)
        modules = {name: path.rsplit(".", 1)[-1] for name, path in values["CLASS_FILE_PATH_MAPPING"].items()}
        return _Backend(modules=modules,
                        docs=dict(values["MULTI_TURN_FUNC_DOC_FILE_MAPPING"]),
                        stateless=list(values.get("STATELESS_CLASSES", [])))
    except (OSError, SyntaxError, ValueError, KeyError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise CatalogError(f"not a bfcl_eval package: cannot read BFCL's class mappings ({reason})",
                           path=str(path)) from exc


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise CatalogError(f"cannot read {path}: {exc}", path=str(path)) from exc
    return [row for row in rows if isinstance(row, dict)]


def _data_file(package: Path, folder: str, category: str) -> Path:
    matches = sorted((package / folder).glob(f"BFCL_*_{category}.json"))
    if not matches:
        raise CatalogError(f"no BFCL_*_{category}.json under {package / folder}", path=str(package / folder))
    return matches[-1]


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


class _Source:
    """One BFCL module: its text without its ``bfcl_eval`` imports, and its classes' method signatures."""

    def __init__(self, path: Path) -> None:
        self.path = path
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        self.needs: set[str] = set()  # packages outside the standard library it imports
        lines = text.splitlines(keepends=True)
        for stmt in tree.body:
            if isinstance(stmt, ast.ImportFrom) and (stmt.module or "").startswith("bfcl_eval"):
                for n in range(stmt.lineno - 1, stmt.end_lineno or stmt.lineno):
                    lines[n] = "\n"  # the names come from the namespace it runs in
            elif isinstance(stmt, ast.Import | ast.ImportFrom):
                names = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else [stmt.module or ""]
                self.needs |= {n.split(".")[0] for n in names if not _stdlib(n)}
        self.text = "".join(lines)
        self.classes = {stmt.name: stmt for stmt in tree.body if isinstance(stmt, ast.ClassDef)}

    def methods(self, class_name: str) -> dict[str, ast.FunctionDef]:
        node = self.classes[class_name]
        return {fn.name: fn for fn in node.body if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_")}


def _required_versions(package: Path) -> dict[str, str]:
    """bfcl-eval's own requirements by project name ("mpmath" -> "mpmath==1.3.0"), read from the
    metadata installed beside it (none for a source folder without it)."""
    from email.parser import HeaderParser

    from packaging.requirements import InvalidRequirement, Requirement

    found: dict[str, str] = {}
    for metadata in sorted(package.parent.glob("bfcl_eval-*.dist-info/METADATA")):
        for line in HeaderParser().parsestr(metadata.read_text(encoding="utf-8", errors="replace")).get_all(
                "Requires-Dist") or []:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            if requirement.marker is None and not requirement.url:
                found[requirement.name.lower()] = f"{requirement.name.lower()}{requirement.specifier}"
    return found


def _stdlib(module: str) -> bool:
    import sys

    return module.split(".")[0] in sys.stdlib_module_names


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


class _Combination:
    """The environment for one set of involved classes and excluded functions."""

    def __init__(self, package: Path, backend: _Backend, classes: list[str], excluded: list[str],
                 sources: dict[str, _Source]) -> None:
        self.classes = classes
        self.excluded = sorted(excluded)
        self.owner: dict[str, str] = {}  # tool -> class; a later class wins, as in BFCL's name mapping
        self.functions: dict[str, ast.FunctionDef] = {}
        for name in classes:
            for method, fn in sources[backend.modules[name]].methods(name).items():
                self.owner[method], self.functions[method] = name, fn
        self.docs: dict[str, dict[str, Any]] = {}
        for name in classes:
            for doc in _jsonl(package / "data" / "multi_turn_func_doc" / backend.docs[name]):
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


def environment_code(combo: _Combination, backend: _Backend, sources: dict[str, _Source],
                     long_context: _Source) -> str:
    modules = [backend.modules[name] for name in combo.classes]
    exported = sorted({cls for stem in modules for cls in sources[stem].classes})
    parts = [
        f'"""BFCL multi-turn: {", ".join(combo.classes)}. Generated by envfoundry catalog import-bfcl."""',
        "import json",
        "from copy import deepcopy",
        "",
        _RENDER,
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


def _overrides(combo: _Combination) -> dict[str, dict[str, Any]]:
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


def _widen(combo: _Combination, calls: list[ToolCall]) -> list[str]:
    """Let a parameter take the type a ground-truth call gives it where BFCL's doc says another (BFCL runs
    the call as it is; the service checks every call against the schema, so it could never replay it).
    Returns what was widened, for the report."""
    overrides = _overrides(combo)
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


def _task(entry: dict[str, Any]) -> str:
    turns = []
    for number, turn in enumerate(entry.get("question") or [], start=1):
        text = "\n".join(str(m.get("content", "")) for m in turn if isinstance(m, dict) and m.get("role") == "user")
        turns.append(f"[turn {number}] {text}")
    return "\n\n".join(turns)


def _checks(combo: _Combination, calls: list[ToolCall], start: int = 0) -> list[CheckItem]:
    """BFCL's state checker for each class and its response checker, after ``calls`` (the ground truth
    so far); the response checker asks for the results of ``calls[start:]`` (this turn's)."""
    resolved = [(combo.owner[c.name], c.name, c.arguments) for c in calls]
    replay = _REPLAY.format(classes=combo.classes, calls=resolved)
    checks = [CheckItem(item=f"{api}'s state equals the ground truth's (BFCL's state checker)",
                        check=replay + _STATE_CHECK.format(api=api)) for api in combo.classes]
    checks.append(CheckItem(item="Every ground-truth result appears among the calls' results (BFCL's response "
                                 "checker)", check=replay + _RESPONSE_CHECK.format(start=start)))
    return checks


def _arrivals(entry: dict[str, Any], ground_truth: list[list[ToolCall]]) -> tuple[dict[str, int], list[str]]:
    """The turn each function BFCL withholds arrives at, and notes where that is earlier than BFCL's:
    a ground truth that calls it before its turn (miss_func 49 calls ``tail`` in turn 1 and lists it as
    missing until turn 3; BFCL's executor runs it all the same) gets it from the turn that calls it, or
    its own reference solution would be an unknown tool."""
    arrival = {str(name): int(turn) for turn, names in (entry.get("missed_function") or {}).items()
               for name in names or []}
    notes = []
    for index, calls in enumerate(ground_truth):
        for call in calls:
            if arrival.get(call.name, -1) > index:
                notes.append(f"{call.name} arrives in turn {index}, where the ground truth calls it, not in turn "
                             f"{arrival[call.name]} as BFCL withholds it")
                arrival[call.name] = index
    return arrival, notes


def _turns(combo: _Combination, entry: dict[str, Any], ground_truth: list[list[ToolCall]],
           added_prompt: str, arrival: dict[str, int]) -> tuple[Turn, ...]:
    """BFCL's protocol: one turn per question, the functions it withholds arriving at their turn, and
    after each turn whose ground truth has calls, BFCL's checks: the model called something in it, each
    class's state equals the ground truth's so far, and this turn's ground-truth results appear among
    the model's results so far. A turn whose ground truth is empty (the function or a parameter is
    missing, so the model should ask or stop) is not checked, as in BFCL."""
    turns = []
    done: list[ToolCall] = []
    for index, question in enumerate(entry.get("question") or []):
        message = _message(question) or added_prompt
        calls = ground_truth[index] if index < len(ground_truth) else []
        checks: list[CheckItem] = []
        if calls:
            checks = [CheckItem(item="The model called a function in this turn (BFCL fails an empty turn)",
                                check=_ANSWERED_CHECK),
                      *_checks(combo, done + calls, start=len(done))]
        done += calls
        tools = tuple(name for name, turn in arrival.items() if turn == index)
        turns.append(Turn(message=message, tools=tools, checklist=tuple(checks), reference_solution=tuple(calls)))
    return tuple(turns)


def _message(question: Any) -> str:
    if not isinstance(question, list):
        return ""
    return "\n".join(str(m.get("content", "")) for m in question if isinstance(m, dict) and m.get("role") == "user")


def _added_prompt(package: Path) -> str:
    try:
        value = _literal_assignments(package / _PROMPTS).get("DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC")
    except (OSError, SyntaxError, ValueError):
        return ADDED_FUNCTIONS_PROMPT
    return value if isinstance(value, str) and value else ADDED_FUNCTIONS_PROMPT


def _schema_mismatch(combo: _Combination, calls: list[ToolCall]) -> str | None:
    overrides = _overrides(combo)
    for call in calls:
        schema = overrides.get(call.name, {}).get("parameters")
        problem = ArgumentChecker(schema).problem(call.arguments) if isinstance(schema, dict) else None
        if problem:
            return f"{call.name}: {problem}"
    return None


def _environment(combo: _Combination, backend: _Backend, sources: dict[str, _Source], long_context: _Source,
                 pinned: dict[str, str], needs: list[str]) -> Environment:
    return build_environment(
        env_id=combo.env_id, class_name=combo.class_name, code=environment_code(combo, backend, sources, long_context),
        summary=f"BFCL multi-turn with {', '.join(combo.classes)}",
        introduction=f"BFCL multi-turn environment: the tools of {', '.join(combo.classes)}, as bfcl-eval defines them.",
        tool_overrides=_overrides(combo), requirements=[pinned.get(n, n) for n in needs])


def import_bfcl(out: Path, package: Path | None = None, categories: tuple[str, ...] = CATEGORIES, *,
                widen: bool = True) -> ImportReport:
    """Write the multi-turn ``categories`` of bfcl-eval (installed, or at ``package``) as packages under ``out``.

    A ground truth that gives a parameter another type than BFCL's doc says (entry 173 of each category
    closes ticket 'ticket_001' where the doc says an integer) widens that parameter of its environment
    to take both, named in the report's notes; with ``widen`` false such an entry is skipped instead.

    An environment whose classes import packages outside the standard library (MathAPI imports
    mpmath) declares them as ``requirements``, at the versions bfcl-eval itself requires when its
    metadata says; a server serves it when its operator allows them (``service.catalog.requirements``).

    Raises:
        CatalogError: bfcl-eval cannot be found, a category is not multi-turn, or its files cannot be read.
    """
    for category in categories:
        if category not in CATEGORIES:
            raise CatalogError(f"category {category!r} is not importable: choose from {', '.join(CATEGORIES)}")
    package = Path(package) if package is not None else find_package()
    backend = _backend(package)
    source_dir = package / _SOURCE_DIR
    try:
        sources = {stem: _Source(source_dir / f"{stem}.py") for stem in set(backend.modules.values())
                   if (source_dir / f"{stem}.py").is_file()}
        long_context = _Source(source_dir / "long_context.py")
    except (OSError, SyntaxError, ValueError) as exc:
        raise CatalogError(f"cannot read BFCL's API sources under {source_dir}: {exc}", path=str(source_dir)) from exc
    report = ImportReport()
    catalog = Catalog()
    pinned = _required_versions(package)
    added_prompt = _added_prompt(package)
    combos: dict[str, _Combination] = {}
    for category in categories:
        answers = {row.get("id"): row.get("ground_truth") for row in
                   _jsonl(_data_file(package, "data/possible_answer", category))}
        for entry in _jsonl(_data_file(package, "data", category)):
            entry_id = str(entry.get("id"))
            classes = [str(c) for c in entry.get("involved_classes") or []]
            missing = [c for c in classes if backend.modules.get(c) not in sources]
            if missing or not classes:
                report.skipped.append(f"{entry_id}: no source for {missing or 'its classes'}")
                continue
            needs = sorted({n for c in classes for n in sources[backend.modules[c]].needs})
            excluded = [str(f) for f in entry.get("excluded_function") or []]
            key = json.dumps([classes, sorted(excluded)])
            if key not in combos:
                combos[key] = _Combination(package, backend, classes, excluded, sources)
                combo = combos[key]
                catalog.add_environment(_environment(combo, backend, sources, long_context, pinned, needs))
            combo = combos[key]
            try:
                ground_truth = [[combo.call(text) for text in turn] for turn in answers.get(entry.get("id")) or []]
            except (ValueError, SyntaxError, KeyError) as exc:
                report.skipped.append(f"{entry_id}: ground truth not readable: {exc}")
                continue
            calls = [call for turn in ground_truth for call in turn]
            if not calls:
                report.skipped.append(f"{entry_id}: no ground truth in possible_answer")
                continue
            if _schema_mismatch(combo, calls) and widen:
                notes = _widen(combo, calls)
                if notes:  # the environment again, with the parameter widened
                    report.notes += [f"{entry_id}: {note}" for note in notes]
                    catalog.environments[combo.env_id] = _environment(combo, backend, sources, long_context,
                                                                      pinned, needs)
            mismatch = _schema_mismatch(combo, calls)
            if mismatch:  # the service checks every call against the tool's schema, so it could never replay
                report.skipped.append(f"{entry_id}: its ground truth does not match BFCL's own schema: {mismatch}")
                continue
            init_config = {"_initial_config": entry.get("initial_config") or {},
                           "_long_context": category == "multi_turn_long_context"}
            scenario_id = f"bfcl-{entry_id.replace('_', '-')}"
            arrival, notes = _arrivals(entry, ground_truth)
            report.notes += [f"{entry_id}: {note}" for note in notes]
            turns = _turns(combo, entry, ground_truth, added_prompt, arrival)
            # BFCL has no train/test: its category is the set a run evaluates on.
            catalog.add_scenario(Scenario(
                scenario_id=scenario_id, env_id=combo.env_id, task=turns[0].message, init_config=init_config,
                reference_solution=calls, split=category, tags=("bfcl",), turns=turns))
            if category in ALL_AT_ONCE:
                catalog.add_scenario(Scenario(
                    scenario_id=f"{scenario_id}-all-at-once", env_id=combo.env_id, task=_task(entry),
                    init_config=init_config, checklist=_checks(combo, calls), reference_solution=calls,
                    split=category + ALL_AT_ONCE_SUFFIX, tags=("bfcl",)))
    for env in catalog.environments.values():
        if catalog.scenarios_of(env.env_id):  # every entry of a combination may have been skipped
            write_package(env, catalog.scenarios_of(env.env_id), Path(out))
            report.environments += 1
    report.scenarios = len(catalog.scenarios)
    return report
