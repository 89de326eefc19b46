"""Tools' signatures are kept between calls (``sandbox.state.signatures``), and a tool whose
parameters or defaults code replaced is bound by what it has now: what a confined write's
footprint names follows its defaults, so a kept stale signature would miss a change."""

from __future__ import annotations

import functools
import inspect
import json
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.state.readonly import ReadOnly
from sandbox.state.signatures import signature
from sandbox.worker.resident import LiveSession

CODE = '''
class Env:
    def __init__(self, config=None):
        self.items = {"a": {"n": 1}, "b": {"n": 2}}

    def close(self, key="a"):
        self.items[key]["n"] = 0
        return {"success": True}

    def retarget(self, key: str):
        type(self).close.__defaults__ = (key,)
        return {"success": True}

    def reshape(self):
        def close(self, first, key="b"):
            self.items[key]["n"] = first
            return {"success": True}
        type(self).close.__code__ = close.__code__
        type(self).close.__defaults__ = close.__defaults__
        return {"success": True}
'''


def _shape(made: inspect.Signature) -> list[tuple[str, object]]:
    return [(p.name, None if p.default is p.empty else p.default) for p in made.parameters.values()]


@pytest.fixture
def env_module() -> Iterator[types.ModuleType]:
    module = types.ModuleType("ef_signatures_env")
    sys.modules[module.__name__] = module
    exec(compile(CODE, "<ef_signatures_env>", "exec"), module.__dict__)
    yield module
    sys.modules.pop(module.__name__, None)


def test_a_signature_is_kept_until_the_function_changes() -> None:
    def tool(self: object, key: str = "a") -> str:
        return key

    class Holder:
        pass

    method = types.MethodType(tool, Holder())
    first = signature(method)
    assert signature(method) is first and _shape(first) == [("key", "a")]
    tool.__defaults__ = ("b",)
    assert _shape(signature(method)) == [("key", "b")]

    def other(self: object, first: int, *, key: str = "c") -> None:
        pass

    tool.__code__, tool.__defaults__, tool.__kwdefaults__ = other.__code__, None, {"key": "c"}
    assert _shape(signature(method)) == [("first", None), ("key", "c")]
    tool.__kwdefaults__["key"] = "d"  # (in place: keyword-only defaults are never kept)
    assert _shape(signature(method)) == [("first", None), ("key", "d")]


def test_a_decorated_tool_is_bound_as_inspect_binds_it() -> None:
    def inner(self: object, key: str) -> str:
        return key

    @functools.wraps(inner)
    def wrapper(*args: object, **kwargs: object) -> object:
        return inner(*args, **kwargs)  # type: ignore[arg-type]

    class Holder:
        pass

    method = types.MethodType(wrapper, Holder())
    assert _shape(signature(method)) == [("key", None)]
    with pytest.raises(TypeError):
        signature(method).bind(other="x")


def test_a_write_whose_defaults_were_replaced_changes_what_a_plain_run_changes(env_module: types.ModuleType) -> None:
    cls = env_module.Env
    session = LiveSession(env_module, cls, ReadOnly(env_module, CODE, cls))
    session.handle({"op": "init", "init_config": {}})
    assert session.parts is not None and session.parts.watched
    assert session.readonly is not None and "close" in session.readonly.confined

    def items() -> dict[str, dict[str, int]]:
        return json.loads(session.text)["items"]  # type: ignore[no-any-return]

    calls = [("close", {}), ("retarget", {"key": "b"}), ("close", {}), ("reshape", {}), ("close", {"first": 7})]
    plain = cls()
    for name, arguments in calls:
        answer, kept = session.handle({"op": "call", "name": name, "arguments": arguments})
        assert kept and answer["ok"], answer
        getattr(plain, name)(**arguments)
        assert items() == plain.items, (name, items(), plain.items)
    assert plain.items == {"a": {"n": 0}, "b": {"n": 7}}


def test_a_host_keeps_its_tools_signatures_before_forking_sessions(env_module: types.ModuleType,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.state import signatures

    signatures.warm(env_module.Env)
    made: list[object] = []
    real = inspect.signature
    monkeypatch.setattr(signatures.inspect, "signature", lambda target: made.append(target) or real(target))
    instance = env_module.Env()
    assert _shape(signature(instance.close)) == [("key", "a")] and _shape(signature(env_module.Env.retarget)) == \
        [("self", None), ("key", None)]
    assert made == []  # both were kept by ``warm``, none made for the session


def test_arguments_are_told_to_bind_only_where_inspect_binds_them() -> None:
    from sandbox.state.signatures import binds

    class Tools:
        def plain(self, a: int, b: int = 2, *, c: int = 3) -> None: ...
        def required_kw(self, a: int, *, c: int) -> None: ...
        def positional(self, a: int, /, b: int = 1) -> None: ...
        def star(self, *args: Any, **kwargs: Any) -> None: ...
        def none(self) -> None: ...

    tools = Tools()
    tries: list[dict[str, Any]] = [{}, {"a": 1}, {"a": 1, "b": 2}, {"a": 1, "c": 3}, {"b": 2}, {"a": 1, "d": 4},
                                   {"c": 1}, {"self": 1}, {"a": 1, "b": 2, "c": 3, "x": 0}, {"args": 1}]
    told = 0
    for name in ("plain", "required_kw", "positional", "star", "none"):
        method = getattr(tools, name)
        for arguments in tries:
            try:
                inspect.signature(method).bind(**arguments)
                bound = True
            except TypeError:
                bound = False
            if binds(method, arguments):
                told += 1
                assert bound, (name, arguments)
            elif name not in ("positional", "star"):  # (told for every simple signature, either way)
                assert not bound, (name, arguments)
    assert told == 5  # plain: 3, required_kw: 1, none: 1
