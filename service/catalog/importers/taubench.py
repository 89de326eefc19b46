"""Import a tau-bench checkout (its retail and airline domains) as catalog packages.

tau-bench is not on PyPI, so the importer reads a checkout on the user's
machine, statically: task files are parsed with ``ast`` (never imported) and
the tool modules are copied as source into the environment's code, which only
ever runs in the sandbox. Nothing of tau-bench ships with this project.

For each domain folder ``tau_bench/envs/<domain>/`` it writes one environment:

* the database (``data/*.json``, one key per file, as ``data/__init__.py``
  loads it) is embedded in the code, so a scenario's ``init_config`` holds only
  its ground truth instead of a 1-3 MB copy of the database;
* one tool per tau-bench ``Tool`` class, with the benchmark's own schema
  (``get_info``), plus ``respond``: tau-bench's own action for a message to
  the user, which is where its required outputs are looked for;
* ``wiki.md`` as the introduction and ``rules.py``'s ``RULES`` as the rules.

Each task of each ``tasks_<split>.py`` becomes a scenario whose checks are
tau-bench's reward: the database's hash equals the hash after replaying the
ground-truth actions (computed by the environment when a session starts, as
tau-bench does on every reward), and each required output appears in a
``respond`` message (lower-cased, commas removed). The reference solution is
the ground-truth actions plus one ``respond`` carrying the outputs.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from service.catalog.admission import build_environment
from service.catalog.collection import Catalog
from service.catalog.folders import write_package
from service.catalog.importers.envscaler import ImportReport
from service.catalog.model import CatalogError, CheckItem, Scenario, ToolCall

# tau-bench ends an episode on these without replaying them (``terminate_tools``).
TERMINATE_TOOLS = ("transfer_to_human_agents",)
_SPLIT_FILE = re.compile(r"^tasks_([a-z0-9]+)\.py$")

_RESPOND: dict[str, Any] = {
    "description": "Send a message to the user. Every answer the user should see (a total, a count, a status) "
                   "goes through this tool.",
    "parameters": {
        "type": "object",
        "properties": {"content": {"type": "string", "description": "The message to the user."}},
        "required": ["content"],
    },
}

_HASH_SOURCE = '''
def _hashable(item):
    # tau-bench's to_hashable: the same value gives the same string, key order aside
    if isinstance(item, dict):
        return tuple((key, _hashable(value)) for key, value in sorted(item.items()))
    if isinstance(item, list):
        return tuple(_hashable(element) for element in item)
    if isinstance(item, set):
        return tuple(sorted(_hashable(element) for element in item))
    return item


def data_hash(data):
    return sha256(str(_hashable(data)).encode("utf-8")).hexdigest()
'''

_DATABASE_CHECK = '''from hashlib import sha256
''' + _HASH_SOURCE + '''

def check_func(final_state):
    return data_hash(final_state["data"]) == final_state["_expected_data_hash"]
'''

_OUTPUT_CHECK = '''
def check_func(final_state):
    wanted = {output!r}.lower()
    return any(wanted in str(message).lower().replace(",", "") for message in final_state.get("responses", []))
'''


class _TaskSyntax(Exception):
    """A task file uses a construct the static reader does not evaluate."""


def _evaluate(node: ast.expr) -> Any:
    """A literal, or a ``Task(...)``/``Action(...)`` call as a dict of its keyword arguments."""
    if isinstance(node, ast.Call):
        if node.args or any(keyword.arg is None for keyword in node.keywords):
            raise _TaskSyntax(f"line {node.lineno}: only keyword arguments are read")
        return {keyword.arg: _evaluate(keyword.value) for keyword in node.keywords}
    if isinstance(node, ast.List | ast.Tuple):
        return [_evaluate(element) for element in node.elts]
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise _TaskSyntax(f"line {node.lineno}: '**' in a dict is not read")
        return {_evaluate(key): _evaluate(value) for key, value in zip(node.keys, node.values, strict=True) if key}
    try:
        return ast.literal_eval(node)
    except ValueError as exc:
        raise _TaskSyntax(f"line {node.lineno}: {exc}") from None


def read_tasks(path: Path) -> list[dict[str, Any]]:
    """The tasks of one ``tasks_<split>.py``: its first module-level list, read without importing it.

    Raises:
        CatalogError: the file cannot be read or holds no list of tasks that can be read statically.
    """
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        raise CatalogError(f"cannot read task file {path}: {exc}", path=str(path)) from exc
    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.List):
            try:
                tasks = _evaluate(value)
            except _TaskSyntax as exc:
                raise CatalogError(f"task file {path}: {exc}", path=str(path)) from None
            if all(isinstance(task, dict) and isinstance(task.get("instruction"), str) for task in tasks):
                return list(tasks)
    raise CatalogError(f"task file {path} holds no list of Task(...)", path=str(path))


def _tool_classes(domain_dir: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(class name, module body, get_info()) for each tool, in ``ALL_TOOLS`` order where it is given."""
    tools_dir = domain_dir / "tools"
    files = sorted(p for p in tools_dir.glob("*.py") if p.name != "__init__.py")
    found: dict[str, tuple[str, str, dict[str, Any]]] = {}
    for path in files:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id == "Tool" for b in stmt.bases):
                found[stmt.name] = (stmt.name, _body_without_imports(tree), _info(stmt, path))
    order = _all_tools_order(tools_dir / "__init__.py")
    ranked = sorted(found, key=lambda name: order.index(name) if name in order else len(order))
    return [found[name] for name in ranked]


def _body_without_imports(tree: ast.Module) -> str:
    # The generated module imports what the tools use once, at its top.
    kept = [stmt for stmt in tree.body if not isinstance(stmt, ast.Import | ast.ImportFrom)]
    return "\n\n".join(ast.unparse(stmt) for stmt in kept)


def _info(node: ast.ClassDef, path: Path) -> dict[str, Any]:
    for stmt in node.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "get_info":
            for inner in ast.walk(stmt):
                if isinstance(inner, ast.Return) and inner.value is not None:
                    info = ast.literal_eval(inner.value)
                    function = info.get("function") if isinstance(info, dict) else None
                    if isinstance(function, dict):
                        return dict(function)
    raise CatalogError(f"{path}: {node.name}.get_info() does not return a literal schema", path=str(path))


def _invoke_parameters(node_source: str, class_name: str) -> list[str]:
    tree = ast.parse(node_source)
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == class_name:
            for fn in stmt.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "invoke":
                    return [arg.arg for arg in fn.args.args[1:] + fn.args.kwonlyargs]  # after ``data``
    return []


def _all_tools_order(path: Path) -> list[str]:
    if not path.is_file():
        return []
    for stmt in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.List):
            return [e.id for e in stmt.value.elts if isinstance(e, ast.Name)]
    return []


def _rules(domain_dir: Path) -> list[str]:
    path = domain_dir / "rules.py"
    if not path.is_file():
        return []
    for stmt in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.List):
            rules = ast.literal_eval(stmt.value)
            return [rule for rule in rules if isinstance(rule, str)]
    return []


def _database(domain_dir: Path) -> dict[str, Any]:
    files = sorted((domain_dir / "data").glob("*.json"))
    if not files:
        raise CatalogError(f"no database files in {domain_dir / 'data'}", path=str(domain_dir / "data"))
    try:
        return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in files}
    except (OSError, ValueError) as exc:
        raise CatalogError(f"cannot read the database under {domain_dir / 'data'}: {exc}",
                           path=str(domain_dir / "data")) from exc


def environment_code(class_name: str, tools: list[tuple[str, str, dict[str, Any]]],
                     database: dict[str, Any]) -> str:
    """The environment's module: tau-bench's tool classes, its database, and one method per tool."""
    parts = [
        "import json",
        "from copy import deepcopy",
        "from hashlib import sha256",
        "from typing import Any, Dict, List",
        "",
        "",
        "class Tool:",
        '    """tau-bench\'s base class: each tool below is one, copied from the benchmark."""',
        "",
        "",
        *[body + "\n\n" for _, body, _ in tools],
        _HASH_SOURCE,
        f"_DATABASE = json.loads({json.dumps(database, ensure_ascii=False)!r})",
        "_TOOLS = {" + ", ".join(f"{info['name']!r}: {name}" for name, _, info in tools) + "}",
        f"_TERMINATE = {TERMINATE_TOOLS!r}",
        "",
        "",
        "def _invoke(data, name, arguments):",
        "    # tau-bench's Env.step: an exception in a tool is the agent's observation",
        "    try:",
        "        return _TOOLS[name].invoke(data=data, **arguments)",
        "    except Exception as exc:",
        '        return f"Error: {exc}"',
        "",
        "",
        f"class {class_name}:",
        "    def __init__(self, init_config=None):",
        "        config = init_config or {}",
        "        self.data = deepcopy(_DATABASE)",
        "        self.responses = []",
        "        expected = deepcopy(_DATABASE)",
        "        for action in config.get('_ground_truth', []):",
        "            if action['name'] in _TOOLS and action['name'] not in _TERMINATE:",
        "                _invoke(expected, action['name'], action['kwargs'])",
        "        self._expected_data_hash = data_hash(expected)",
        "",
        "    def respond(self, content: str) -> str:",
        '        """Send a message to the user."""',
        "        self.responses.append(content)",
        '        return "sent"',
    ]
    for name, body, info in tools:
        params = _invoke_parameters(body, name)
        arguments = ", ".join(f"{p!r}: {p}" for p in params)
        signature = "".join(f", {p}=None" for p in params)
        parts += [
            "",
            f"    def {info['name']}(self{signature}):",
            f"        arguments = {{k: v for k, v in {{{arguments}}}.items() if v is not None}}",
            f"        return _invoke(self.data, {info['name']!r}, arguments)",
        ]
    return "\n".join(parts) + "\n"


def _scenarios(env_id: str, split: str, tasks: list[dict[str, Any]], tool_names: set[str],
               report: ImportReport) -> list[Scenario]:
    scenarios = []
    for index, task in enumerate(tasks):
        where = f"{env_id} {split} task {index}"
        actions = task.get("actions") or []
        outputs = [o for o in task.get("outputs") or [] if isinstance(o, str)]
        unknown = sorted({a.get("name") for a in actions if a.get("name") not in tool_names})
        if unknown:
            report.skipped.append(f"{where}: ground truth calls unknown tools {unknown}")
            continue
        checks = [CheckItem(item="The database equals the one the ground-truth actions produce",
                            check=_DATABASE_CHECK)]
        checks += [CheckItem(item=f"A message to the user contains {output!r}",
                             check=_OUTPUT_CHECK.format(output=output)) for output in outputs]
        solution = [ToolCall(name=a["name"], arguments=dict(a.get("kwargs") or {})) for a in actions]
        if outputs:
            solution.append(ToolCall(name="respond", arguments={"content": ". ".join(outputs)}))
        scenarios.append(Scenario(
            scenario_id=f"taubench-{env_id.removeprefix('taubench_')}-{split}-{index}",
            env_id=env_id,
            task=task["instruction"],
            init_config={"_ground_truth": [{"name": a["name"], "kwargs": a.get("kwargs") or {}} for a in actions],
                         "_user_id": task.get("user_id")},
            checklist=checks,
            reference_solution=solution,
            # tau-bench's reward gives 1.0 to an untouched database when the ground truth changes nothing
            # (a request the policy refuses); such a task then passes before any call, as it does there.
            unchanged_is_correct=not outputs,
            split=split,
            tags=("taubench", env_id.removeprefix("taubench_")),
        ))
    return scenarios


def import_taubench(checkout: Path, out: Path) -> ImportReport:
    """Write one package per domain of the tau-bench checkout ``checkout`` (every folder under
    ``tau_bench/envs`` with a ``tools`` folder: retail and airline) under ``out``.

    Raises:
        CatalogError: ``checkout`` holds no domain, or a domain's files cannot be read.
    """
    envs_root = Path(checkout) / "tau_bench" / "envs"
    present = sorted(p.parent.name for p in envs_root.glob("*/tools") if p.is_dir()) if envs_root.is_dir() else []
    if not present:
        raise CatalogError(f"{checkout} is not a tau-bench checkout: no tau_bench/envs/<domain>/tools",
                           path=str(checkout))
    report = ImportReport()
    for domain in present:
        domain_dir = envs_root / domain
        env_id = f"taubench_{domain}"
        try:
            tools = _tool_classes(domain_dir)
        except (OSError, SyntaxError, ValueError) as exc:
            raise CatalogError(f"cannot read the tools of {domain_dir}: {exc}", path=str(domain_dir)) from exc
        wiki = domain_dir / "wiki.md"
        introduction = wiki.read_text(encoding="utf-8") if wiki.is_file() else ""
        class_name = f"TauBench{domain.title()}"
        overrides: dict[str, dict[str, Any]] = {
            info["name"]: {k: info[k] for k in ("description", "parameters") if k in info} for _, _, info in tools
        }
        overrides["respond"] = _RESPOND
        env = build_environment(
            env_id=env_id, class_name=class_name, code=environment_code(class_name, tools, _database(domain_dir)),
            summary=f"tau-bench {domain}: the benchmark's tools and database", introduction=introduction,
            rules=_rules(domain_dir), tool_overrides=overrides,
        )
        catalog = Catalog()
        catalog.add_environment(env)
        for path in sorted(domain_dir.glob("tasks_*.py")):
            match = _SPLIT_FILE.match(path.name)
            if not match:
                continue
            for scenario in _scenarios(env_id, match.group(1), read_tasks(path), env.tool_names, report):
                catalog.add_scenario(scenario)
        write_package(env, catalog.scenarios_of(env_id), Path(out))
        report.environments += 1
        report.scenarios += len(catalog.scenarios)
    return report
