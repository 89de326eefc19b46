"""Listing scenarios at catalog scale: filters, a stable order and opaque cursors.

Scenarios are listed by id. A loaded catalog never changes once the server runs, so its index is
built once (one posting list per environment, split and tag) and the answer to each filter is
kept; a page is then a binary search and a slice. Scenarios a tenant added over the API live in
the store and are merged in per request, as every replica must see them (and their deletion) at
once; their number is bounded by the tenant's ``max_scenarios``.

The cursor is the last id of the page (keyset paging), not an offset: a scenario added or deleted
between two requests shifts no other scenario, so paging through never repeats or skips one that
exists throughout. It is opaque (base64 of the id and a digest of the filters) so clients do not
build it, and one made for other filters is refused instead of silently mixing two listings.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import json
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cachetools import LRUCache

from service.catalog.model import MAX_TAGS, CatalogError, Scenario, check_labels
from service.errors import InvalidRequest

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# Distinct filters whose answers are kept; each is a list of references into the index.
KEPT_ANSWERS = 256


def _sid(scenario: Scenario) -> str:
    return scenario.scenario_id


@dataclass(frozen=True)
class ScenarioQuery:
    """Scenarios of ``env`` (when given), in ``split`` (when given), carrying every one of ``tags``."""

    env: str | None = None
    split: str | None = None
    tags: tuple[str, ...] = ()

    def matches(self, scenario: Scenario) -> bool:
        return ((self.env is None or scenario.env_id == self.env)
                and (self.split is None or scenario.split == self.split)
                and all(tag in scenario.tags for tag in self.tags))

    def digest(self) -> str:
        text = json.dumps([self.env, self.split, sorted(set(self.tags))])
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def scenario_query(env: str | None = None, split: str | None = None, tags: Sequence[str] = ()) -> ScenarioQuery:
    """A query from request parameters (tags in any order, repeats ignored).

    Raises:
        InvalidRequest: naming ``split`` or ``tag``: a label outside the pattern, or more than MAX_TAGS tags.
    """
    distinct = sorted(set(tags))
    if len(distinct) > MAX_TAGS:
        raise InvalidRequest(f"tag: at most {MAX_TAGS} tags per query, got {len(distinct)}", field="tag",
                             limit="max_tags", value=MAX_TAGS)
    try:
        check_labels(split, distinct, where="query")
    except CatalogError as exc:
        raise InvalidRequest(exc.message.replace("tags[", "tag["), field="split" if exc.field == "split" else "tag",
                             ) from None
    return ScenarioQuery(env=env, split=split, tags=tuple(distinct))


def check_limit(limit: object) -> int:
    """Raises InvalidRequest naming ``limit`` when it is not an integer from 1 to MAX_LIMIT."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit: an integer from 1 to {MAX_LIMIT}", field="limit", limit="max_limit",
                             value=MAX_LIMIT)
    return limit


class ScenarioIndex:
    """The scenarios of a catalog that no longer changes, sorted by id, with posting lists."""

    def __init__(self, scenarios: Iterable[Scenario]) -> None:
        self._sorted = sorted(scenarios, key=_sid)
        self._postings: dict[tuple[str, str], list[int]] = {}
        for position, scenario in enumerate(self._sorted):
            keys = [("env", scenario.env_id), *(("tag", t) for t in scenario.tags)]
            if scenario.split is not None:
                keys.append(("split", scenario.split))
            for key in keys:
                self._postings.setdefault(key, []).append(position)
        self._answers: LRUCache[ScenarioQuery, list[Scenario]] = LRUCache(maxsize=KEPT_ANSWERS)

    def __len__(self) -> int:
        return len(self._sorted)

    def count(self, env_id: str) -> int:
        return len(self._postings.get(("env", env_id), ()))

    def matching(self, query: ScenarioQuery) -> Sequence[Scenario]:
        """Every indexed scenario ``query`` selects, by id."""
        keys = [("env", query.env)] if query.env is not None else []
        keys += [("split", query.split)] if query.split is not None else []
        keys += [("tag", tag) for tag in query.tags]
        if not keys:
            return self._sorted
        answer = self._answers.get(query)
        if answer is None:
            # Walk the shortest posting list and test the rest on each scenario: the cost is the
            # size of the narrowest filter, paid once per distinct query.
            shortest = min((self._postings.get(key, []) for key in keys), key=len)
            answer = [s for s in (self._sorted[p] for p in shortest) if query.matches(s)]
            self._answers[query] = answer
        return answer


@dataclass(frozen=True)
class Page:
    scenarios: list[Scenario]
    total: int
    last: str | None  # the id to continue after; None on the last page


def page(loaded: Sequence[Scenario], added: list[Scenario], after: str | None, limit: int) -> Page:
    """One page of two id-sorted lists merged (the catalog's and the tenant's), after the id ``after``."""
    heads = []
    for scenarios in (loaded, added):
        start = 0 if after is None else bisect_right(scenarios, after, key=_sid)
        heads.append(scenarios[start:start + limit + 1])
    merged = list(heapq.merge(*heads, key=_sid))[:limit + 1]
    more = len(merged) > limit
    items = merged[:limit]
    return Page(items, len(loaded) + len(added), items[-1].scenario_id if more and items else None)


def encode_cursor(query: ScenarioQuery, last: str) -> str:
    raw = json.dumps({"after": last, "q": query.digest()}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(query: ScenarioQuery, cursor: str) -> str:
    """The id a cursor continues after.

    Raises:
        InvalidRequest: naming ``cursor``: it is not one this service issued, or it was issued for
            other filters than ``query``.
    """
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        after, digest = data["after"], data["q"]
        if not isinstance(after, str) or not isinstance(digest, str):
            raise TypeError("cursor fields")
    except (binascii.Error, ValueError, TypeError, KeyError):
        raise InvalidRequest("cursor: not a cursor this service issued; pass the `next_cursor` of the previous "
                             "page unchanged", field="cursor") from None
    if digest != query.digest():
        raise InvalidRequest("cursor: it was issued for other filters; keep env, split and tag as they were on "
                             "the first page", field="cursor")
    return after
