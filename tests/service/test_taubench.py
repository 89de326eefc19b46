"""``envfoundry catalog import-taubench`` on a checkout in tau-bench's layout (a fixture domain written for these
tests), its catalog validated, and tau-bench's reward scored by the real app (in this process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.in_process import start_app
from tests.service.test_api import call, new_session, problem, state
from tests.service.test_cli import run

CHECKOUT = ROOT / "tests" / "fixtures" / "taubench"
DOMAIN = CHECKOUT / "tau_bench" / "envs" / "shop"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("taubench") / "catalog"
    result = run("catalog", "import-taubench", str(CHECKOUT), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(f"wrote 1 environments and 4 scenarios to {out}")
    return out


@pytest.fixture(scope="module")
def client(imported: Path) -> Iterator[httpx.Client]:
    server = start_app(catalogs=(imported,))
    try:
        with server.client() as http:
            yield http
    finally:
        server.stop()


def scenarios(imported: Path) -> dict[str, dict[str, Any]]:
    lines = (imported / "taubench_shop" / "scenarios.jsonl").read_text().splitlines()
    return {record["scenario_id"]: record for record in map(json.loads, lines)}


def test_a_domain_becomes_one_package_with_the_wiki_rules_and_the_benchmarks_tool_schemas(imported: Path) -> None:
    manifest = json.loads((imported / "taubench_shop" / "env.json").read_text())
    assert manifest["introduction"] == (DOMAIN / "wiki.md").read_text()
    assert manifest["rules"] == ["Authenticate the user by email before acting.",
                                 "Ask for explicit confirmation before changing an order."]
    cancel = manifest["tools"]["cancel_order"]
    assert cancel["description"] == "Cancel a pending order and refund its total to the gift card."
    assert cancel["parameters"]["properties"]["reason"]["enum"] == ["no longer needed", "ordered by mistake"]
    assert set(manifest["tools"]) == {"find_user", "get_order", "cancel_order", "transfer_to_human_agents", "respond"}
    code = (imported / "taubench_shop" / "env.py").read_text()
    assert "tau_bench" not in code  # the checkout's imports are gone: the code stands alone in the sandbox


def test_every_split_becomes_scenarios_without_a_copy_of_the_database(imported: Path) -> None:
    found = scenarios(imported)
    assert set(found) == {"taubench-shop-dev-0", "taubench-shop-test-0", "taubench-shop-test-1",
                          "taubench-shop-train-0"}
    second = found["taubench-shop-test-1"]
    assert second["task"].startswith("You are Alan Turing")
    assert set(second["init_config"]) == {"_ground_truth", "_user_id"}
    assert [c["name"] for c in second["reference_solution"]] == [
        "find_user", "get_order", "transfer_to_human_agents", "respond"]
    assert len(second["checklist"]) == 2 and "unchanged_is_correct" not in second  # it needs an answer
    assert found["taubench-shop-dev-0"]["unchanged_is_correct"] is True
    assert {sid: (s["split"], s["tags"]) for sid, s in found.items()} == {
        sid: (sid.split("-")[2], ["taubench", "shop"]) for sid in found}


def test_validate_replays_every_reference_solution_to_one(imported: Path) -> None:
    result = run("catalog", "validate", str(imported))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("1 environments, 4 scenarios, 0 problems")
    # The dev task's answer is a refusal: as in tau-bench, an untouched database is the right one.
    assert ("NOTE taubench_shop/taubench-shop-dev-0: every check passes on the initial state, as declared"
            in result.stdout)


def test_the_database_check_is_taubenchs_hash_against_the_ground_truth_replay(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="taubench-shop-test-0")
    assert state(client, sid)["state"]["data"]["orders"]["#W1"]["status"] == "pending"
    assert client.post(f"/v1/sessions/{sid}/score").json()["reward"] == 0.0
    missing = call(client, sid, "cancel_order", {"order_id": "#W9", "reason": "no longer needed"})
    assert missing["observation"] == "Error: '#W9'"  # tau-bench's Env.step turns an exception into an observation
    call(client, sid, "cancel_order", {"order_id": "#W1", "reason": "ordered by mistake"})
    wrong = client.post(f"/v1/sessions/{sid}/score").json()
    assert wrong["reward"] == 0.0  # cancelled, but not as the ground truth did: the hashes differ

    sid = new_session(client, scenario_id="taubench-shop-test-0")
    call(client, sid, "find_user", {"email": "ada@example.com"})
    done = call(client, sid, "cancel_order", {"order_id": "#W1", "reason": "no longer needed"})
    assert json.loads(done["observation"])["status"] == "cancelled"
    assert client.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0


def test_required_outputs_are_looked_for_in_respond_messages(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="taubench-shop-test-1")
    call(client, sid, "get_order", {"order_id": "#W2"})
    call(client, sid, "respond", {"content": "Your order cost forty dollars."})
    score = client.post(f"/v1/sessions/{sid}/score").json()
    outcome = {check["item"]: check["passed"] for check in score["checks"]}
    assert outcome == {"The database equals the one the ground-truth actions produce": True,
                       "A message to the user contains '40.0'": False}
    call(client, sid, "respond", {"content": "It cost 40.0, I am handing you over."})
    assert client.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0


def test_every_split_is_served_beside_the_test_split(client: httpx.Client) -> None:
    listed = client.get("/v1/environments/taubench_shop/scenarios").json()["scenarios"]
    assert {s["scenario_id"] for s in listed} == {"taubench-shop-dev-0", "taubench-shop-test-0",
                                                  "taubench-shop-test-1", "taubench-shop-train-0"}
    problem(client.post("/v1/sessions", json={"scenario_id": "taubench-shop-dev-1"}), 404, "not-found")
    test = client.get("/v1/scenarios", params={"split": "test", "tag": ["taubench", "shop"]}).json()
    assert [s["scenario_id"] for s in test["scenarios"]] == ["taubench-shop-test-0", "taubench-shop-test-1"]


def test_a_folder_that_is_not_a_checkout_is_a_plain_error(tmp_path: Path) -> None:
    result = run("catalog", "import-taubench", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "is not a tau-bench checkout: no tau_bench/envs/<domain>/tools" in result.stderr
    assert not (tmp_path / "out").exists()
