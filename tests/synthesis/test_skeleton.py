"""Stage 2: skeleton synthesis from plans to a class that loads in the sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from synthesis.errors import ConfigError
from synthesis.run.context import Context
from synthesis.stages import skeleton
from tests.scripted_openai import Running
from tests.synthesis.conftest import fixture_skeleton, fixture_theme

pytestmark = pytest.mark.anyio

TALLY = {"env_id": "tally_counter", "summary": "Named tally counters that can be read, incremented and reset.",
         "introduction": "Counters are stored by id with a value; staff read, increment and reset them."}  # fmt: skip
TICKETS = {"env_id": "event_ticketing", "summary": "A box office.", "introduction": "Events, seats and orders."}


def seed_environments(ctx: Context, *envs: dict[str, Any]) -> None:
    ctx.workspace.write_json(ctx.workspace.environments, {"fingerprint": "", "environments": list(envs), "dropped": []})


async def test_clinic_skeleton_is_planned_written_assembled_and_loads(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_environments(ctx, fixture_theme("clinic_appointments"))
    report = await skeleton.run(ctx)
    record = ctx.workspace.skeletons.load()["clinic_appointments"]
    assert report.kept == 1 and record["status"] == "kept"
    assert record["code"] == fixture_skeleton("clinic_appointments")["code"]
    assert record["class_name"] == "ClinicAppointmentSystem" and len(record["tools"]) == 6
    assert record["lost_operations"] == [] and record["skipped_functions"] == ["book_appointment: _check_date is already defined"]
    assert record["plan"]["entities"][1]["attributes"][0]["name"] == "pet_id"
    # the operation plan: a 503, a name that shadows state, then a good plan; a method cut off, then complete
    assert llm.script.count("clinic_appointments/operation_plan") == 3
    assert llm.script.count("clinic_appointments/operation_code/book_appointment") == 2


async def test_a_method_that_never_parses_costs_only_that_operation(contexts: Any, llm: Running) -> None:
    ctx = contexts(llm={"max_reasks": 1})
    seed_environments(ctx, TALLY)
    await skeleton.run(ctx)
    record = ctx.workspace.skeletons.load()["tally_counter"]
    assert record["status"] == "kept" and record["tools"] == ["get_count", "increment"]
    assert record["lost_operations"] == ["reset: line 8: a raise escapes reset; return {\"success\": False, \"error\": ...} instead"]
    assert llm.script.count("tally_counter/operation_code/reset") == 2


async def test_an_endpoint_that_stays_down_fails_the_item_and_the_run_goes_on(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_environments(ctx, TICKETS, TALLY)
    report = await skeleton.run(ctx)
    records = ctx.workspace.skeletons.load()
    assert records["event_ticketing"]["status"] == "failed" and records["tally_counter"]["status"] == "kept"
    assert "gave up after 3 attempts" in records["event_ticketing"]["error"]
    assert [key for key, _ in report.failed] == ["event_ticketing"]


async def test_the_stage_needs_the_environment_list(contexts: Any) -> None:
    with pytest.raises(ConfigError, match="run `synth themes` first"):
        await skeleton.run(contexts())
