"""Typed answers to the JSON prompts, and their strict parsers (one per prompt template)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from synthesis.errors import ParseError
from synthesis.parsing import parse as p

DROP_CATEGORIES = ("open_qa", "chit_chat", "content_creation", "calculation", "other")


@dataclass(frozen=True)
class Theme:
    decision: str  # keep | drop
    category: str
    reason: str
    env_id: str = ""
    summary: str = ""
    introduction: str = ""
    usefulness: int = 0
    modelability: int = 0


def parse_theme(answer: str) -> Theme:
    data = p.obj(p.json_answer(answer), "the answer")
    decision = p.choice(data, "decision", "answer", ("keep", "drop"))
    reason = p.text(data, "reason", "answer")
    if decision == "drop":
        return Theme("drop", p.choice(data, "category", "answer", DROP_CATEGORIES), reason)
    env = p.obj(data.get("environment"), "answer.environment")
    return Theme(
        "keep", "stateful", reason,
        env_id=p.identifier(env.get("name"), "answer.environment.name"),
        summary=p.text(env, "summary", "environment", min_len=10, single_line=True),
        introduction=p.text(env, "introduction", "environment", min_len=40),
        usefulness=p.integer(env, "usefulness", "environment", 1, 10),
        modelability=p.integer(env, "modelability", "environment", 1, 10),
    )  # fmt: skip


@dataclass(frozen=True)
class Attribute:
    name: str
    type: str
    description: str


@dataclass(frozen=True)
class Entity:
    name: str
    container: str
    description: str
    attributes: list[Attribute]


@dataclass(frozen=True)
class StatePlan:
    class_name: str
    entities: list[Entity]
    settings: list[Attribute]
    rules: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "class_name": self.class_name,
            "entities": [{"name": e.name, "container": e.container, "description": e.description,
                          "attributes": [vars(a) for a in e.attributes]} for e in self.entities],
            "settings": [vars(a) for a in self.settings],
            "rules": list(self.rules),
        }  # fmt: skip


def _attributes(items: list[Any], where: str) -> list[Attribute]:
    out: list[Attribute] = []
    for i, raw in enumerate(items):
        entry = p.obj(raw, f"{where}[{i}]")
        out.append(Attribute(
            name=p.identifier(entry.get("name"), f"{where}[{i}].name"),
            type=p.text(entry, "type", f"{where}[{i}]"),
            description=p.text(entry, "description", f"{where}[{i}]"),
        ))  # fmt: skip
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise ParseError(f"{where} names an attribute twice")
    return out


def parse_state_plan(answer: str) -> StatePlan:
    data = p.obj(p.json_answer(answer), "the answer")
    class_name = p.identifier(data.get("class_name"), "answer.class_name", style="camel")
    entities = []
    for i, raw in enumerate(p.array(data, "entities", "answer", min_items=1, max_items=12)):
        entry = p.obj(raw, f"entities[{i}]")
        entities.append(Entity(
            name=p.identifier(entry.get("name"), f"entities[{i}].name", style="camel"),
            container=p.identifier(entry.get("container"), f"entities[{i}].container"),
            description=p.text(entry, "description", f"entities[{i}]"),
            attributes=_attributes(p.array(entry, "attributes", f"entities[{i}]", min_items=1), f"entities[{i}].attributes"),
        ))  # fmt: skip
    settings = _attributes(p.array(data, "settings", "answer"), "settings") if "settings" in data else []
    rules = [p.strip_bullet(r) for r in p.array(data, "rules", "answer", min_items=1) if isinstance(r, str)]
    if not all(rules):
        raise ParseError("answer.rules must be non-empty strings")
    containers = [e.container for e in entities] + [s.name for s in settings]
    if len(set(containers)) != len(containers):
        raise ParseError("two entities or settings share one attribute name")
    return StatePlan(class_name, entities, settings, rules)


@dataclass(frozen=True)
class Operation:
    name: str
    kind: str  # query | change
    description: str
    parameters: list[Attribute]


def parse_operation_plan(answer: str, reserved: set[str]) -> list[Operation]:
    """``reserved``: state attribute names, which a method must not shadow."""
    data = p.obj(p.json_answer(answer), "the answer")
    ops: list[Operation] = []
    for group, kind in (("queries", "query"), ("changes", "change")):
        for i, raw in enumerate(p.array(data, group, "answer", min_items=1, max_items=12)):
            entry = p.obj(raw, f"{group}[{i}]")
            name = p.identifier(entry.get("name"), f"{group}[{i}].name")
            if name in reserved:
                raise ParseError(f"{group}[{i}].name '{name}' is a state attribute; name the operation differently")
            params = _attributes(p.array(entry, "parameters", f"{group}[{i}]"), f"{group}[{i}].parameters")
            ops.append(Operation(name, kind, p.text(entry, "description", f"{group}[{i}]"), params))
    names = [op.name for op in ops]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ParseError(f"operation names must be unique; repeated: {', '.join(duplicates)}")
    return ops


@dataclass(frozen=True)
class ProbeCall:
    tool: str
    arguments: dict[str, Any]
    intent: str  # positive | negative
    expectation: str


def parse_probe_call(answer: str, tools: set[str]) -> ProbeCall:
    data = p.obj(p.json_answer(answer), "the answer")
    tool = data.get("tool")
    if tool not in tools:
        raise ParseError(f"answer.tool must be one of the listed tools ({', '.join(sorted(tools))}), not {json.dumps(tool)}")
    arguments = p.obj(data.get("arguments"), "answer.arguments")
    intent = p.choice(data, "intent", "answer", ("positive", "negative"))
    return ProbeCall(str(tool), arguments, intent, p.text(data, "expectation", "answer"))


@dataclass(frozen=True)
class Verdict:
    label: str  # pass | warning | fail
    reason: str


def parse_verdict(answer: str) -> Verdict:
    data = p.obj(p.json_answer(answer), "the answer")
    return Verdict(p.choice(data, "verdict", "answer", ("pass", "warning", "fail")), p.text(data, "reason", "answer"))


@dataclass(frozen=True)
class InitState:
    description: str
    init_config: dict[str, Any]


def parse_init_state(answer: str) -> InitState:
    """One state per answer: a long list of states in one answer is what runs past a real model's length limit."""
    data = p.obj(p.json_answer(answer), "the answer")
    config = p.obj(data.get("init_config"), "answer.init_config")
    if not config:
        raise ParseError("answer.init_config is empty; fill the containers with records")
    return InitState(p.text(data, "description", "answer"), config)


@dataclass(frozen=True)
class TaskSpec:
    task: str
    sub_goals: list[str]


def parse_task(answer: str) -> TaskSpec:
    data = p.obj(p.json_answer(answer), "the answer")
    goals = [p.strip_bullet(g) for g in p.array(data, "sub_goals", "answer", min_items=2, max_items=8) if isinstance(g, str)]
    if len(goals) < 2 or not all(goals):
        raise ParseError("answer.sub_goals must hold at least two non-empty strings")
    return TaskSpec(p.text(data, "task", "answer", min_len=40), goals)


@dataclass(frozen=True)
class ChecklistItem:
    item: str
    kind: str  # change: the task makes it true | keep: it holds before and must still hold after


def parse_checklist(answer: str) -> list[ChecklistItem]:
    """An empty checklist is a parse error: a scenario must be scorable (and nothing divides by zero)."""
    data = p.obj(p.json_answer(answer), "the answer")
    items = []
    for i, raw in enumerate(p.array(data, "checklist", "answer", min_items=1, max_items=10)):
        entry = p.obj(raw, f"checklist[{i}]")
        items.append(ChecklistItem(p.strip_bullet(p.text(entry, "item", f"checklist[{i}]", min_len=8)),
                                   p.choice(entry, "kind", f"checklist[{i}]", ("change", "keep"))))
    if not any(i.kind == "change" for i in items):
        raise ParseError("the checklist has no item of kind 'change'; the task must change the state")
    return items


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def parse_solution(answer: str, tools: set[str]) -> list[Call]:
    data = p.obj(p.json_answer(answer), "the answer")
    calls = []
    for i, raw in enumerate(p.array(data, "calls", "answer", min_items=1, max_items=40)):
        entry = p.obj(raw, f"calls[{i}]")
        name = entry.get("name")
        if name not in tools:
            raise ParseError(f"calls[{i}].name must be one of the tools ({', '.join(sorted(tools))}), not {json.dumps(name)}")
        calls.append(Call(str(name), p.obj(entry.get("arguments", {}), f"calls[{i}].arguments")))
    return calls


@dataclass(frozen=True)
class EnvTexts:
    summary: str
    introduction: str
    rules: list[str]


def parse_env_texts(answer: str, removed: list[str]) -> EnvTexts:
    """The rewritten texts of an environment whose ``removed`` tools are gone; none may name one of them."""
    data = p.obj(p.json_answer(answer), "the answer")
    summary = p.text(data, "summary", "answer", min_len=10, single_line=True)
    introduction = p.text(data, "introduction", "answer", min_len=20)
    rules = [p.text({"rule": r}, "rule", f"answer.rules[{i}]") for i, r in enumerate(p.array(data, "rules", "answer", min_items=1))]
    for name in removed:
        where = [f for f, t in (("summary", summary), ("introduction", introduction), *((f"rules[{i}]", r) for i, r in enumerate(rules)))
                 if name in t]  # fmt: skip
        if where:
            raise ParseError(f"{', '.join('answer.' + w for w in where)} still names the removed tool {name}")
    return EnvTexts(summary, introduction, rules)
