"""Stage 5: a scenario is kept only if its reference solution makes every check pass, in the sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.pool.requests import WorkerPool
from service.catalog.model import Environment
from service.catalog.registry import env_code
from synthesis.parsing.answers import Call, parse_checklist, parse_init_state, parse_solution
from synthesis.parsing.sources import parse_check_func
from synthesis.stages import replay
from synthesis.stages.skeleton import environment
from tests.synthesis.conftest import ANSWERS, fixture_skeleton, latest

pytestmark = pytest.mark.anyio
CLINIC = ANSWERS / "clinic_appointments"


def clinic() -> Environment:
    return environment(fixture_skeleton("clinic_appointments"))


def scenario(env: Environment, item: str) -> tuple[dict[str, Any], list[Call], list[replay.Check]]:
    index = int(item[1:]) - 1
    config = parse_init_state(latest(CLINIC / "init_states", f"state-{index + 1:02d}")).init_config
    calls = parse_solution(latest(CLINIC / "solution", item), env.tool_names)
    items = parse_checklist(latest(CLINIC / "checklist", item))
    checks = [replay.Check(c.item, c.kind, parse_check_func(latest(CLINIC / "check_func", f"{item}-c{j}")))
              for j, c in enumerate(items, start=1)]  # fmt: skip
    return config, calls, checks


async def run(pool: WorkerPool, env: Environment, config: dict[str, Any], calls: list[Call],
              checks: list[replay.Check]) -> replay.Validation:  # fmt: skip
    initial = await pool.init_state(env_code(env), config)
    return await replay.replay(pool, env, initial, calls, checks)


async def test_the_reference_solution_passes_every_check(pool: WorkerPool) -> None:
    env = clinic()
    validation = await run(pool, env, *scenario(env, "s01"))
    assert validation.reason is None and all(r["passed"] for r in validation.after)
    trace = validation.trace
    assert [t["name"] for t in trace][-2:] == ["cancel_appointment", "book_appointment"]
    assert trace[3]["result"]["data"] == ["10:00", "11:00", "14:00", "15:00"]
    assert trace[-1]["result"]["data"]["appointment_id"] == "A0006"


async def test_a_change_check_that_already_holds_initially_drops_the_scenario(pool: WorkerPool) -> None:
    env = clinic()
    caught = await run(pool, env, *scenario(env, "s02"))
    assert caught.reason == "check_passes_initially"
    assert caught.detail == "Pet P005 (Pepper) has no booked appointment in June 2024."
    assert caught.failing_checks() == [2] and caught.before[2]["passed"]


async def test_a_solution_that_misses_a_step_fails_its_check(pool: WorkerPool) -> None:
    env = clinic()
    config, calls, checks = scenario(env, "s01")
    caught = await run(pool, env, config, calls[:-1], checks)
    assert caught.reason == "check_fails_after_solution"
    assert caught.detail.startswith("A new appointment exists for pet P003") and "(returned False)" in caught.detail
    # the evidence a repair needs: every call with its result, the final state, each check's outcome
    assert len(caught.trace) == len(calls) - 1 and caught.final is not None
    assert caught.failing_checks() == [i for i, r in enumerate(caught.after) if not r["passed"]] != []


@pytest.mark.parametrize(("call", "reason", "detail"), [
    (Call("book_appointment", {"pet_id": "P003"}), "solution_invalid_call", "'vet_id' is a required property"),
    (Call("cancel_appointment", {"appointment_id": 3}), "solution_invalid_call", "argument 'appointment_id': 3 is not of type 'string'"),
    (Call("cancel_appointment", {"appointment_id": "A0001"}), "solution_call_refused", "A0001' is completed"),
    (Call("drop_tables", {}), "solution_invalid_call", "unknown tool 'drop_tables'"),
])  # fmt: skip
async def test_a_bad_reference_call_drops_the_scenario(pool: WorkerPool, call: Call, reason: str, detail: str) -> None:
    env = clinic()
    config, calls, checks = scenario(env, "s01")
    caught = await run(pool, env, config, [calls[0], call, *calls[1:]], checks)
    assert caught.reason == reason and detail in caught.detail
    assert caught.detail.startswith(f"calls[1] {call.name}")


async def test_lookups_alone_change_nothing(pool: WorkerPool) -> None:
    env = clinic()
    config, calls, checks = scenario(env, "s01")
    assert (await run(pool, env, config, calls[:4], checks)).reason == "solution_changes_nothing"


async def test_a_tool_that_raises_is_a_solution_call_error(pool: WorkerPool) -> None:
    env = environment(fixture_skeleton("parking_permits"))
    config = parse_init_state(latest(ANSWERS / "parking_permits" / "init_states", "assessment")).init_config
    check = replay.Check("PP-1001 is cancelled.", "change", "def check_func(final_state):\n    return False\n")
    caught = await run(pool, env, config, [Call("get_permit", {"permit_id": "PP-0000"})], [check])
    assert caught.reason == "solution_call_error" and "tool_exception: KeyError" in caught.detail
    assert caught.trace[0]["error"]["type"] == "tool_exception"
