"""The bundled catalog: enough domains and scenarios to train on, documented tools, references that work."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from service.catalog.collection import Catalog
from tests.conftest import BUNDLED
from tests.in_process import start_app


@pytest.fixture(scope="module")
def bundled() -> Catalog:
    catalog = Catalog()
    catalog.load_dir(BUNDLED)
    return catalog


@pytest.fixture(scope="module")
def bundled_client() -> Iterator[httpx.Client]:
    """The real app (in this process) serving the bundled catalog alone."""
    server = start_app(catalogs=(BUNDLED,))
    try:
        with server.client() as client:
            yield client
    finally:
        server.stop()


def test_bundled_catalog_has_six_domains_and_thirty_scenarios(bundled: Catalog) -> None:
    assert len(bundled.environments) >= 6
    assert len(bundled.scenarios) >= 30
    for env_id in bundled.environments:
        assert len(bundled.scenarios_of(env_id)) >= 4, env_id


def test_every_bundled_tool_documents_its_purpose_and_each_parameter(bundled: Catalog) -> None:
    """The bundled environments double as examples for synthesis prompts, so their schemas are complete."""
    for env in bundled.environments.values():
        assert env.summary and env.introduction and env.rules, env.env_id
        assert 8 <= len(env.tools) <= 15, (env.env_id, len(env.tools))
        for tool in env.tools:
            fn = tool["function"]
            assert fn["description"], (env.env_id, fn["name"])
            for name, schema in fn["parameters"]["properties"].items():
                assert schema.get("description"), (env.env_id, fn["name"], name)
                assert "type" in schema or "enum" in schema or "anyOf" in schema, (env.env_id, fn["name"], name)


def test_reference_solutions_span_one_call_to_ten_or_more(bundled: Catalog) -> None:
    for env_id in bundled.environments:
        lengths = [len(s.reference_solution or []) for s in bundled.scenarios_of(env_id)]
        assert all(lengths), env_id
    lengths = sorted(len(s.reference_solution or []) for s in bundled.scenarios.values())
    assert lengths[0] == 1 and lengths[-1] >= 10


def test_every_reference_call_succeeds_and_the_reference_scores_one(
    bundled: Catalog, bundled_client: httpx.Client
) -> None:
    """A reference solution is a demonstration: no call in it may be refused by the environment's rules."""
    for scenario in sorted(bundled.scenarios.values(), key=lambda s: s.scenario_id):
        created = bundled_client.post("/v1/sessions", json={"scenario_id": scenario.scenario_id})
        assert created.status_code == 201, created.text
        sid = created.json()["session_id"]
        assert bundled_client.post(f"/v1/sessions/{sid}/score").json()["reward"] < 1.0, scenario.scenario_id
        for step in scenario.reference_solution or []:
            response = bundled_client.post(f"/v1/sessions/{sid}/calls",
                                           json={"name": step.name, "arguments": step.arguments})
            outcome = response.json()
            assert outcome["ok"], (scenario.scenario_id, step.name, outcome["observation"])
            assert outcome["result"].get("success") is True, (scenario.scenario_id, step.name, outcome["observation"])
        assert bundled_client.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0, scenario.scenario_id
        assert bundled_client.delete(f"/v1/sessions/{sid}").status_code == 204
