"""Stage 3: dual-agent assessment with every call run in the sandbox."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from synthesis import assess
from synthesis.context import Context
from tests.synthesis.conftest import fixture_skeleton, seed_scope
from tests.synthesis.scripted_llm import Running


def seed_skeletons(ctx: Context, *env_ids: str) -> None:
    seed_scope(ctx, *env_ids)
    for env_id in env_ids:
        ctx.workspace.skeletons.append(fixture_skeleton(env_id))


def test_pass_ratio_counts_warnings_as_passing_and_survives_nothing_judged() -> None:
    assert assess.pass_ratio(Counter({"pass": 5, "warning": 1, "fail": 2})) == 0.75
    assert assess.pass_ratio(Counter()) == 0.0  # EnvScaler divided by zero here


def test_method_source_is_what_the_checker_reads() -> None:
    record = fixture_skeleton("clinic_appointments")
    source = assess.method_source(record["code"], record["class_name"], "cancel_appointment")
    assert source.lstrip().startswith("def cancel_appointment(self, appointment_id: str) -> dict:")
    assert assess.method_source(record["code"], record["class_name"], "nope") == ""


@pytest.mark.anyio
async def test_a_sound_environment_is_kept_and_a_buggy_one_dropped(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_skeletons(ctx, "clinic_appointments", "parking_permits")
    report = await assess.run(ctx)
    records = ctx.workspace.assessments.load()
    clinic, parking = records["clinic_appointments"], records["parking_permits"]
    assert (clinic["status"], clinic["ratio"], clinic["counts"]) == ("kept", 1.0, {"pass": 5, "warning": 1})
    assert [e["verdict"] for e in clinic["log"]] == ["pass", "pass", "pass", "pass", "pass", "warning"]
    booked = clinic["log"][3]
    assert booked["diff"]["added"][0]["path"] == "/appointments/A0006"  # the call really ran, in the sandbox
    assert (parking["status"], parking["reason"], parking["ratio"]) == ("dropped", "below_pass_ratio", 0.5)
    exception = parking["log"][1]
    assert exception["verdict"] == "fail" and exception["error"]["type"] == "tool_exception"
    assert "KeyError" in exception["reason"]
    # exceptions are labelled by the sandbox outcome: the checker is not asked about them
    assert llm.script.count("parking_permits/check_call/r02") == 0
    assert llm.script.count("parking_permits/check_call/r05") == 1
    # the tester's answer naming a tool that does not exist was re-asked
    assert llm.script.count("clinic_appointments/test_call/r03") == 2
    assert (report.kept, dict(report.dropped)) == (1, {"below_pass_ratio": 1})


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
    seed_skeletons(ctx, "parking_permits")
    await assess.run(ctx)
    asked = llm.script.count()
    report = await assess.run(contexts(thresholds={"pass_ratio": 0.5}))
    record = ctx.workspace.assessments.load()["parking_permits"]
    assert (record["status"], record["ratio"], len(record["log"])) == ("kept", 0.5, 6)
    assert llm.script.count() == asked and report.kept == 1 and report.resumed == 1


@pytest.mark.anyio
async def test_environments_out_of_scope_are_not_assessed(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_skeletons(ctx, "clinic_appointments")
    ctx.workspace.skeletons.append(fixture_skeleton("parking_permits"))  # built earlier, then cut by --max-envs
    report = await assess.run(ctx)
    assert report.items == 1 and llm.script.count("parking_permits/") == 0
