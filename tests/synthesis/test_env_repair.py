"""A tool bug the checker missed, exposed by a scenario's replay: the tool is repaired or the environment dropped."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.catalog.collection import Catalog
from synthesis.run.context import Context
from synthesis.stages import publish, scenarios
from tests.scripted_openai import Running
from tests.synthesis.conftest import fixture_skeleton, fixture_theme

pytestmark = pytest.mark.anyio

RIGHT = "destination[sku] = destination.get(sku, 0) + quantity"
PLANTED = "destination[sku] = destination.get(sku, 0) + 1"  # the destination ignores the quantity moved


def seed_buggy_warehouse(ctx: Context, env_id: str) -> None:
    """The warehouse environment with a planted bug in transfer_stock, kept by an assessment that missed it."""
    theme = {**fixture_theme("warehouse_inventory"), "env_id": env_id}
    ctx.workspace.write_json(ctx.workspace.environments, {"fingerprint": "", "environments": [theme], "dropped": []})
    skeleton = {**fixture_skeleton("warehouse_inventory"), "key": env_id}
    assert RIGHT in skeleton["code"]
    skeleton["code"] = skeleton["code"].replace(RIGHT, PLANTED)
    ctx.workspace.skeletons.append(skeleton)
    ctx.workspace.assessments.append({"key": env_id, "status": "kept", "ratio": 1.0, "counts": {"pass": 6},
                                      "rounds": 6, "assessment": {"rounds": 6, "counts": {"pass": 6}}})  # fmt: skip


async def test_a_tool_a_scenario_blames_is_repaired_from_its_evidence_and_ships_fixed(contexts: Any, llm: Running) -> None:
    ctx = contexts(run={"scenarios_per_env": 1})
    seed_buggy_warehouse(ctx, "mug_depot")
    report = await scenarios.run(ctx)
    record = ctx.workspace.scenarios.load()["mug_depot-s01"]
    assert record["status"] == "kept", record
    blamed, valid = record["history"]
    assert (blamed["result"], blamed["diagnosis"]["diagnosis"], blamed["diagnosis"]["tool"]) == (
        "check_fails_after_solution", "environment", "transfer_stock")
    assert blamed["diagnosis"]["changed"] == ["tool transfer_stock repaired"] and valid["result"] == "valid"
    assert "mug_depot: repaired transfer_stock after scenarios mug_depot-s01 found them wrong" in report.notes
    # the tool repair saw the scenario's evidence: the diagnosis, the replayed calls and what the destination got
    sent = llm.script.conversations["mug_depot/tool_repair/transfer_stock-s01-fix1"][0][1]["content"]
    assert "ignores the quantity" in sent and "calls_replayed" in sent and PLANTED in sent

    assessment = ctx.workspace.assessments.load()["mug_depot"]
    assert assessment["status"] == "kept" and RIGHT in assessment["code"] and PLANTED not in assessment["code"]
    published = await publish.run(ctx)
    assert (published.kept, published.failed) == (1, [])  # and the catalog validates
    catalog = Catalog()
    catalog.load_dir(ctx.workspace.out)
    assert catalog.problems == [] and RIGHT in catalog.environments["mug_depot"].code
    provenance = json.loads((ctx.workspace.out / "mug_depot" / "env.json").read_text())["provenance"]["assessment"]
    (repair,) = provenance["repaired_after_scenarios"]
    assert (repair["tool"], repair["scenario"]) == ("transfer_stock", "mug_depot-s01")
    assert "ignores the quantity" in repair["reason"] and repair["attempts"][0].startswith("rewrite 1: repaired")


async def test_a_blamed_tool_no_rewrite_fixes_drops_the_environment(contexts: Any, llm: Running) -> None:
    ctx = contexts(run={"scenarios_per_env": 1})
    seed_buggy_warehouse(ctx, "mug_outlet")
    report = await scenarios.run(ctx)
    record = ctx.workspace.scenarios.load()["mug_outlet-s01"]
    assert (record["status"], record["reason"]) == ("dropped", "environment_dropped")
    assert llm.script.count("mug_outlet/tool_repair/") == 2  # repair.tool_attempts rewrites, each still wrong
    assessment = ctx.workspace.assessments.load()["mug_outlet"]
    assert (assessment["status"], assessment["reason"]) == ("dropped", "tool_unrepaired")
    assert "transfer_stock: scenario mug_outlet-s01 found it wrong" in assessment["detail"]
    assert any(n.startswith("mug_outlet: environment dropped: transfer_stock") for n in report.notes), report.notes
    published = await publish.run(ctx)
    assert published.kept == 0 and not (ctx.workspace.out / "mug_outlet").exists()  # never shipped


async def test_an_environment_diagnosis_must_name_a_tool_of_the_environment() -> None:
    from synthesis.errors import ParseError
    from synthesis.repair.scenario_repair import parse_fix

    answer = '```json\n{"diagnosis": "environment", "reason": "wrong sum", "tool": "%s"}\n```'
    assert parse_fix(answer % "transfer_stock", {"transfer_stock", "get_stock"}, 2).tool == "transfer_stock"
    with pytest.raises(ParseError, match="answer.tool must be one of get_stock, transfer_stock"):
        parse_fix(answer % "move_stock", {"transfer_stock", "get_stock"}, 2)


async def test_a_kept_scenario_that_relied_on_the_bug_is_failed_after_the_repair(contexts: Any, llm: Running) -> None:
    from synthesis.parsing.answers import parse_init_state
    from synthesis.repair.env_repair import revision
    from synthesis.stages.skeleton import environment
    from tests.synthesis.conftest import ANSWERS, latest

    ctx = contexts(run={"scenarios_per_env": 2})
    seed_buggy_warehouse(ctx, "mug_depot")
    buggy = environment(ctx.workspace.skeletons.load()["mug_depot"])
    seed = parse_init_state(latest(ANSWERS / "mug_depot" / "init_states", "state-01"))
    transfer = {"name": "transfer_stock", "arguments": {"sku": "MUG-BLU", "from_warehouse_id": "W01",
                                                        "to_warehouse_id": "W02", "quantity": 40}}  # fmt: skip
    relied = {"scenario_id": "mug_depot-s02", "env_id": "mug_depot", "task": "Move 40 blue mugs from Leeds to Bristol.",
              "init_config": seed.init_config, "reference_solution": [transfer],
              "checklist": [{"item": "W02 holds 9 MUG-BLU.",
                             "check": "def check_func(final_state):\n    return final_state['stock']['W02']['MUG-BLU'] == 9\n"}]}  # fmt: skip
    ctx.workspace.scenarios.append({"key": "mug_depot-s02", "status": "kept", "scenario": relied, "kinds": ["change"],
                                    "env_revision": revision(buggy), "history": [{"result": "valid"}]})  # fmt: skip
    report = await scenarios.run(ctx)
    records = ctx.workspace.scenarios.load()
    assert records["mug_depot-s01"]["status"] == "kept"
    assert records["mug_depot-s02"]["status"] == "failed"
    assert "no longer valid after its environment was repaired (check_fails_after_solution" in records["mug_depot-s02"]["error"]
    assert (report.kept, [k for k, _ in report.failed]) == (1, ["mug_depot-s02"])
