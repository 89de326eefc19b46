"""Listing scenarios at catalog scale: filters by environment, split and tag; cursor paging; bounds; tenants."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api.auth import new_key
from service.catalog.collection import Catalog
from service.catalog.model import Scenario
from service.catalog.scenario_index import ScenarioIndex, ScenarioQuery, decode_cursor, encode_cursor, page
from tests.conftest import BUNDLED, FIXTURES, keyed_server
from tests.in_process import AppServer, start_app
from tests.service.test_api import problem

SHELF = '''
class Shelf:
    def __init__(self, items=None):
        self.items = dict(items or {})

    def put(self, name: str) -> dict:
        """Put an item on the shelf."""
        self.items[name] = True
        return {"success": True}
'''
PER_ENV = 130  # two environments: more than two pages of the default size together
SPLITS = ("train", "test", "dev")


def labels(env: str, i: int) -> tuple[str, list[str]]:
    tags = [env, "even" if i % 2 == 0 else "odd"] + (["fizz"] if i % 3 == 0 else [])
    return SPLITS[i % 3], tags


def write_catalog(root: Path) -> dict[str, dict[str, Any]]:
    """Two environments of PER_ENV labelled scenarios each, with ids interleaved across them."""
    expected: dict[str, dict[str, Any]] = {}
    for env in ("shelf_a", "shelf_b"):
        folder = root / env
        folder.mkdir(parents=True)
        (folder / "env.py").write_text(SHELF)
        (folder / "env.json").write_text(json.dumps({"env_id": env, "class_name": "Shelf"}))
        lines = []
        for i in range(PER_ENV):
            split, tags = labels(env, i)
            sid = f"s-{i:04d}-{env[-1]}"
            record = {"scenario_id": sid, "env_id": env, "task": f"put {i}", "init_config": {}, "split": split,
                      "tags": tags}
            lines.append(json.dumps(record))
            expected[sid] = record
        (folder / "scenarios.jsonl").write_text("\n".join(lines) + "\n")
    return expected


@dataclass
class Listing:
    server: AppServer
    a: str  # tenant a's admin key
    b: str  # tenant b's admin key
    expected: dict[str, dict[str, Any]]

    def as_(self, key: str) -> httpx.Client:
        return self.server.client(headers={"Authorization": f"Bearer {key}"})


@pytest.fixture(scope="module", params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def listing(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listing]:
    tmp = tmp_path_factory.mktemp("listing")
    expected = write_catalog(tmp / "catalog")
    key_a, line_a = new_key("acme", ["run", "admin"])
    key_b, line_b = new_key("umbrella", ["run", "admin"])
    for server in keyed_server(request, tmp, f"{line_a}\n{line_b}\n", {},
                               catalogs=(BUNDLED, FIXTURES, tmp / "catalog"), start=start_app):
        yield Listing(server, key_a, key_b, expected)


def every_page(http: httpx.Client, path: str, params: dict[str, Any]) -> tuple[list[dict[str, Any]], int, int]:
    """Follow next_cursor to the end: the scenarios, the total the first page gave, and the number of pages."""
    seen: list[dict[str, Any]] = []
    body = http.get(path, params=params).raise_for_status().json()
    total, pages = body["total"], 1
    seen += body["scenarios"]
    while body["next_cursor"] is not None:
        assert len(body["scenarios"]) == params.get("limit", len(body["scenarios"]))
        body = http.get(path, params={**params, "cursor": body["next_cursor"]}).raise_for_status().json()
        assert body["total"] == total
        seen += body["scenarios"]
        pages += 1
    return seen, total, pages


def ids_of(scenarios: list[dict[str, Any]]) -> list[str]:
    return [s["scenario_id"] for s in scenarios]


def visible_catalog_ids(http: httpx.Client) -> list[str]:
    return ids_of(every_page(http, "/v1/scenarios", {"limit": 1000})[0])


def test_paging_through_everything_gives_each_scenario_once_in_id_order(listing: Listing) -> None:
    with listing.as_(listing.a) as http:
        everything = visible_catalog_ids(http)
        assert set(listing.expected) <= set(everything)  # the bundled and fixture catalogs are served too
        seen, total, pages = every_page(http, "/v1/scenarios", {"limit": 7})
    assert ids_of(seen) == everything == sorted(everything)
    assert total == len(everything) and pages == -(-total // 7)
    one = next(s for s in seen if s["scenario_id"] == "s-0003-a")
    assert one == {"scenario_id": "s-0003-a", "env_id": "shelf_a", "task": "put 3", "split": "train",
                   "tags": ["shelf_a", "odd", "fizz"]}


def test_the_next_link_carries_the_filters_and_reaches_the_same_pages(listing: Listing) -> None:
    with listing.as_(listing.a) as http:
        first = http.get("/v1/scenarios", params={"split": "test", "tag": "even", "limit": 5}).json()
        assert first["next"].startswith("/v1/scenarios?")
        followed = http.get(first["next"]).json()
        by_cursor = http.get("/v1/scenarios", params={"split": "test", "tag": "even", "limit": 5,
                                                      "cursor": first["next_cursor"]}).json()
    assert followed == by_cursor and ids_of(followed["scenarios"])[0] > ids_of(first["scenarios"])[-1]
    assert all(s["split"] == "test" and "even" in s["tags"] for s in followed["scenarios"])


@pytest.mark.parametrize("params", [
    {"env": "shelf_b"},
    {"split": "dev"},
    {"tag": "fizz"},
    {"tag": ["odd", "fizz"]},
    {"env": "shelf_a", "split": "train", "tag": ["even"]},
    {"split": "nosuch"},
])
def test_filters_select_exactly_the_matching_scenarios(listing: Listing, params: dict[str, Any]) -> None:
    tags = params.get("tag", [])
    tags = [tags] if isinstance(tags, str) else tags
    want = sorted(sid for sid, s in listing.expected.items()
                  if params.get("env", s["env_id"]) == s["env_id"] and params.get("split", s["split"]) == s["split"]
                  and all(t in s["tags"] for t in tags))
    with listing.as_(listing.b) as http:
        seen, total, _ = every_page(http, "/v1/scenarios", {**params, "limit": 9})
    assert ids_of(seen) == want and total == len(want)


def test_the_environment_route_pages_the_same_way_and_keeps_its_shape(listing: Listing) -> None:
    with listing.as_(listing.a) as http:
        whole = http.get("/v1/environments/shelf_a/scenarios").json()  # no limit: as before paging
        assert len(whole["scenarios"]) == whole["total"] == PER_ENV and whole["next_cursor"] is None
        assert set(whole["scenarios"][0]) >= {"scenario_id", "env_id", "task"}
        paged, total, pages = every_page(http, "/v1/environments/shelf_a/scenarios", {"limit": 50, "split": "dev"})
        assert total == len([i for i in range(PER_ENV) if i % 3 == 2]) and pages == 1
        assert ids_of(paged) == sorted(s for s, r in listing.expected.items()
                                       if r["env_id"] == "shelf_a" and r["split"] == "dev")
        problem(http.get("/v1/environments/nosuch/scenarios"), 404, "not-found")
        problem(http.get("/v1/scenarios", params={"env": "nosuch"}), 404, "not-found")
        counts = {e["env_id"]: e["scenario_count"] for e in http.get("/v1/environments").json()["environments"]}
        assert counts["shelf_a"] == counts["shelf_b"] == PER_ENV


@pytest.mark.parametrize(("params", "field"), [
    ({"limit": 0}, "limit"),
    ({"limit": 1001}, "limit"),
    ({"limit": "many"}, "limit"),
    ({"split": "no spaces"}, "split"),
    ({"split": "x" * 65}, "split"),
    ({"tag": "semi;colon"}, "tag"),
    ({"tag": [f"t{i}" for i in range(17)]}, "tag"),
    ({"cursor": "not-a-cursor"}, "cursor"),
    ({"cursor": "x" * 513}, "cursor"),
])
def test_bad_listing_parameters_are_422_naming_the_parameter(listing: Listing, params: dict[str, Any],
                                                             field: str) -> None:
    with listing.as_(listing.a) as http:
        body = problem(http.get("/v1/scenarios", params=params), 422, "invalid-request")
        assert body["errors"][0]["field"] == field if "errors" in body else body["field"] == field
        assert field in body["detail"]


def test_a_cursor_is_refused_with_other_filters(listing: Listing) -> None:
    with listing.as_(listing.a) as http:
        cursor = http.get("/v1/scenarios", params={"split": "test", "limit": 3}).json()["next_cursor"]
        body = problem(http.get("/v1/scenarios", params={"split": "dev", "limit": 3, "cursor": cursor}), 422,
                       "invalid-request")
    assert body["field"] == "cursor" and "other filters" in body["detail"]


def test_added_scenarios_are_merged_in_order_and_only_their_tenant_sees_them(listing: Listing) -> None:
    with listing.as_(listing.a) as a, listing.as_(listing.b) as b:
        before_b = visible_catalog_ids(b)
        # Ids that fall between the catalog's, so the merge is exercised on every page.
        added = [f"s-{i:04d}-m" for i in range(0, PER_ENV, 10)]
        for sid in added:
            created = a.post("/v1/scenarios", json={"scenario_id": sid, "env_id": "shelf_a", "task": "mine",
                                                    "split": "test", "tags": ["acme-only"]})
            assert created.status_code == 201, created.text
            assert created.json()["split"] == "test" and created.json()["tags"] == ["acme-only"]
        try:
            seen, total, _ = every_page(a, "/v1/scenarios", {"limit": 11})
            assert ids_of(seen) == sorted(set(before_b) | set(added)) and total == len(before_b) + len(added)
            mine, _, _ = every_page(a, "/v1/scenarios", {"tag": "acme-only", "limit": 4})
            assert ids_of(mine) == added
            both, _, _ = every_page(a, "/v1/scenarios", {"env": "shelf_a", "split": "test", "limit": 6})
            want = sorted([s for s, r in listing.expected.items() if r["env_id"] == "shelf_a" and r["split"] == "test"]
                          + added)
            assert ids_of(both) == want
            assert visible_catalog_ids(b) == before_b
            assert every_page(b, "/v1/scenarios", {"tag": "acme-only"})[1] == 0
            counts = {e["env_id"]: e["scenario_count"] for e in a.get("/v1/environments").json()["environments"]}
            assert counts["shelf_a"] == PER_ENV + len(added)
        finally:
            for sid in added:
                assert a.delete(f"/v1/scenarios/{sid}").status_code == 204
        assert visible_catalog_ids(a) == before_b


def test_a_tenants_environment_and_its_scenarios_stay_hidden_from_others(listing: Listing) -> None:
    with listing.as_(listing.a) as a, listing.as_(listing.b) as b:
        assert a.post("/v1/environments", json={"env_id": "acme_shelf", "class_name": "Shelf",
                                                "code": SHELF}).status_code == 201
        try:
            assert a.post("/v1/scenarios", json={"scenario_id": "acme-1", "env_id": "acme_shelf",
                                                 "task": "t"}).status_code == 201
            assert ids_of(a.get("/v1/scenarios", params={"env": "acme_shelf"}).json()["scenarios"]) == ["acme-1"]
            problem(b.get("/v1/scenarios", params={"env": "acme_shelf"}), 404, "not-found")
            problem(b.get("/v1/environments/acme_shelf/scenarios"), 404, "not-found")
            assert "acme-1" not in visible_catalog_ids(b)
        finally:
            a.delete("/v1/scenarios/acme-1")
            a.delete("/v1/environments/acme_shelf")


@pytest.mark.parametrize(("labels_", "field"), [
    ({"split": "has space"}, "split"),
    ({"tags": ["ok", "bad/slash"]}, "tags.1"),
    ({"tags": ["dup", "dup"]}, "tags"),
    ({"tags": [f"t{i}" for i in range(17)]}, "tags"),
    ({"tags": "notalist"}, "tags"),
])
def test_a_scenario_with_bad_labels_is_422_and_not_stored(listing: Listing, labels_: dict[str, Any],
                                                          field: str) -> None:
    with listing.as_(listing.a) as http:
        response = http.post("/v1/scenarios", json={"scenario_id": "bad-labels", "env_id": "shelf_a", "task": "t",
                                                    **labels_})
        assert problem(response, 422, "invalid-request")["errors"][0]["field"] == field
        problem(http.get("/v1/scenarios/bad-labels"), 404, "not-found")


# -- in process: the index, paging while scenarios come and go, and the package format --------------------------
def scenario(sid: str, env: str = "e", split: str | None = None, tags: tuple[str, ...] = ()) -> Scenario:
    return Scenario(scenario_id=sid, env_id=env, task="t", init_config={}, split=split, tags=tags)


def test_keyset_paging_neither_repeats_nor_skips_when_others_come_and_go() -> None:
    stable = [scenario(f"k{i:03d}") for i in range(0, 60, 2)]
    added = [scenario(f"k{i:03d}") for i in range(1, 60, 6)]
    query = ScenarioQuery()
    index = ScenarioIndex(stable)
    seen: list[str] = []
    after = None
    while True:
        found = page(index.matching(query), added, after, 4)
        seen += [s.scenario_id for s in found.scenarios]
        if found.last is None:
            break
        after = decode_cursor(query, encode_cursor(query, found.last))
        added = [s for s in added if s.scenario_id != "k031"] + [scenario("k000a")]  # one goes, one comes before
        added.sort(key=lambda s: s.scenario_id)
    assert len(seen) == len(set(seen))
    assert {s.scenario_id for s in stable} <= set(seen)
    assert seen == sorted(seen)


def test_the_index_answers_filters_as_a_scan_would() -> None:
    scenarios = [scenario(f"x{i:04d}", env=f"e{i % 4}", split=SPLITS[i % 3],
                          tags=tuple(t for t, on in (("a", i % 2 == 0), ("b", i % 5 == 0)) if on))
                 for i in range(500)]
    index = ScenarioIndex(reversed(scenarios))
    queries = [ScenarioQuery(), ScenarioQuery(env="e1"), ScenarioQuery(split="dev", tags=("a",)),
               ScenarioQuery(env="e2", tags=("a", "b")), ScenarioQuery(tags=("none",)), ScenarioQuery(env="e9")]
    for query in queries:
        want = sorted((s for s in scenarios if query.matches(s)), key=lambda s: s.scenario_id)
        assert list(index.matching(query)) == want
        assert list(index.matching(query)) == want  # the kept answer
    assert index.count("e3") == 125


def test_labels_round_trip_and_a_bad_one_skips_only_its_scenario(tmp_path: Path) -> None:
    root = tmp_path / "cat"
    write_catalog(root)
    lines = (root / "shelf_a" / "scenarios.jsonl").read_text().splitlines()
    broken = json.loads(lines[0]) | {"tags": ["fine", "not fine"]}
    (root / "shelf_a" / "scenarios.jsonl").write_text("\n".join([json.dumps(broken), *lines[1:]]) + "\n")
    catalog = Catalog()
    catalog.load_dir(root)
    assert len(catalog.scenarios) == 2 * PER_ENV - 1
    assert any("tags[1]" in p for p in catalog.problems)
    kept = catalog.scenarios["s-0003-a"]
    assert kept.split == "train" and kept.tags == ("shelf_a", "odd", "fizz")
    assert Scenario.from_json(kept.to_json()).to_json() == kept.to_json()
    unlabelled = Scenario.from_json(json.loads((FIXTURES / "probe" / "scenarios.jsonl").read_text().splitlines()[0]))
    assert "split" not in unlabelled.to_json() and "tags" not in unlabelled.to_json()
