"""Versions of environments and scenarios, named by the digest of their content.

An id names the latest version; ``id@<digest prefix>`` or ``id@<label>`` names one version for
ever. Every version is kept as a record of its own (``<id>@<full digest>``) beside the id's
latest, so a session, a dataset line or a rollout that recorded a digest finds exactly the code,
checks and initial state it ran with, whatever was added under the id since.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from service.errors import InvalidRequest, NotFound

SEPARATOR = "@"
MIN_PREFIX = 6  # hex digits a digest prefix needs (fewer would match too much)
SHORT = 12  # the prefix shown where a version is named for people
LABEL = r"[A-Za-z][A-Za-z0-9_.-]{0,63}"
LABEL_PATTERN = f"^{LABEL}$"
REFERENCE_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,127}}(@([0-9a-f]{{{MIN_PREFIX},64}}|{LABEL}))?$"
_HEX = re.compile(r"[0-9a-f]+")


class Versioned(Protocol):
    @property
    def version(self) -> str: ...

    label: str
    added_at: float


V = TypeVar("V", bound=Versioned)


def check_label(label: str | None) -> None:
    """Raises InvalidRequest for a label that could be read as a digest prefix."""
    if label is not None and _HEX.fullmatch(label):
        raise InvalidRequest(f"a version label cannot be all hex digits ('{label}' reads as a digest prefix)",
                             field="label")


def split(reference: str) -> tuple[str, str | None]:
    """(id, selector) of ``id`` or ``id@selector``."""
    name, _, selector = reference.partition(SEPARATOR)
    return name, (selector or None) if SEPARATOR in reference else None


def key(name: str, version: str) -> str:
    """The record key of one version."""
    return f"{name}{SEPARATOR}{version}"


def chosen(kind: str, name: str, selector: str, versions: Sequence[V]) -> V:
    """The version ``selector`` (a label, a full digest or a prefix of one) names among ``versions``.

    Raises:
        NotFound: no version matches.
        InvalidRequest: a prefix that matches several versions, or is too short to name one.
    """
    labelled = [v for v in versions if v.label and v.label == selector]
    if labelled:
        return labelled[0]
    if not _HEX.fullmatch(selector):
        raise NotFound(f"{kind} '{name}' has no version labelled '{selector}'")
    if len(selector) < MIN_PREFIX:
        raise InvalidRequest(f"a version prefix needs at least {MIN_PREFIX} hex digits: '{name}@{selector}'",
                             field="version")
    matching = {v.version: v for v in versions if v.version.startswith(selector)}
    if not matching:
        raise NotFound(f"{kind} '{name}' has no version '{selector}'")
    if len(matching) > 1:
        raise InvalidRequest(f"'{name}@{selector}' names {len(matching)} versions; give more of the digest",
                             field="version")
    return next(iter(matching.values()))


def tool_changes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Tools added, removed, and changed (description or parameters) from ``before`` to ``after``."""
    old = {t["function"]["name"]: t["function"] for t in before}
    new = {t["function"]["name"]: t["function"] for t in after}
    return {"added": sorted(new.keys() - old.keys()), "removed": sorted(old.keys() - new.keys()),
            "changed": sorted(n for n in old.keys() & new.keys() if old[n] != new[n])}
