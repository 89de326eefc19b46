"""Stages 4 and 5 through the scripted endpoint, then publishing the catalog."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.catalog import Catalog
from synthesis import publish, scenarios
from synthesis.context import Context
from tests.synthesis.conftest import fixture_skeleton, seed_scope
from tests.synthesis.scripted_llm import Running

pytestmark = pytest.mark.anyio


def seed_assessed(ctx: Context, *env_ids: str) -> None:
    seed_scope(ctx, *env_ids)
    for env_id in env_ids:
        ctx.workspace.skeletons.append(fixture_skeleton(env_id))
        ctx.workspace.assessments.append({"key": env_id, "status": "kept", "ratio": 1.0})


async def test_scenarios_are_generated_validated_and_published(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_assessed(ctx, "clinic_appointments", "warehouse_inventory")
    seed_scope(ctx, "clinic_appointments", "warehouse_inventory", "parking_permits")
    ctx.workspace.skeletons.append(fixture_skeleton("parking_permits"))
    ctx.workspace.assessments.append({"key": "parking_permits", "status": "dropped", "reason": "below_pass_ratio"})
    report = await scenarios.run(ctx)
    records = ctx.workspace.scenarios.load()
    assert {k: (r["status"], r.get("reason")) for k, r in records.items()} == {
        "clinic_appointments-s01": ("kept", None), "clinic_appointments-s02": ("dropped", "check_passes_initially"),
        "warehouse_inventory-s01": ("kept", None), "warehouse_inventory-s02": ("kept", None),
    }  # fmt: skip
    assert (report.kept, dict(report.dropped)) == (3, {"check_passes_initially": 1})
    kept = records["warehouse_inventory-s01"]
    assert kept["kinds"] == ["change"] * 4 and kept["scenario"]["scenario_id"] == "warehouse_inventory-s01"
    assert kept["scenario"]["reference_solution"][3]["name"] == "transfer_stock"
    dropped = records["clinic_appointments-s02"]
    assert dropped["scenario"]["task"].startswith("Hello, it's Aiko Tanaka")  # what was rejected stays readable
    # one request per environment for all its initial states; the clinic's first answer was inconsistent
    assert llm.script.count("clinic_appointments/init_states/scenarios") == 2
    followup = llm.script.conversations["clinic_appointments/init_states/scenarios"][1][-1]["content"]
    assert 'pet_id \\"P009\\" refers to no entry of pets' in json.dumps(followup)
    assert llm.script.count("warehouse_inventory/check_func/s01-c3") == 2  # the mutating check was re-asked
    assert llm.script.count("parking_permits/") == 0  # dropped by assessment: no scenarios

    published = await publish.run(ctx)
    assert published.kept == 2 and published.failed == []  # validate_catalog found nothing
    catalog = Catalog()
    catalog.load_dir(ctx.workspace.out)
    assert sorted(catalog.scenarios) == ["clinic_appointments-s01", "warehouse_inventory-s01", "warehouse_inventory-s02"]
    assert catalog.environments["clinic_appointments"].rules[0].startswith("An appointment can only be booked")


async def test_publishing_removes_a_package_it_no_longer_keeps(contexts: Any) -> None:
    ctx = contexts()
    seed_assessed(ctx, "clinic_appointments")
    await publish.run(ctx)
    assert (ctx.workspace.out / "clinic_appointments" / "env.json").is_file()
    (ctx.workspace.out / "hand_made").mkdir()
    (ctx.workspace.out / "hand_made" / "notes.txt").write_text("not ours")
    seed_scope(ctx)  # e.g. a lower --max-envs: the environment is out of scope now
    report = await publish.run(ctx)
    assert report.kept == 0 and not (ctx.workspace.out / "clinic_appointments").exists()
    assert (ctx.workspace.out / "hand_made" / "notes.txt").is_file()


def test_scenario_keys_are_stable() -> None:
    assert scenarios.scenario_keys("clinic_appointments", 2) == ["clinic_appointments-s01", "clinic_appointments-s02"]
