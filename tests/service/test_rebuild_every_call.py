"""``ENVFOUNDRY_REBUILD_EVERY_CALL=1``: every session call rebuilds its instance from the stored state.

No live session is kept, no call goes straight to a session's process, no initial state is forked
from a template. A class that keeps all its state on the instance gives the same results: the
bundled catalog's reference solutions still score 1.0.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from service.catalog.collection import Catalog
from service.server.settings import Settings
from tests.conftest import BUNDLED
from tests.in_process import start_app


def test_the_setting_means_no_residents() -> None:
    assert Settings(rebuild_every_call=True).limits().residents == 0
    assert Settings().limits().rebuild_every_call is False and Settings().limits().residents == 512


@pytest.fixture(scope="module")
def rebuilding() -> Iterator[httpx.Client]:
    server = start_app(catalogs=(BUNDLED,), extra_env={"ENVFOUNDRY_REBUILD_EVERY_CALL": "1"})
    try:
        with server.client() as client:
            yield client
    finally:
        server.stop()


def _session_calls(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    found = dict(re.findall(r'^envfoundry_sandbox_session_calls\{instance="(\w+)"\} (\S+)$', text, re.M))
    live = [float(v) for v in re.findall(r"^envfoundry_sandbox_live_sessions\{[^}]*\} (\S+)$", text, re.M)]
    return {"live": float(found["live"]), "rebuilt": float(found["rebuilt"]), "held": sum(live)}


def test_every_call_rebuilds_and_the_reference_solutions_still_score_one(rebuilding: httpx.Client) -> None:
    catalog = Catalog()
    catalog.load_dir(BUNDLED)
    calls = 0
    for scenario in sorted(catalog.scenarios.values(), key=lambda s: s.scenario_id):
        created = rebuilding.post("/v1/sessions", json={"scenario_id": scenario.scenario_id})
        assert created.status_code == 201, created.text
        sid = created.json()["session_id"]
        for step in scenario.reference_solution or []:
            outcome = rebuilding.post(f"/v1/sessions/{sid}/calls",
                                      json={"name": step.name, "arguments": step.arguments}).json()
            calls += 1
            assert outcome["ok"] and outcome["result"].get("success") is True, (scenario.scenario_id, outcome)
        assert rebuilding.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0, scenario.scenario_id
        assert rebuilding.delete(f"/v1/sessions/{sid}").status_code == 204
    seen = _session_calls(rebuilding)
    assert seen == {"live": 0.0, "rebuilt": float(calls), "held": 0.0}, (seen, calls)


def test_groups_and_forks_rebuild_too(rebuilding: httpx.Client) -> None:
    before = _session_calls(rebuilding)
    catalog = Catalog()
    catalog.load_dir(BUNDLED)
    scenario = min(catalog.scenarios.values(), key=lambda s: s.scenario_id)
    group = rebuilding.post("/v1/sessions", json={"scenario_id": scenario.scenario_id, "n": 3})
    assert group.status_code == 201, group.text
    sids = group.json()["session_ids"]
    fork = rebuilding.post(f"/v1/sessions/{sids[0]}/fork", json={"n": 2})
    assert fork.status_code == 201, fork.text
    sids += fork.json()["session_ids"]
    step = (scenario.reference_solution or [])[0]
    for sid in sids:
        outcome = rebuilding.post(f"/v1/sessions/{sid}/calls", json={"name": step.name, "arguments": step.arguments})
        assert outcome.json()["ok"], outcome.text
    after = _session_calls(rebuilding)
    assert after["live"] == before["live"] == 0.0 and after["rebuilt"] == before["rebuilt"] + 5
    assert after["held"] == 0.0
