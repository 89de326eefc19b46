"""Tools proven read-only from their source: every way a tool could change the state, directly,
through an alias, through a module or a builtin, leaves it unproven; and a proof stops holding
once code has replaced what it relied on."""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Iterator

import pytest

from sandbox.state.readonly import ReadOnly
from sandbox.worker.resident import LiveSession

HEADER = '''
import random

KEPT = []


def helper(env):
    env.items.clear()


class Env:
    LIMITS = {"max": 3}

    def __init__(self, config=None):
        self.items = {"a": {"tags": [1], "n": 1}, "b": {"tags": [2], "n": 2}}
        self.log = []

    @property
    def size(self):
        self.log.append("size")
        return len(self.items)

    def _touch(self):
        self.log.append("touched")

    def _look(self, key):
        return self.items.get(key)

    def _need(self, key):
        item = self.items.get(key)
        if item is None:
            raise KeyError(key)
        return item

    def _or_log(self, key):
        item = self.items.get(key)
        if item is None:
            return self.log
        return item
'''

PROVEN = {
    "lookup": "return self.items[key]",
    "get_default": "return self.items.get(key, {})",
    "loop": """
        found = []
        for name, item in self.items.items():
            if item["n"] > 0 and name.startswith(key[:0]):
                found.append({"name": name, **item})
        found.sort(key=lambda entry: entry["name"])
        return found""",
    "count": """
        total = 0
        for item in self.items.values():
            total += item["n"]
        return {"total": total, "text": f"{total} of {len(self.items)}"}""",
    "made_dict": """
        out = {}
        out[key] = sorted(self.items)
        del out[key]
        return dict(out, limit=self.LIMITS["max"])""",
    "fallback": """
        try:
            return self.items[key]["tags"][0]
        except (KeyError, IndexError):
            raise ValueError(f"no item {key!r}")""",
    "calls_reader": "return self._look(key)",
    "comprehension": "return [t for item in self.items.values() for t in item['tags'] if t != len(key)]",
}

UNPROVEN = {
    "store": 'self.items[key]["n"] = 0',
    "alias_store": 'item = self.items[key]\n        item["n"] = 0',
    "append": 'self.log.append(key)',
    "alias_append": 'tags = self.items[key]["tags"]\n        tags.append(1)',
    "alias_iadd": 'tags = self.items[key]["tags"]\n        tags += [1]',
    "made_then_alias": 'tags = []\n        tags = self.log\n        tags.append(1)',
    "attribute": 'self.count = 1',
    "bound_method": 'f = self.items.pop\n        f(key)',
    "map_append": 'list(map(self.log.append, [1, 2]))',
    "getattr": 'getattr(self.items, "clear")()',
    "module_function": 'helper(self)',
    "module_list": 'KEPT.append(self.items)',
    "module_random": 'random.shuffle(self.log)',
    "global_name": 'global KEPT\n        KEPT = self.items',
    "setattr": 'setattr(self, "x", 1)',
    "with_file": 'with open("/dev/null") as f:\n            return f.read()',
    "nested_def": 'def inner():\n            self.log.append(1)\n        inner()',
    "calls_changer": 'self._touch()',
    "delete": 'del self.items[key]',
    "property": 'return self.size',
    "walrus": 'if (tags := self.items[key]["tags"]):\n            tags.append(1)',
    "setdefault": 'self.items.setdefault(key, {})',
    "loop_update": 'for item in self.items.values():\n            item.update(n=0)',
    "comprehension_clear": '[item.clear() for item in self.items.values()]',
    "dunder": 'self.items.__setitem__(key, 1)',
    "type_store": 'type(self).LIMITS = {}',
    "lambda_default": 'f = lambda tags=self.log: tags.append(1)\n        f()',
    "shadowed_builtin": 'len = lambda x: x.clear()\n        len(self.log)',
    "eval_code": 'eval("self.log.append(1)")',
    "unknown_method": 'return self.items[key]["tags"].__class__',
    "generator": 'yield self.items',
    "call_result": 'self.items.get(key)()',
}


CONFINED = {
    "close": ('self.items[key]["n"] = 0', {("items", "key")}),
    "alias": ('item = self.items[key]\n        item["n"] += 1\n        item["tags"].append(len(key))',
              {("items", "key")}),
    "replace": ('self.items[key] = {"tags": [key, 1], "n": int(key or 0)}', {("items", "key")}),
    "deep_alias": ('tags = self.items[key]["tags"]\n        tags.extend([1, 2])\n        return self._look(key)',
                   {("items", "key")}),
    "drop": ('del self.items[key]["tags"]', {("items", "key")}),
    "checked_helper": ('item = self._need(key)\n        item["n"] = 0', {("items", "key")}),
    "setdefault_below": ('item = self.items.get(key)\n        if item is None:\n            return None\n'
                         '        item.setdefault("log", []).append(key)', {("items", "key")}),
    "setdefault_entry": ('self.items.setdefault(key, {"tags": [], "n": 0})["tags"].append(1)', {("items", "key")}),
    "literal_default": ('item = self.items.get(key, {})\n        item["n"] = 1', {("items", "key")}),
}

NOT_CONFINED = {
    "share": 'self.items[key]["tags"] = self.items["a"]["tags"]',
    "share_entry": 'self.items[key] = self.items["a"]',
    "copy_in": 'self.items[key]["tags"] = list(self.items["a"]["tags"])',
    "other_key": 'self.items[self.items[key]["n"]]["n"] = 0',
    "whole_dict": 'self.items.pop(key)',
    "made_list": 'found = [self.items["a"]]\n        self.items[key]["all"] = found',
    "class_attribute": 'self.LIMITS[key] = 1',
    "rebind": 'key = "a"\n        self.items[key]["n"] = 0',
    "log": 'self.items[key]["n"] = 0\n        self.log.append(key)',
    "setdefault_shared": 'self.items[key].setdefault("tags", self.log).append(1)',
    "setdefault_entry_shared": 'self.items.setdefault(key, self.items["a"])["n"] = 0',
    "default_of_the_state": 'item = self.items.get(key, self.log)\n        item.append(1)',
    "helper_or_log": 'item = self._or_log(key)\n        item.append(1)',
}


def _source(tools: dict[str, str]) -> str:
    body = "".join(f"\n    def {name}(self, key=''):\n        {code.strip()}\n" for name, code in tools.items())
    return HEADER + body


@pytest.fixture
def compiled() -> Iterator[tuple[types.ModuleType, str]]:
    source = _source({**PROVEN, **UNPROVEN, **{name: code for name, (code, _) in CONFINED.items()},
                      **NOT_CONFINED})
    module = types.ModuleType("readonlyenv")
    exec(compile(source, "<env readonly>", "exec"), module.__dict__)
    sys.modules["readonlyenv"] = module
    yield module, source
    del sys.modules["readonlyenv"]


def test_reads_are_proven_and_every_way_to_change_is_not(compiled: tuple[types.ModuleType, str]) -> None:
    module, source = compiled
    tools = ReadOnly(module, source, module.Env).tools
    assert set(PROVEN) <= tools
    assert not tools & set(UNPROVEN), sorted(tools & set(UNPROVEN))


def test_a_proof_stops_holding_when_what_it_relied_on_is_replaced(
        compiled: tuple[types.ModuleType, str], monkeypatch: pytest.MonkeyPatch) -> None:
    module, source = compiled
    proof = ReadOnly(module, source, module.Env)
    assert proof.proven("count") and proof.proven("calls_reader")
    with monkeypatch.context() as patch:
        patch.setattr(builtins, "len", lambda value: 0)
        assert not proof.proven("count")
    with monkeypatch.context() as patch:
        patch.setattr(module, "sorted", lambda value: value, raising=False)
        assert not proof.proven("made_dict")
    with monkeypatch.context() as patch:
        patch.setattr(module.Env, "_look", lambda self, key: self.items.clear())
        assert not proof.proven("calls_reader")
    with monkeypatch.context() as patch:
        patch.setattr(module.Env.lookup, "__code__", module.Env.store.__code__)
        assert not proof.proven("lookup")
    with monkeypatch.context() as patch:
        patch.setitem(module.Env.LIMITS, "max", object())
        assert not proof.proven("made_dict")
    with monkeypatch.context() as patch:
        patch.setattr(module.Env, "items", property(lambda self: {}), raising=False)
        assert not proof.proven("lookup")
    assert proof.proven("count") and proof.proven("made_dict") and proof.proven("lookup")


def test_a_proven_read_on_a_live_session_answers_without_looking_at_the_state(
        compiled: tuple[types.ModuleType, str], monkeypatch: pytest.MonkeyPatch) -> None:
    module, source = compiled
    session = LiveSession(module, module.Env, ReadOnly(module, source, module.Env))
    first, _ = session.handle({"op": "init", "init_config": {}})
    assert session.parts is not None and session.parts.watched
    looked: list[str] = []
    original = type(session.parts).watch
    monkeypatch.setattr(type(session.parts), "watch",
                        lambda self, state, footprint=None: looked.append("x") or original(self, state, footprint))
    answer, kept = session.handle({"op": "call", "name": "loop", "arguments": {"key": "a"}})
    assert kept and answer["ok"] and answer["state"] is None and len(answer["result"]) == 2
    assert looked == []
    answer, _ = session.handle({"op": "call", "name": "append", "arguments": {"key": "z"}})
    assert answer["state"] is not None and '"z"' in answer["state"] and looked == ["x"]


def test_writes_confined_to_named_entries_are_proven_so_and_no_others(compiled: tuple[types.ModuleType, str]) -> None:
    module, source = compiled
    proof = ReadOnly(module, source, module.Env)
    for name, (_, footprint) in CONFINED.items():
        assert name in proof.confined, name
        assert proof.confined[name][0] == footprint, name
    assert not set(NOT_CONFINED) & set(proof.confined), sorted(set(NOT_CONFINED) & set(proof.confined))
    assert not set(UNPROVEN) & set(proof.confined) - {"store", "alias_store", "alias_append", "alias_iadd",
                                                       "setdefault", "delete"}
    assert proof.footprint("close", {"key": "b"}) == {"items": {"b"}}
    assert proof.footprint("close", {"key": 3}) is None  # a key that is not a string: no proof
