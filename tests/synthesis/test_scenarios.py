"""Stages 4 and 5 through the scripted endpoint, then publishing the catalog."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.catalog.collection import Catalog
from synthesis.parsing.answers import parse_init_state
from synthesis.run.context import Context
from synthesis.stages import publish, scenarios
from synthesis.stages.skeleton import environment
from tests.scripted_openai import Running
from tests.synthesis.conftest import ANSWERS, fixture_skeleton, latest, seed_scope

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
        "clinic_appointments-s01": ("kept", None), "clinic_appointments-s02": ("kept", None),
        "warehouse_inventory-s01": ("kept", None), "warehouse_inventory-s02": ("kept", None),
    }  # fmt: skip
    assert (report.kept, dict(report.dropped)) == (4, {})
    kept = records["warehouse_inventory-s01"]
    assert kept["kinds"] == ["change"] * 4 and kept["scenario"]["scenario_id"] == "warehouse_inventory-s01"
    assert kept["scenario"]["reference_solution"][3]["name"] == "transfer_stock"
    assert [e["result"] for e in kept["history"]] == ["valid"]
    # the first validation rejected a check that already held; the repair made it a "keep" item
    repaired = records["clinic_appointments-s02"]
    first, second = repaired["history"]
    assert (first["result"], first["diagnosis"]["diagnosis"], first["diagnosis"]["changed"]) == (
        "check_passes_initially", "check", ["check 3 kind"])
    assert first["evidence"]["checks_before"][2]["passed"] and first["evidence"]["final_state"]["appointments"]
    assert second["result"] == "valid" and repaired["kinds"] == ["change", "change", "keep"]
    # one request per initial state; the clinic's second state was inconsistent at first
    assert llm.script.count("clinic_appointments/init_states/state-01") == 1
    assert llm.script.count("clinic_appointments/init_states/state-02") == 2
    followup = llm.script.conversations["clinic_appointments/init_states/state-02"][1][-1]["content"]
    assert 'pet_id \\"P009\\" refers to no entry of pets' in json.dumps(followup)
    assert llm.script.count("warehouse_inventory/check_func/s01-c3") == 2  # the mutating check was re-asked
    assert llm.script.count("parking_permits/") == 0  # dropped by assessment: no scenarios

    published = await publish.run(ctx)
    assert published.kept == 2 and published.failed == []  # validate_catalog found nothing
    catalog = Catalog()
    catalog.load_dir(ctx.workspace.out)  # the provenance keys are extra keys the loader ignores
    assert catalog.problems == []
    assert sorted(catalog.scenarios) == ["clinic_appointments-s01", "clinic_appointments-s02", "warehouse_inventory-s01",
                                         "warehouse_inventory-s02"]  # fmt: skip
    assert catalog.environments["clinic_appointments"].rules[0].startswith("An appointment can only be booked")
    lines = (ctx.workspace.out / "clinic_appointments" / "scenarios.jsonl").read_text().splitlines()
    provenance = json.loads(lines[1])["provenance"]
    assert (provenance["drafts"], provenance["validations"]) == (1, 2)
    assert provenance["history"][0]["diagnosis"]["diagnosis"] == "check" and "evidence" not in provenance["history"][0]


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


async def draft_slot(ctx: Context, key: str) -> dict[str, Any]:
    env = environment(fixture_skeleton("clinic_appointments"))
    seed = parse_init_state(latest(ANSWERS / "clinic_appointments" / "init_states", "state-01"))
    return await scenarios.make(ctx, env, key, seed)


async def test_a_planted_bad_check_is_rewritten_from_the_evidence_and_the_scenario_kept(contexts: Any, llm: Running) -> None:
    record = await draft_slot(contexts(), "clinic_appointments-s03")
    assert record["status"] == "kept"
    first, second = record["history"]
    assert first["result"] == "check_fails_after_solution" and first["detail"].startswith("A new appointment exists")
    assert first["diagnosis"] == {"diagnosis": "check", "changed": ["check 2 source"],
                                  "reason": first["diagnosis"]["reason"]}  # fmt: skip
    assert second["result"] == "valid" and '"10:00"' in record["scenario"]["checklist"][1]["check"]
    # the model was shown the evidence: the replayed calls with results, each check's outcome, the final state
    sent = llm.script.conversations["clinic_appointments/scenario_repair/s03-fix1"][0][1]["content"]
    assert '"10:00"' in sent and "check_fails_after_solution" in sent and '"after_solution"' in sent
    assert "Final state (after the calls that ran):" in sent and '"A0006"' in sent


async def test_a_solution_missing_a_step_is_replaced(contexts: Any) -> None:
    record = await draft_slot(contexts(), "clinic_appointments-s04")
    assert record["status"] == "kept" and [e["result"] for e in record["history"]] == ["check_fails_after_solution", "valid"]
    assert record["history"][0]["diagnosis"]["changed"] == ["solution"]
    assert "cancel_appointment" in [c["name"] for c in record["scenario"]["reference_solution"]]


async def test_a_task_judged_wrong_gets_a_fresh_draft_within_the_budget(contexts: Any, llm: Running) -> None:
    record = await draft_slot(contexts(), "clinic_appointments-s05")
    assert record["status"] == "kept"
    assert [(e["draft"], e["result"]) for e in record["history"]] == [(1, "check_fails_after_solution"), (2, "valid")]
    assert llm.script.count("clinic_appointments/task/s05-d2") == 1


async def test_without_a_repair_budget_a_failing_draft_is_dropped_with_its_evidence(contexts: Any, llm: Running) -> None:
    record = await draft_slot(contexts(repair={"scenario_attempts": 0, "drafts_per_scenario": 1}), "clinic_appointments-s03")
    assert (record["status"], record["reason"]) == ("dropped", "check_fails_after_solution")
    evidence = record["history"][0]["evidence"]
    assert [c["passed"] for c in evidence["checks_after"]] == [True, False, True]
    assert evidence["final_state"]["appointments"]["A0006"]["slot"] == "10:00"  # the actual value the check missed
    assert llm.script.count("clinic_appointments/scenario_repair/") == 0


def test_scenario_keys_are_stable() -> None:
    assert scenarios.scenario_keys("clinic_appointments", 2) == ["clinic_appointments-s01", "clinic_appointments-s02"]


def test_a_kind_given_again_unchanged_is_not_reported_as_a_change() -> None:
    from synthesis.build.drafts import Draft
    from synthesis.parsing.answers import TaskSpec
    from synthesis.repair.scenario_repair import ScenarioFix
    from synthesis.stages.replay import Check

    draft = Draft(TaskSpec("Book it.", []), [Check("Booked.", "change", "def check_func(final_state):\n    return True\n")], [])
    new_source = "def check_func(final_state):\n    return bool(final_state)\n"
    assert ScenarioFix("check", "r", {0: {"kind": "change", "source": new_source}}).changed(draft) == ["check 1 source"]
    assert ScenarioFix("check", "r", {0: {"kind": "keep"}}).changed(draft) == ["check 1 kind"]
