"""Refusing environment code that keeps state outside the instance, before anything runs.

A session's instance is stored as its attributes (``public_state``) and rebuilt from them
whenever its live process is gone: after an eviction, on another replica, after a restart, for
a fork or a group. Whatever a call keeps anywhere else is lost then, silently: a counter kept on
the class (``Order.next_id += 1``) issues id 1 again and overwrites order 1. So such code is
refused at registration, with the line, the construct and the fix. What is checked, in every
method of every class in the module and in every module-level function a method calls:

- ``global`` names written (``global _next_id; _next_id += 1``);
- class attributes written or replaced (``Order.next_id += 1``, ``type(self).price = f``,
  ``self.__class__.x = 1``, ``cls.x = 1``), and objects kept on a class changed
  (``Order.registry[k] = v``);
- a class-level container changed through ``self`` (class body ``registry = {}``, a method
  ``self.registry[k] = v``) when no method of its class hierarchy binds ``self.registry`` (the
  common class-level default shadowed in ``__init__`` is fine);
- module-level objects changed (``ITEMS.append(x)``, ``CONFIG["k"] = v``), also through a local
  alias (``items = ITEMS; items.append(x)``);
- a mutable default argument changed (``def add(self, tags=[]): tags.append(...)``);
- iterators kept on the module or the class drawn from (``_ids = itertools.count(1)``);
- ``functools.lru_cache`` / ``functools.cache`` on methods: the cache outlives the state it was
  computed from, in the live process only.

Left to the replay check (``service.catalog.rebuilds``), which runs the reference solutions with a
rebuild before every call: state reached in ways a static reading cannot follow, such as an
instance attribute aliasing a module-level object (``self.items = ITEMS``, then ``ITEMS`` read
by name), closures (``nonlocal``), or a module-level object's own methods. ``cached_property``
is fine: its value is an attribute of the instance, and stored with it.

Standard library only: it runs in the analysis child (``python -S``).
"""

from __future__ import annotations

import ast

from service.catalog.module_bindings import ModuleBindings
from service.catalog.state_writes import Finding, WriteChecker

REASON = "state_outside_instance"
MAX_FINDINGS = 10


def findings(code: str) -> list[Finding]:
    """What in ``code`` keeps state outside the instance, in line order (empty when the code does
    not parse: the tool extraction reports that)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    try:
        found = WriteChecker(ModuleBindings(tree)).run()
    except RecursionError:
        return []
    unique = {(f.line, f.construct, f.problem): f for f in found}
    return sorted(unique.values(), key=lambda f: (f.line, f.construct))


def problem_text(found: list[Finding]) -> str:
    """The refusal's message: one line per finding, at most MAX_FINDINGS."""
    lines = [f.message() for f in found[:MAX_FINDINGS]]
    if len(found) > MAX_FINDINGS:
        lines.append(f"... and {len(found) - MAX_FINDINGS} more")
    return "\n".join(lines)

