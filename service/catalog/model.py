"""Environments and scenarios as a catalog holds them: the records, their JSON forms, their content
digests, and the catalog's errors.

A package on disk is read and written by ``service.catalog.folders``, submitted code is checked by
``service.catalog.admission``, and ``service.catalog.collection.Catalog`` holds the records by id.
Standard library only: the analysis child (``python -S``) imports it.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


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
        """Identifies the class code and what it requires: workers cache compiled classes under it.
        Kept while those fields hold the same values (every call asks for it; a builder may still
        change them)."""
        made_of = (self.class_name, self.code, tuple(self.requirements))
        kept = self.__dict__.get("_code_hash")
        if kept is not None and kept[0] == made_of:  # (the same strings: compared by identity first)
            return kept[1]  # type: ignore[no-any-return]
        text = f"{self.class_name}\0{self.code}"
        if self.requirements:  # (an environment without requirements keeps the hash it always had)
            text += "\0" + "\0".join(self.requirements)
        digest = hashlib.sha256(text.encode()).hexdigest()
        self.__dict__["_code_hash"] = (made_of, digest)
        return digest

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
