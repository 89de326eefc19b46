"""Tools' signatures, kept: ``inspect.signature`` costs more than many a tool's whole call.

A plain function's signature is made of its code and its defaults (the very objects: a signature
holds them, and ``apply_defaults`` hands them out), so it is kept while the function has the same
code and the same defaults tuple. A function with keyword-only defaults (a dict, which can change
in place), one carrying attributes (``__wrapped__``, ``__signature__``, set by decorators) and any
other callable are looked at each time. Standard library only.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

KEPT = 1024  # (distinct tool functions of one process: a class's tools, and a few more)
_kept: dict[tuple[int, bool], tuple[types.CodeType, tuple[Any, ...] | None, inspect.Signature]] = {}


def signature(target: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature(target)``, for a plain function or a method bound to one."""
    bound = type(target) is types.MethodType
    function = getattr(target, "__func__", None) if bound else target
    if type(function) is not types.FunctionType or function.__dict__ or function.__kwdefaults__:
        return inspect.signature(target)
    code, defaults = function.__code__, function.__defaults__
    key = (id(code), bound)
    found = _kept.get(key)
    if found is not None and found[0] is code and found[1] is defaults:
        return found[2]
    made = inspect.signature(target)
    if len(_kept) >= KEPT:
        _kept.clear()
    _kept[key] = (code, defaults, made)
    return made


SIMPLE = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
# Of a kept signature (held here too, so its id names it alone): its parameters' names and those
# without a default, or None when it has other kinds (``bind`` then says).
_shapes: dict[int, tuple[inspect.Signature, frozenset[str], frozenset[str]] | None] = {}


def binds(target: Callable[..., Any], arguments: dict[str, Any]) -> bool:
    """Whether ``target(**arguments)`` certainly binds: every argument names a parameter and
    every parameter without a default is named. False: not told here (``bind`` tells, and words
    the problem), as for any signature with positional-only or variadic parameters."""
    made = signature(target)
    key = id(made)
    if key in _shapes:
        shape = _shapes[key]
        if shape is not None and shape[0] is not made:
            shape = _shapes[key] = _shape(made)
    else:
        if len(_shapes) >= KEPT:
            _shapes.clear()
        shape = _shapes[key] = _shape(made)
    if shape is None:
        return False
    _, names, required = shape
    named = arguments.keys()
    return required <= named and named <= names


def _shape(made: inspect.Signature) -> tuple[inspect.Signature, frozenset[str], frozenset[str]] | None:
    parameters = made.parameters.values()
    if any(p.kind not in SIMPLE for p in parameters):
        return None
    return made, frozenset(p.name for p in parameters), frozenset(p.name for p in parameters if p.default is p.empty)


def warm(cls: type) -> None:
    """Keep the signatures of ``cls``'s tools (its public plain functions, as themselves and as
    methods) now: in a host, before it forks sessions, so that no session makes its own (each
    rebuilt session would, on its first call of each tool). Runs no code of the class."""
    holder = object()
    for klass in cls.__mro__:
        for name, found in vars(klass).items():
            if not name.startswith("_") and type(found) is types.FunctionType:
                try:
                    signature(found)
                    signature(types.MethodType(found, holder))
                except (TypeError, ValueError):
                    continue  # (a signature ``inspect`` cannot make: the call says so, as before)
