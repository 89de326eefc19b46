"""Prompt templates: ``synthesis/llm/prompts/<name>.txt``, rendered with ``string.Template``.

A template file has a ``[system]`` section and a ``[user]`` section. Values are
substituted as ``$name``; a literal dollar is ``$$``; a missing value is an
error, never a silent blank. A prompt carries a label (template, environment,
item) that never enters the text the model reads: the client sends it as an
HTTP header only when ``llm.label_header`` is configured (for endpoint logs,
and for the scripted test endpoint, which routes answers by it).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from synthesis.llm.client import Message

FOLDER = Path(__file__).with_name("prompts")


@dataclass(frozen=True)
class Prompt:
    template: str
    env: str
    item: str
    system: str
    user: str

    @property
    def label(self) -> str:
        return f"template={self.template} env={self.env} item={self.item}"

    def messages(self) -> list[Message]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]


@functools.cache
def _sections(name: str) -> tuple[Template, Template]:
    text = (FOLDER / f"{name}.txt").read_text(encoding="utf-8")
    head, sep, rest = text.partition("[system]\n")
    system, sep2, user = rest.partition("[user]\n")
    if head.strip() or not sep or not sep2:
        raise ValueError(f"prompt template {name}.txt needs a [system] then a [user] section")
    return Template(system.strip()), Template(user.strip())


def render(name: str, *, env: str, item: str = "main", **values: Any) -> Prompt:
    """Fill template ``name``. Non-string values are written as indented JSON.

    Raises:
        KeyError: the template uses a value that was not given.
    """
    texts = {k: v if isinstance(v, str) else json.dumps(v, indent=1, ensure_ascii=False) for k, v in values.items()}
    system, user = _sections(name)
    return Prompt(name, env, item, system.substitute(texts), user.substitute(texts))


def turn(name: str, **values: Any) -> str:
    """The user section of template ``name``: a later turn of a conversation another prompt started."""
    _, user = _sections(name)
    return user.substitute({k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for k, v in values.items()})


def reask(problem: str) -> str:
    """The follow-up sent after an answer that did not parse."""
    return turn("reask", problem=problem)


def cut_off(problem: str) -> str:
    """Appended to the original prompt after an answer cut off at the length limit (the cut text is not sent back)."""
    return turn("cut_off", problem=problem)


def shown(value: Any, limit: int = 6000) -> str:
    """``value`` as JSON for a prompt, cut at ``limit`` characters with a visible marker."""
    text = value if isinstance(value, str) else json.dumps(value, indent=1, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + f"\n... (cut: {len(text) - limit} more characters)"
