"""Entries named the ways classes commonly name them are confined as a subscript is: ``.get``
with a local alias (a literal default too), helpers that check and give an entry back,
``setdefault`` below an entry or of a new one; and each near miss (a default that is part of the
state, a helper that may give back something else, an alias bound again) is not. Each proof is
checked by running the tool (``test_proof_soundness.unsound``)."""

from __future__ import annotations

from sandbox.state.readonly import ReadOnly
from tests.sandbox.test_proof_soundness import _compiled, _source, unsound


def _assert_confined(cases: dict[str, str]) -> None:
    """Each tool body is proven to change only ``items[key]``, and runs as proven (a key present or not)."""
    for name, body in cases.items():
        module = _compiled(_source("n = 0\n" + body))
        assert module is not None
        proof = ReadOnly(module, _source("n = 0\n" + body), module.Env)
        assert proof.footprint("tool", {"key": "a", "other": "b"}) == {"items": {"a"}}, name
        for key in ("a", "zz"):
            assert unsound("n = 0\n" + body, key, "b") is None, name


def test_an_entry_named_through_get_is_confined_as_a_subscript_is() -> None:
    """``a = self.accounts.get(p); a["note"] = x``, the way tools are commonly written, is proven
    as ``self.accounts[p]["note"] = x`` is, and so is an entry a helper of one ``return`` gives
    back (the bundled catalog's ``self._lookup(self.accounts, p)``); a default that could be part
    of the state is not."""
    confined = {
        "get": "r = self.items.get(key)\nif r is None:\n    return 'none'\nr['n'] = 5",
        "get_none": "r = self.items.get(key, None)\nif not r:\n    return 'none'\nr['tags'].append(1)",
        "below": "t = self.items.get(key)['tags']\nt.append(n)",
        "chained": "self.items.get(key)['n'] += 1",
    }
    _assert_confined(confined)
    helped = {
        "own_attribute": "r = self._look(key)\nif r is None:\n    return 'none'\nr['n'] = 5",
        "given_table": "r = self._lookup(self.items, key)\nif not r:\n    return 'none'\nr['tags'].append(n)",
        "below": "t = self._lookup(self.items, key)['tags']\nt.append(1)",
        "local_first": "r = self._first(self.items, key)\nif r is None:\n    return 'none'\nr['n'] = 5",
        "checks_then_returns": "r = self._require(key)\nr['tags'].append(n)",
        "local_or_none": "r = self._found(key)\nif r:\n    r['n'] = 5",
    }
    _assert_confined(helped)
    # A table that is no attribute of the instance; a helper that may give back another part of
    # the state, whose local is bound again, that gives back two entries, or a default of the
    # state: no proof.
    for body in ("y = self.seen\nr = self._lookup(y, key)\nr['n'] = 5", "r = self._stray(key)\nr.append(1)",
                 "r = self._rebound(key)\nr['n'] = 5", "r = self._either(key, other)\nr['n'] = 5",
                 "r = self._fallback(key)\nr.append(1)"):
        module = _compiled(_source(body))
        assert module is not None
        assert ReadOnly(module, _source(body), module.Env).footprint("tool", {"key": "a", "other": "b"}) is None, body
        assert unsound(body, "zz", "b") is None, body
    for default in ("self.seen", "self.items['b']", "key", "[self.log]", "{'k': self.seen}", "(*self.log,)"):
        body = f"r = self.items.get(key, {default})\nr['n'] = 5"
        module = _compiled(_source(body))
        assert module is not None
        assert ReadOnly(module, _source(body), module.Env).footprint("tool", {"key": "zz", "other": "b"}) is None, default
    for default in ("{}", "[]", "{'tags': []}"):  # a new object at each call: nothing of the state
        body = f"r = self.items.get(key, {default})\nr['n'] = 5"
        module = _compiled(_source(body))
        assert module is not None
        assert ReadOnly(module, _source(body), module.Env).footprint("tool", {"key": "zz", "other": "b"}) == \
            {"items": {"zz"}}, default
        for key in ("a", "zz"):
            assert unsound(body, key, "b") is None, default


def test_setdefault_and_get_of_an_entry_are_within_it() -> None:
    """``a.setdefault("history", []).append(x)``, ``a.get("tags", [])`` and
    ``self.accounts.setdefault(p, {...})`` name the entry they are of (or one they add, or a
    new default); a default that is part of the state, or one passed unpacked, is no proof."""
    confined = {
        "setdefault_below": "r = self.items.get(key)\nif r is None:\n    return\nr.setdefault('log', []).append(n)",
        "get_below": "self.items[key].get('tags', []).append(1)",
        "get_alias": "t = self.items[key].get('tags')\nt.append(n)",
        "setdefault_store": "self.items[key].setdefault('seen', {})['k'] = n",
        "setdefault_entry": "self.items.setdefault(key, {'tags': [], 'n': 0})['n'] += 1",
        "setdefault_alias": "r = self.items.setdefault(key, {})\nr['n'] = 5",
    }
    _assert_confined(confined)
    unproven = {
        "state_default": "self.items[key].setdefault('tags', self.log).append(1)",
        "get_state_default": "self.items[key].get('tags', self.log).append(1)",
        "entry_default": "self.items.setdefault(key, self.items['b'])['n'] = 1",
        "unpacked": "self.items[key].setdefault(*['tags', self.log]).append(1)",
        "unpacked_get": "self.items[key].get(*['tags', self.log]).append(1)",
        "class_attribute": "self.LIMITS.setdefault(key, []).append(1)",
        "constant_key": "self.items.setdefault('a', {})['n'] = 1",
        "private": "self._hidden.setdefault(key, []).append(1)",
        "rebound": "t = self.items[key].get('tags')\nt = self.log\nt.append(1)",
        "keyword": "self.items[key].setdefault('tags', default=self.log)",
    }
    for name, body in unproven.items():
        module = _compiled(_source(body))
        assert module is not None
        proof = ReadOnly(module, _source(body), module.Env)
        assert not proof.proven("tool") and proof.footprint("tool", {"key": "a", "other": "b"}) is None, name
