"""Both clients over every v1 endpoint against a real server: typed results, typed errors."""

from __future__ import annotations

import pytest
from envfoundry_client import (
    AsyncClient,
    CallStep,
    CheckItem,
    Client,
    Conflict,
    IdempotencyKeyReused,
    InvalidEnvironment,
    InvalidRequest,
    NotFound,
    ToolCall,
)

from tests.conftest import Server

PROBE_CODE = '''
class Counter:
    def __init__(self):
        self.count = 0

    def bump(self, by: int = 1) -> dict:
        """Add to the counter.

        Args:
            by: how much to add
        """
        self.count += by
        return {"success": True, "data": self.count}
'''


def test_reads_catalog_through_typed_results(ef: Client) -> None:
    assert ef.health() == "ok"
    envs = {e.env_id: e for e in ef.list_environments()}
    assert envs["library_circulation"].class_name == "LibraryCirculationSystem"
    assert envs["library_circulation"].scenario_count >= 4
    detail = ef.get_environment("library_circulation")
    assert detail.rules and any(t["function"]["name"] == "return_book" for t in detail.tools)
    summaries = ef.list_scenarios("library_circulation")
    assert "lib-001" in [s.scenario_id for s in summaries]
    scenario = ef.get_scenario("lib-001")
    assert scenario.env_id == "library_circulation" and scenario.checklist and scenario.reference_solution
    assert scenario.reference_solution[0] == ToolCall("return_book", {"loan_id": "L0003"})


def test_whole_episode_scores_one_and_records_every_step(ef: Client) -> None:
    scenario = ef.get_scenario("lib-001")
    session = ef.create_session("lib-001")
    sid = session.session_id
    assert session.session_ids == [sid] and session.mode == "task" and session.task == scenario.task
    assert session.prompt == scenario.task
    assert [t["function"]["name"] for t in ef.tools(sid)] == [t["function"]["name"] for t in session.tools]
    assert scenario.reference_solution is not None
    for call in scenario.reference_solution:
        result = ef.call(sid, call.name, call.arguments)
        assert result.ok, result.observation
    score = ef.score(sid)
    assert (score.reward, score.passed, score.total) == (1.0, 3, 3)
    assert all(c.passed and c.error is None for c in score.checks)
    info = ef.get_session(sid)
    assert info.steps == 3 and info.scenario_id == "lib-001" and info.parent_id is None
    assert info.expires_at > info.created_at
    state = ef.state(sid)
    assert state.step == 3 and state.state["loans"]["L0003"]["returned"] is True
    page = ef.trajectory(sid)
    assert page.total == 3 and [s.step for s in page.steps] == [1, 2, 3]
    assert isinstance(page.steps[0], CallStep) and page.steps[0].name == "return_book"
    assert [s.step for s in ef.iter_trajectory(sid, page_size=2)] == [1, 2, 3]
    ef.delete_session(sid)
    with pytest.raises(NotFound):
        ef.get_session(sid)


def test_tool_failures_are_results_not_exceptions(ef: Client) -> None:
    sid = ef.create_session("lib-001").session_id
    unknown = ef.call(sid, "no_such_tool", {})
    assert not unknown.ok and unknown.error is not None and unknown.error.type == "unknown_tool"
    bad = ef.call(sid, "return_book", '{"loan_id": ')
    assert not bad.ok and bad.error is not None and bad.error.type == "invalid_arguments"
    assert ef.get_session(sid).steps == 2


def test_a_tool_that_says_no_answers_ok_with_its_refusal_in_the_result(ef: Client) -> None:
    """``ok`` is whether the tool ran and answered: a refusal is an answer, not a failed call."""
    sid = ef.create_session("lib-001").session_id
    refused = ef.call(sid, "renew_loan", {"loan_id": "L9999"})
    assert refused.ok and refused.error is None
    assert refused.result == {"success": False, "error": "Loan 'L9999' not found"}
    assert refused.observation == '{"success": false, "error": "Loan \'L9999\' not found"}'
    ef.delete_session(sid)


def test_fork_copies_state_and_parent(ef: Client) -> None:
    sid = ef.create_session("lib-001").session_id
    ef.call(sid, "return_book", {"loan_id": "L0003"})
    child = ef.fork(sid)
    assert child.session_ids == [child.session_id] and child.session_id != sid
    assert ef.get_session(child.session_id).parent_id == sid
    assert ef.state(child.session_id).state == ef.state(sid).state


def test_fork_and_state_go_back_to_any_step(ef: Client) -> None:
    sid = ef.create_session("lib-001").session_id
    initial = ef.state(sid)
    ef.call(sid, "return_book", {"loan_id": "L0003"})
    ef.call(sid, "return_book", {"loan_id": "L0004"})
    assert ef.state(sid, step=0).state == initial.state and ef.state(sid, step=0).step == 0
    back = ef.fork(sid, step=1, n=2)
    assert len(back.session_ids) == 2
    assert ef.state(back.session_id).step == 1 and ef.state(back.session_id).state == ef.state(sid, step=1).state
    with pytest.raises(InvalidRequest) as future:
        ef.fork(sid, step=3)
    assert future.value.status == 422


def test_problems_become_typed_exceptions_with_fields(ef: Client) -> None:
    with pytest.raises(NotFound) as missing:
        ef.get_scenario("no-such-scenario")
    assert missing.value.status == 404 and missing.value.problem_type == "urn:envfoundry:problem:not-found"
    assert "no-such-scenario" in missing.value.detail
    with pytest.raises(InvalidRequest) as invalid:
        ef.create_session()  # neither scenario_id nor env_id
    assert invalid.value.status == 422 and invalid.value.errors and invalid.value.field == invalid.value.errors[0]["field"]
    with pytest.raises(InvalidEnvironment):
        ef.create_environment("client-broken", "Broken", "class Broken(:\n")
    # A requirement this server does not allow (it allows none): the problem names it and the setting.
    with pytest.raises(InvalidEnvironment) as refused:
        ef.create_environment("client-needs", "Needs", "import mpmath\nclass Needs:\n    pass\n",
                              requirements=["mpmath==1.3.0"])
    assert refused.value.extra["reason"] == "requirement_not_allowed"
    assert refused.value.extra["setting"] == "ENVFOUNDRY_ALLOWED_REQUIREMENTS" and "mpmath==1.3.0" in refused.value.detail
    assert refused.value.field == "requirements[0]"


def test_adds_environments_and_scenarios(ef: Client) -> None:
    env = ef.create_environment("client-counter", "Counter", PROBE_CODE, summary="A counter.", rules=["Count up."])
    assert env.env_id == "client-counter" and [t["function"]["name"] for t in env.tools] == ["bump"]
    # other code under the id: its new, latest version; the first stays reachable by label or digest
    newer = ef.create_environment("client-counter", "Counter", PROBE_CODE + "\n# other code\n", label="second")
    assert newer.version != env.version and newer.label == "second"
    assert [(v.version, v.latest) for v in ef.environment_versions("client-counter")] == [
        (env.version, False), (newer.version, True)]
    assert ef.get_environment(f"client-counter@{env.version[:8]}").version == env.version
    with pytest.raises(Conflict):
        ef.create_environment("client-counter", "Counter", PROBE_CODE + "\n# third\n", label="second")
    manifest = ef.catalog_manifest()
    assert manifest.environments["library_circulation"] == ef.get_environment("library_circulation").version
    assert "client-counter" not in manifest.environments  # (what tenants add is not the loaded catalogs)
    scenario = ef.create_scenario(
        "client-counter", "Bump the counter twice.", init_config={"count": 1},
        checklist=[CheckItem("count is 3", "def check_func(final_state):\n    return final_state['count'] == 3\n")],
        reference_solution=[ToolCall("bump", {"by": 2})], scenario_id="client-counter-001")
    assert scenario.scenario_id == "client-counter-001" and scenario.init_config == {"count": 1}
    session = ef.create_session(env_id="client-counter", init_config={"count": 5})
    assert session.scenario_id is None and session.task is None
    assert ef.call(session.session_id, "bump", {"by": 2}).result == {"success": True, "data": 7}
    ef.delete_scenario("client-counter-001")
    with pytest.raises(NotFound):
        ef.get_scenario("client-counter-001")
    ef.delete_environment("client-counter")
    with pytest.raises(NotFound):
        ef.get_environment("client-counter")
    with pytest.raises(NotFound):
        ef.delete_environment("client-counter")


def test_finds_scenarios_by_split_and_tag_a_page_at_a_time(ef: Client) -> None:
    ef.create_environment("client-labels", "Counter", PROBE_CODE)
    made = [ef.create_scenario("client-labels", f"Bump {i}.", scenario_id=f"client-labels-{i:02d}",
                               split="test" if i % 2 else "train", tags=["client", f"n{i % 3}"]) for i in range(9)]
    try:
        assert made[1].split == "test" and made[1].tags == ("client", "n1")
        first = ef.find_scenarios(env_id="client-labels", split="test", limit=3)
        assert first.total == 4 and len(first.scenarios) == 3 and first.next_cursor is not None
        rest = ef.find_scenarios(env_id="client-labels", split="test", limit=3, cursor=first.next_cursor)
        assert [s.scenario_id for s in first.scenarios + rest.scenarios] == [
            "client-labels-01", "client-labels-03", "client-labels-05", "client-labels-07"]
        assert rest.next_cursor is None
        tagged = list(ef.iter_scenarios(tags=["client", "n0"], page_size=1))
        assert [s.scenario_id for s in tagged] == ["client-labels-00", "client-labels-03", "client-labels-06"]
        assert (tagged[1].split, tagged[1].tags) == ("test", ("client", "n0")) and ef.get_scenario("client-labels-06").tags == ("client", "n0")
        assert len(list(ef.iter_scenarios(page_size=7))) == ef.find_scenarios().total
        with pytest.raises(InvalidRequest) as bad:
            ef.find_scenarios(limit=5000)
        assert bad.value.field == "limit"
        with pytest.raises(InvalidRequest) as bad:
            ef.create_scenario("client-labels", "t", tags=["no spaces allowed"])
        assert bad.value.field == "tags.0"
    finally:
        for scenario in made:
            ef.delete_scenario(scenario.scenario_id)
        ef.delete_environment("client-labels")


@pytest.mark.anyio
async def test_async_client_has_the_same_endpoints(ef_server: Server) -> None:
    async with AsyncClient(ef_server.url) as aef:
        assert await aef.health() == "ok"
        session = await aef.create_session("store-001")
        sid = session.session_id
        assert session.env_id == "online_store_orders"
        scenario = await aef.get_scenario("store-001")
        assert scenario.reference_solution is not None
        for call in scenario.reference_solution:
            assert (await aef.call(sid, call.name, call.arguments)).ok
        assert (await aef.score(sid)).reward == 1.0
        assert [s.step async for s in aef.iter_trajectory(sid, page_size=1)] == [1, 2]
        listed = [s async for s in aef.iter_scenarios(env_id="online_store_orders", page_size=2)]
        assert [s.scenario_id for s in listed] == [s.scenario_id for s in await aef.list_scenarios("online_store_orders")]
        assert len(listed) > 2
        with pytest.raises(NotFound):
            await aef.get_environment("nope")
        await aef.delete_session(sid)


def test_both_clients_expose_every_endpoint_with_its_docstring() -> None:
    from envfoundry_client import endpoints

    for build in endpoints.ENDPOINTS:
        sync, asyn = getattr(Client, build.__name__), getattr(AsyncClient, build.__name__)
        assert sync.__doc__ == asyn.__doc__ == build.__doc__ and build.__doc__


def test_groups_come_from_one_request(ef: Client) -> None:
    group = ef.create_session("lib-001", n=3)
    assert len(set(group.session_ids)) == 3 and group.session_id == group.session_ids[0]
    ef.call(group.session_ids[1], "return_book", {"loan_id": "L0003"})
    assert [ef.get_session(s).steps for s in group.session_ids] == [0, 1, 0]
    forks = ef.fork(group.session_ids[1], n=2)
    assert len(forks.session_ids) == 2
    assert all(ef.get_session(s).parent_id == group.session_ids[1] for s in forks.session_ids)
    assert all(ef.state(s).state == ef.state(group.session_ids[1]).state for s in forks.session_ids)
    with pytest.raises(InvalidRequest) as too_many:
        ef.create_session("lib-001", n=100_000)
    assert too_many.value.field == "n" and "at most" in too_many.value.detail


def test_idempotency_keys_make_repeats_harmless(ef: Client) -> None:
    first = ef.create_session("lib-001", idempotency_key="client-create-1")
    again = ef.create_session("lib-001", idempotency_key="client-create-1")
    assert again.session_ids == first.session_ids
    sid = first.session_id
    one = ef.call(sid, "return_book", {"loan_id": "L0003"}, idempotency_key="client-call-1")
    two = ef.call(sid, "return_book", {"loan_id": "L0003"}, idempotency_key="client-call-1")
    assert one == two and one.ok and ef.get_session(sid).steps == 1
    with pytest.raises(IdempotencyKeyReused):
        ef.call(sid, "renew_loan", {"loan_id": "L0001"}, idempotency_key="client-call-1")
