"""The key naming one initial state: same tenant, same environment code, same ``init_config``.

Sandbox workers build the instance of a key once (a *template*) and start every session made
from it as a fork of it, so the key must never name two different configs, and should cost
little next to what a create costs otherwise: a config carried in a request body is 3 MB of
JSON for tau-bench's databases, parsed once by the API, and the key must not cost that again.

``marshal`` writes a config (plain JSON data: dicts, lists, strings, numbers) in C at a fraction
of what ``json.dumps`` takes, and what it writes reads back as an equal value of the same types,
dict order included, so equal bytes mean the same config. (Two equal configs may still write
different bytes, where Python shares or interns a string in one and not the other: that costs a
template built twice, never a session started from the wrong state.) A config ``marshal`` cannot
write is keyed by its JSON text instead.

The same pass finds text that is not valid Unicode (a lone surrogate, which a JSON body can carry
as an escape): ``marshal`` writes strings as UTF-8 with surrogates passed through, whose bytes
(``ED A0``-``ED BF``) valid UTF-8 never holds. Those bytes may also come from a number's binary
form, so a match is confirmed the slow way.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import re
from typing import Any

_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")
SCENARIO_KEYS = 4096  # scenarios whose key ``TemplateKeys`` keeps


class NotUnicode(ValueError):
    """The config holds text that is not valid Unicode (a lone surrogate)."""


def config_key(tenant: str, code_hash: str, config: dict[str, Any]) -> str:
    """The template key of ``config`` for ``tenant``'s environment of ``code_hash``.

    Raises:
        NotUnicode: the config holds a lone surrogate.
    """
    digest = hashlib.sha256()
    digest.update(json.dumps([tenant, code_hash]).encode())
    try:
        data = marshal.dumps(config)
    except ValueError:  # not plain data: its JSON text, as keys were made before
        text = json.dumps(config, sort_keys=True, ensure_ascii=False, default=repr)
        digest.update(b"json\0" + _utf8(text))
    else:
        if b"\xed" in data and _SURROGATE.search(data) is not None:
            _utf8(json.dumps(config, ensure_ascii=False, default=repr))  # raises if it is text
        digest.update(b"marshal\0" + data)
    return digest.hexdigest()[:32]


class TemplateKeys:
    """Each scenario's key, kept while its config is the same object, so that a large scenario is not
    keyed again for every session made from it; a config from a request body is keyed every time."""

    def __init__(self) -> None:
        # (tenant, scenario) -> (its config, the code hash, its key)
        self._kept: dict[tuple[str, str], tuple[dict[str, Any], str, str]] = {}

    def key(self, tenant: str, code_hash: str, scenario_id: str | None, config: dict[str, Any]) -> str:
        """Raises NotUnicode: the config holds a lone surrogate."""
        if scenario_id is not None:
            known = self._kept.get((tenant, scenario_id))
            if known is not None and known[0] is config and known[1] == code_hash:
                return known[2]
        key = config_key(tenant, code_hash, config)
        if scenario_id is not None:
            self._kept[(tenant, scenario_id)] = (config, code_hash, key)
            while len(self._kept) > SCENARIO_KEYS:
                self._kept.pop(next(iter(self._kept)))
        return key


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise NotUnicode("init_config contains text that is not valid Unicode (a lone surrogate)") from None
