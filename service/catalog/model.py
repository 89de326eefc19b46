"""Environments and scenarios: the package format on disk and the in-memory catalog.

A package is a folder per environment::

    <env_id>/env.py           the class source (never imported by the API process)
    <env_id>/env.json         {env_id, class_name, summary, introduction, rules, tools?, requirements?}
    <env_id>/scenarios.jsonl  one scenario per line

``tools`` in ``env.json`` is optional: a mapping of tool name to fields
(``description``, ``parameters``) that replace what static analysis extracted.
``requirements`` is optional too: the packages the code imports beyond the standard library
(see ``service.catalog.requirements``).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import secrets
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from service.catalog.schema import SchemaError, extract_tools
from service.catalog import outside_state


class CatalogError(Exception):
    """A package or record is malformed. ``field`` names the offending part, ``reason`` the kind."""

    def __init__(self, message: str, *, field: str | None = None, path: str | None = None,
                 reason: str = "invalid") -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.path = path
        self.reason = reason


class ConflictError(CatalogError):
    """An id is already taken by a different definition."""


CHECK_KINDS = ("change", "keep")
# A split ("test", "train", a benchmark category) and tags ("retail", "bfcl") select scenarios in
# listings and rollouts. Short, URL-safe words: they travel in query strings and cursors unescaped.
LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
MAX_TAGS = 16
_LABEL = re.compile(LABEL_PATTERN)


def check_labels(split: Any, tags: Any, where: str = "scenario") -> tuple[str | None, tuple[str, ...]]:
    """The split and tags of a scenario record, validated.

    Raises:
        CatalogError: naming ``split`` or ``tags`` (a wrong type, a character outside the pattern,
            more than MAX_TAGS tags, a tag given twice).
    """
    if split is not None and not (isinstance(split, str) and _LABEL.fullmatch(split)):
        raise CatalogError(f"{where}: split must match {LABEL_PATTERN} (1-64 letters, digits, '_.:-')",
                           field="split", path=where)
    if tags is None:
        return split, ()
    if not isinstance(tags, list):
        raise CatalogError(f"{where}: tags must be a list of strings", field="tags", path=where)
    if len(tags) > MAX_TAGS:
        raise CatalogError(f"{where}: at most {MAX_TAGS} tags, got {len(tags)}", field="tags", path=where)
    for i, tag in enumerate(tags):
        if not (isinstance(tag, str) and _LABEL.fullmatch(tag)):
            raise CatalogError(f"{where}: tags[{i}] must match {LABEL_PATTERN} (1-64 letters, digits, '_.:-')",
                               field=f"tags[{i}]", path=where)
    if len(set(tags)) != len(tags):
        raise CatalogError(f"{where}: tags must not repeat", field="tags", path=where)
    return split, tuple(tags)


@dataclass(frozen=True)
class CheckItem:
    item: str
    check: str
    # What the check is about, when its author said: a state the agent must bring about ("change"),
    # or one it must leave as it was ("keep", which passes on the initial state too).
    kind: str | None = None


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Turn:
    """One user turn of a turn-based scenario (see ``service.engine.turns``): its message, the tools that
    become available from it on, the checks run when the agent ends it, and its part of the
    reference solution."""

    message: str
    tools: tuple[str, ...] = ()
    checklist: tuple[CheckItem, ...] = ()
    reference_solution: tuple[ToolCall, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"message": self.message}
        if self.tools:
            data["tools"] = list(self.tools)
        data["checklist"] = [_check_json(c) for c in self.checklist]
        if self.reference_solution is not None:
            data["reference_solution"] = [{"name": c.name, "arguments": c.arguments} for c in self.reference_solution]
        return data


MAX_TURNS = 100


def _check_json(c: CheckItem) -> dict[str, Any]:
    return {"item": c.item, "check": c.check, **({"kind": c.kind} if c.kind else {})}


@dataclass
class Scenario:
    scenario_id: str
    env_id: str
    task: str
    init_config: dict[str, Any]
    checklist: list[CheckItem] = field(default_factory=list)
    reference_solution: list[ToolCall] | None = None
    # The correct outcome may leave the state as it was (a benchmark task whose answer is to refuse):
    # validation then notes, rather than reports, checks that pass before any call.
    unchanged_is_correct: bool = False
    split: str | None = None
    tags: tuple[str, ...] = ()
    # A turn-based scenario's user turns, in order (none: the task is given at once).
    turns: tuple[Turn, ...] = ()
    label: str = ""  # a name its adder gave this version (not part of the content)
    added_at: float = 0.0  # when this version was added over the API (0: a loaded catalog's)

    @cached_property
    def version(self) -> str:
        """The digest of what the scenario is: its environment, initial state, task, checks and
        reference solution (labels such as ``split`` and ``tags`` are not part of it)."""
        data = self.to_json()
        fields = VERSIONED_FIELDS + (TURN_FIELDS if self.turns else ())
        return content_digest({k: data.get(k) for k in fields})

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "scenario_id": self.scenario_id,
            "env_id": self.env_id,
            "task": self.task,
            "init_config": self.init_config,
            "checklist": [{"item": c.item, "check": c.check, **({"kind": c.kind} if c.kind else {})}
                          for c in self.checklist],
        }
        if self.reference_solution is not None:
            data["reference_solution"] = [
                {"name": c.name, "arguments": c.arguments} for c in self.reference_solution
            ]
        if self.unchanged_is_correct:
            data["unchanged_is_correct"] = True
        # Left out when unset, so records and content ids written before labels existed stay the same.
        if self.split is not None:
            data["split"] = self.split
        if self.tags:
            data["tags"] = list(self.tags)
        if self.turns:
            data["turns"] = [t.to_json() for t in self.turns]
        return data

    @classmethod
    def from_json(cls, data: Any, *, where: str = "scenario") -> Scenario:
        if not isinstance(data, dict):
            raise CatalogError(f"{where} must be a JSON object", path=where)
        if "task" not in data and isinstance(data.get("turns"), list) and data["turns"]:
            # A turn-based scenario's task is its first turn's message unless it says otherwise.
            first = data["turns"][0]
            data = {**data, "task": first.get("message", "") if isinstance(first, dict) else ""}
        for key in ("env_id", "task", "init_config"):
            if key not in data:
                raise CatalogError(f"{where} lacks '{key}'", field=key, path=where)
        if not isinstance(data["init_config"], dict):
            raise CatalogError(f"{where}: init_config must be an object", field="init_config", path=where)
        checklist = _checklist(data.get("checklist"), where, "checklist")
        solution = _solution(data.get("reference_solution"), where, "reference_solution")
        turns = turns_from_json(data.get("turns"), where)
        if turns and any(t.reference_solution is not None for t in turns):
            # The whole episode's solution is its turns' in order (what a replay of the calls alone runs).
            solution = [call for t in turns for call in t.reference_solution or ()]
        split, tags = check_labels(data.get("split"), data.get("tags"), where)
        # Without an id, derive one from the content: every replica and restart must agree on it.
        scenario_id = data.get("scenario_id") or content_scenario_id(data)
        return cls(
            scenario_id=str(scenario_id),
            env_id=str(data["env_id"]),
            task=str(data["task"]),
            init_config=data["init_config"],
            checklist=checklist,
            reference_solution=solution,
            unchanged_is_correct=data.get("unchanged_is_correct") is True,
            split=split,
            tags=tags,
            turns=turns,
        )


def _checklist(value: Any, where: str, name: str) -> list[CheckItem]:
    checklist = []
    if value is not None and not isinstance(value, list):
        raise CatalogError(f"{where}: {name} must be a list", field=name, path=where)
    for i, entry in enumerate(value or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("check"), str):
            raise CatalogError(f"{where}: {name}[{i}] must be {{item, check}}", field=f"{name}[{i}]", path=where)
        kind = entry.get("kind")
        if kind is not None and kind not in CHECK_KINDS:
            raise CatalogError(f"{where}: {name}[{i}].kind must be 'change' or 'keep'",
                               field=f"{name}[{i}].kind", path=where)
        checklist.append(CheckItem(item=str(entry.get("item", "")), check=entry["check"], kind=kind))
    return checklist


def _solution(value: Any, where: str, name: str) -> list[ToolCall] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise CatalogError(f"{where}: {name} must be a list", field=name, path=where)
    solution = []
    for i, call in enumerate(value):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise CatalogError(f"{where}: {name}[{i}] must be {{name, arguments}}", field=f"{name}[{i}]", path=where)
        arguments = call.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                raise CatalogError(f"{where}: {name}[{i}].arguments is not JSON: {exc}",
                                   field=f"{name}[{i}]", path=where) from exc
        if not isinstance(arguments, dict):
            raise CatalogError(f"{where}: {name}[{i}].arguments must be an object", field=f"{name}[{i}]", path=where)
        solution.append(ToolCall(name=call["name"], arguments=arguments))
    return solution


def turns_from_json(value: Any, where: str) -> tuple[Turn, ...]:
    """A scenario's ``turns``, validated; each problem names its field (``turns[2].tools[0]``)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise CatalogError(f"{where}: turns must be a list", field="turns", path=where)
    if len(value) > MAX_TURNS:
        raise CatalogError(f"{where}: at most {MAX_TURNS} turns, got {len(value)}", field="turns", path=where)
    turns = []
    for i, entry in enumerate(value):
        name = f"turns[{i}]"
        if not isinstance(entry, dict):
            raise CatalogError(f"{where}: {name} must be an object", field=name, path=where)
        message = entry.get("message", "")
        if not isinstance(message, str):
            raise CatalogError(f"{where}: {name}.message must be a string", field=f"{name}.message", path=where)
        tools = entry.get("tools") or []
        if not isinstance(tools, list):
            raise CatalogError(f"{where}: {name}.tools must be a list of tool names", field=f"{name}.tools",
                               path=where)
        for j, tool in enumerate(tools):
            if not isinstance(tool, str):
                raise CatalogError(f"{where}: {name}.tools[{j}] must be a tool name", field=f"{name}.tools[{j}]",
                                   path=where)
        solution = _solution(entry.get("reference_solution"), where, f"{name}.reference_solution")
        turns.append(Turn(message=message, tools=tuple(tools),
                          checklist=tuple(_checklist(entry.get("checklist"), where, f"{name}.checklist")),
                          reference_solution=None if solution is None else tuple(solution)))
    return tuple(turns)


@dataclass
class Environment:
    env_id: str
    class_name: str
    code: str
    summary: str = ""
    introduction: str = ""
    rules: list[str] = field(default_factory=list)
    tool_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    provenance: dict[str, Any] | None = None  # what synthesis recorded (its assessment), when it made the package
    # Which registration of the id this is: "" for a loaded catalog, a fresh token each time the
    # id is added over the API, so a session made from a deleted registration stays dead when the
    # id is added again.
    registration: str = ""
    requirements: list[str] = field(default_factory=list)  # packages it declares (PEP 508)
    imports: list[str] = field(default_factory=list)  # what the code imports beyond the standard library
    layers: tuple[str, ...] = ()  # where its requirements are installed, once they are (``service.catalog.packages.layers``)
    label: str = ""  # a name its adder gave this version (``env_id@label``)
    added_at: float = 0.0  # when this version was added over the API (0: a loaded catalog's)

    @property
    def code_hash(self) -> str:
        """Identifies the class code and what it requires: workers cache compiled classes under it."""
        text = f"{self.class_name}\0{self.code}"
        if self.requirements:  # (an environment without requirements keeps the hash it always had)
            text += "\0" + "\0".join(self.requirements)
        return hashlib.sha256(text.encode()).hexdigest()

    @cached_property
    def version(self) -> str:
        """The digest of what the environment is: its code, the tools its schema shows, its rules and
        what it requires. Names one version of ``env_id`` for ever (``env_id@<digest prefix>``)."""
        return content_digest({"class_name": self.class_name, "code": self.code, "tools": self.tools,
                               "summary": self.summary, "introduction": self.introduction, "rules": self.rules,
                               "requirements": self.requirements})

    @property
    def tool_names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    def tool(self, name: str) -> dict[str, Any] | None:
        for t in self.tools:
            if t["function"]["name"] == name:
                return t
        return None

    def manifest(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "env_id": self.env_id,
            "class_name": self.class_name,
            "summary": self.summary,
            "introduction": self.introduction,
            "rules": list(self.rules),
        }
        if self.tool_overrides:
            data["tools"] = self.tool_overrides
        if self.provenance:
            data["provenance"] = self.provenance
        if self.requirements:
            data["requirements"] = list(self.requirements)
        return data


VERSIONED_FIELDS = ("env_id", "task", "init_config", "checklist", "reference_solution", "unchanged_is_correct")
# A turn-based scenario's turns are part of what it is too; a scenario without them keeps the digest it had.
TURN_FIELDS = ("turns",)


def content_digest(data: Any) -> str:
    """SHA-256 of ``data`` as canonical JSON (sorted keys, no spaces): the same content, the same digest."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def new_scenario_id() -> str:
    return "scn_" + secrets.token_hex(8)


def content_scenario_id(data: dict[str, Any]) -> str:
    digest = hashlib.sha256(
        json.dumps([data.get("env_id"), data.get("task"), data.get("init_config")], sort_keys=True).encode()
    ).hexdigest()
    return "scn_" + digest[:16]


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


class Catalog:
    """Environments and scenarios by id. Ids are unique across the catalog."""

    def __init__(self) -> None:
        self.environments: dict[str, Environment] = {}
        self.scenarios: dict[str, Scenario] = {}
        self.problems: list[str] = []
        self.origins: dict[str, Path] = {}  # env_id -> the catalog folder it was loaded from
        # Bumped on every change, so indexes built over the catalog know when to rebuild.
        self.version = 0

    def add_environment(self, env: Environment) -> bool:
        """Add ``env``; return False when the same definition is already present.

        Raises:
            ConflictError: the id is taken by different code.
        """
        existing = self.environments.get(env.env_id)
        if existing is not None:
            if existing.code_hash != env.code_hash:
                raise ConflictError(f"environment '{env.env_id}' already exists with different code", field="env_id")
            return False
        self.environments[env.env_id] = env
        return True

    def add_scenario(self, scenario: Scenario) -> bool:
        """Add ``scenario``; return False when an identical one is already present.

        Raises:
            CatalogError: the env is unknown (``field='env_id'``) or a check does not parse.
            ConflictError: the id is taken by a different scenario.
        """
        if scenario.env_id not in self.environments:
            raise CatalogError(f"unknown environment '{scenario.env_id}'", field="env_id")
        for i, check in enumerate(scenario.checklist):
            parse_check(check.check, field_name=f"checklist[{i}].check")
        check_turns(scenario, self.environments[scenario.env_id])
        existing = self.scenarios.get(scenario.scenario_id)
        if existing is not None:
            if existing.to_json() != scenario.to_json():
                raise ConflictError(
                    f"scenario '{scenario.scenario_id}' already exists with different content", field="scenario_id"
                )
            return False
        self.scenarios[scenario.scenario_id] = scenario
        self.version += 1
        return True

    def scenarios_of(self, env_id: str) -> list[Scenario]:
        return [s for s in self.scenarios.values() if s.env_id == env_id]

    def load_dir(self, root: Path) -> None:
        """Load every package under ``root`` (a package folder or a folder of them).

        A broken package or scenario is skipped and described in ``problems``, so one bad
        record does not take a whole catalog down.

        Raises:
            CatalogError: ``root`` is not a folder.
        """
        root = Path(root)
        if not root.is_dir():
            raise CatalogError(f"catalog folder not found: {root}", path=str(root))
        folders = [root] if (root / "env.json").is_file() else sorted(
            p for p in root.iterdir() if (p / "env.json").is_file()
        )
        for folder in folders:
            try:
                env, scenarios, problems = read_package(folder)
                self.add_environment(env)
                self.origins.setdefault(env.env_id, root.resolve())
            except CatalogError as exc:
                self.problems.append(f"{exc.path or folder}: {exc.message} (package skipped)")
                continue
            self.problems.extend(problems)
            for scenario in scenarios:
                try:
                    self.add_scenario(scenario)
                except CatalogError as exc:
                    self.problems.append(f"{exc.path or folder / 'scenarios.jsonl'}: {scenario.scenario_id}: "
                                         f"{exc.message} (scenario skipped)")


def read_package(folder: Path) -> tuple[Environment, list[Scenario], list[str]]:
    """Read one package folder: the environment, its readable scenarios, and what was wrong with the rest.

    Raises:
        CatalogError: the environment itself is unusable; ``path`` names the file at fault.
    """
    manifest_path = folder / "env.json"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CatalogError(f"cannot read {manifest_path}: {exc}", path=str(manifest_path)) from exc
    for key in ("env_id", "class_name"):
        if not isinstance(manifest.get(key), str):
            raise CatalogError(f"{manifest_path} lacks '{key}'", field=key, path=str(manifest_path))
    code_path = folder / "env.py"
    try:
        code = code_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"cannot read {code_path}: {exc}", path=str(code_path)) from exc
    try:
        env = build_environment(
            env_id=manifest["env_id"],
            class_name=manifest["class_name"],
            code=code,
            summary=manifest.get("summary", ""),
            introduction=manifest.get("introduction", ""),
            rules=manifest.get("rules", []),
            tool_overrides=manifest.get("tools"),
            requirements=_requirements(manifest.get("requirements"), manifest_path),
        )
    except CatalogError as exc:
        exc.path = str(code_path)
        raise
    if isinstance(manifest.get("provenance"), dict):
        env.provenance = manifest["provenance"]
    scenarios: list[Scenario] = []
    problems: list[str] = []
    scen_path = folder / "scenarios.jsonl"
    if scen_path.is_file():
        for lineno, line in enumerate(scen_path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{scen_path}:{lineno}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"{where}: invalid JSON: {exc} (scenario skipped)")
                continue
            try:
                scenario = Scenario.from_json(data, where=where)
            except CatalogError as exc:
                problems.append(f"{exc.message} (scenario skipped)")
                continue
            if scenario.env_id != env.env_id:
                problems.append(f"{where}: env_id '{scenario.env_id}' does not match the package '{env.env_id}' "
                                "(scenario skipped)")
                continue
            scenarios.append(scenario)
    return env, scenarios, problems


def _requirements(value: Any, where: Path) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise CatalogError(f"{where}: requirements must be a list of strings", field="requirements", path=str(where))
    return list(value)


def write_package(env: Environment, scenarios: list[Scenario], out: Path) -> Path:
    """Write ``env`` and its scenarios as a package folder under ``out``; return the folder."""
    folder = Path(out) / env.env_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "env.py").write_text(env.code, encoding="utf-8")
    (folder / "env.json").write_text(json.dumps(env.manifest(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    lines = [json.dumps(s.to_json(), ensure_ascii=False) for s in scenarios]
    (folder / "scenarios.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return folder


def bundled_catalog_dir() -> Path:
    """The catalog shipped with the project (a checkout's ``catalog/`` or the wheel's copy)."""
    service_root = Path(__file__).resolve().parents[1]
    for candidate in (service_root / "bundled_catalog", service_root.parent / "catalog"):
        if candidate.is_dir():
            return candidate
    raise CatalogError("the bundled catalog is missing from this installation")
