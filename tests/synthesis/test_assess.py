"""Stage 3: dual-agent assessment with every call run in the sandbox."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from synthesis.run.context import Context
from synthesis.stages import assess
from synthesis.stages.skeleton import environment
from tests.scripted_openai import Running
from tests.synthesis.conftest import fixture_skeleton, seed_scope


def seed_skeletons(ctx: Context, *env_ids: str) -> None:
    seed_scope(ctx, *env_ids)
    for env_id in env_ids:
        ctx.workspace.skeletons.append(fixture_skeleton(env_id))


def test_pass_ratio_counts_warnings_as_passing_and_survives_nothing_judged() -> None:
    assert assess.pass_ratio(Counter({"pass": 5, "warning": 1, "fail": 2})) == 0.75
    assert assess.pass_ratio(Counter()) == 0.0  # EnvScaler divided by zero here


def test_method_source_is_what_the_checker_and_the_repair_read() -> None:
    record = fixture_skeleton("clinic_appointments")
    source = assess.method_source(record["code"], record["class_name"], "cancel_appointment")
    assert source.lstrip().startswith("def cancel_appointment(self, appointment_id: str) -> dict:")
    assert assess.method_source(record["code"], record["class_name"], "nope") == ""


@pytest.mark.anyio
async def test_a_sound_environment_is_kept_as_it_is(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_skeletons(ctx, "clinic_appointments")
    report = await assess.run(ctx)
    clinic = ctx.workspace.assessments.load()["clinic_appointments"]
    assert (clinic["status"], clinic["ratio"], clinic["counts"]) == ("kept", 1.0, {"pass": 5, "warning": 1})
    assert [e["verdict"] for e in clinic["log"]] == ["pass", "pass", "pass", "pass", "pass", "warning"]
    booked = clinic["log"][3]
    assert booked["diff"]["added"][0]["path"] == "/appointments/A0006"  # the call really ran, in the sandbox
    assert "code" not in clinic and clinic["assessment"]["repaired"] == clinic["assessment"]["removed"] == []
    # the tester's answer naming a tool that does not exist was re-asked
    assert llm.script.count("clinic_appointments/test_call/r03") == 2
    assert report.kept == 1


@pytest.mark.anyio
async def test_the_tester_sees_what_each_of_its_calls_returned(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_skeletons(ctx, "clinic_appointments")
    await assess.run(ctx)
    sent = llm.script.conversations["clinic_appointments/test_call/r05"][0]
    assert [m["role"] for m in sent] == ["system", "user"] + ["assistant", "user"] * 4
    assert sent[-1]["content"].startswith("Round 4: book_appointment returned (ok):")
    assert '"A0006"' in sent[-1]["content"] and "Round 5 of 6: propose the next call." in sent[-1]["content"]
    # the checker reads the whole class, record types included, at its own temperature
    judged = llm.script.conversations["clinic_appointments/check_call/r04"][0][1]["content"]
    assert "class PetInfo(TypedDict" in judged and "class ClinicAppointmentSystem" in judged


@pytest.mark.anyio
async def test_failing_tools_are_repaired_or_removed_and_none_ships(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_skeletons(ctx, "parking_permits")
    report = await assess.run(ctx)
    parking = ctx.workspace.assessments.load()["parking_permits"]
    summary = parking["assessment"]
    assert (summary["repaired"], summary["removed"], summary["failing"]) == (["get_permit", "issue_permit"], ["cancel_permit"], [])
    assert summary["first_counts"] == {"pass": 2, "warning": 1, "fail": 3}  # 0.5: below the ratio before repair
    assert (parking["status"], parking["counts"], parking["ratio"]) == ("kept", {"pass": 4, "warning": 1}, 1.0)
    # the repaired code is the environment's code from now on: no method the checker failed is left in it
    env = environment(fixture_skeleton("parking_permits"), parking)
    assert env.tool_names == {"get_permit", "issue_permit", "list_plate_permits"}
    assert "self.permits.get(permit_id)" in env.code and "zone is None" in env.code
    exception = parking["log"][1]
    assert (exception["first_verdict"], exception["verdict"], exception["repaired_in"]) == ("fail", "pass", 1)
    assert exception["result"] == {"success": False, "error": "permit PP-9999 does not exist"}  # run again, in the sandbox
    # exceptions are labelled by the sandbox outcome: the checker is not asked about them
    assert llm.script.count("parking_permits/check_call/r02") == 0
    # the repair saw the checker's reason, the method and the failing call
    sent = llm.script.conversations["parking_permits/tool_repair/cancel_permit-fix1"][0][1]["content"]
    assert "cancel_permit deleted PP-1002 from permits" in sent and "del self.permits[permit_id]" in sent
    assert '"PP-1002"' in sent
    second = llm.script.conversations["parking_permits/tool_repair/cancel_permit-fix2"][0][1]["content"]
    assert "Your earlier rewrites did not fix it:" in second and "still removes PP-1002" in second
    assert report.kept == 1
    # the texts no longer describe the removed tool, so no later prompt asks for it
    asked = llm.script.conversations["parking_permits/env_texts/main"][0][1]["content"]
    removed, remaining = asked.split("The tools that remain:")
    assert '"cancel_permit"' in removed and '"cancel_permit"' not in remaining and '"issue_permit"' in remaining
    assert summary["texts_rewritten"] == "without cancel_permit"
    assert "cancel" not in env.introduction and "cancel" not in env.summary
    assert env.rules == parking["texts"]["rules"] and not any("cancel" in rule for rule in env.rules)


@pytest.mark.anyio
async def test_a_tool_that_stays_failing_drops_the_environment_when_removal_is_off(contexts: Any) -> None:
    ctx = contexts(repair={"remove_unrepaired": False})
    seed_skeletons(ctx, "parking_permits")
    await assess.run(ctx)
    parking = ctx.workspace.assessments.load()["parking_permits"]
    assert (parking["status"], parking["reason"]) == ("dropped", "tool_unrepaired")
    assert parking["assessment"]["failing"] == ["cancel_permit"] and "cancel_permit" in parking["detail"]


@pytest.mark.anyio
async def test_removing_tools_that_leaves_no_change_operation_drops_the_environment(contexts: Any) -> None:
    ctx = contexts(repair={"tool_attempts": 1})
    seed_scope(ctx, "parking_permits")
    kinds = [{"name": "get_permit", "kind": "query"}, {"name": "list_plate_permits", "kind": "query"},
             {"name": "issue_permit", "kind": "change"}, {"name": "cancel_permit", "kind": "change"}]  # fmt: skip
    ctx.workspace.skeletons.append({**fixture_skeleton("parking_permits"), "operations": kinds})
    await assess.run(ctx)
    parking = ctx.workspace.assessments.load()["parking_permits"]
    assert parking["assessment"]["removed"] == ["cancel_permit", "issue_permit"]
    assert (parking["status"], parking["reason"]) == ("dropped", "tool_unrepaired")
    assert "leaves no query or no change operation" in parking["detail"]


@pytest.mark.anyio
async def test_a_call_with_arguments_that_do_not_bind_is_not_counted(contexts: Any) -> None:
    ctx = contexts()
    seed_skeletons(ctx, "warehouse_inventory")
    await assess.run(ctx)
    record = ctx.workspace.assessments.load()["warehouse_inventory"]
    assert record["log"][5]["verdict"] == "not_a_test" and "invalid_arguments" in record["log"][5]["reason"]
    assert (record["judged"], record["status"]) == (5, "kept")


@pytest.mark.anyio
async def test_too_few_verdicts_drop_the_environment(contexts: Any) -> None:
    ctx = contexts(llm={"max_reasks": 0}, thresholds={"rounds": 3, "min_judged": 1.0})
    seed_skeletons(ctx, "clinic_appointments")
    await assess.run(ctx)
    record = ctx.workspace.assessments.load()["clinic_appointments"]
    assert (record["status"], record["reason"], record["detail"]) == ("dropped", "too_few_verdicts", "2 of 3 rounds judged")
    assert record["log"][2]["skipped"].startswith("tester: answer.tool must be one of the listed tools")


@pytest.mark.anyio
async def test_a_new_pass_ratio_rejudges_finished_assessments_without_new_rounds(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_skeletons(ctx, "warehouse_inventory")
    await assess.run(ctx)
    asked = llm.script.count()
    report = await assess.run(contexts(thresholds={"min_judged": 1.0}))
    record = ctx.workspace.assessments.load()["warehouse_inventory"]
    assert (record["status"], record["reason"], len(record["log"])) == ("dropped", "too_few_verdicts", 6)
    assert llm.script.count() == asked and report.dropped == {"too_few_verdicts": 1} and report.resumed == 1


@pytest.mark.anyio
async def test_environments_out_of_scope_are_not_assessed(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_skeletons(ctx, "clinic_appointments")
    ctx.workspace.skeletons.append(fixture_skeleton("parking_permits"))  # built earlier, then cut by --max-envs
    report = await assess.run(ctx)
    assert report.items == 1 and llm.script.count("parking_permits/") == 0
