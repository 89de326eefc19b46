"""End to end: ``synth all`` on the fixture corpus, then the produced catalog served and scored over the API."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from synthesis import cli
from tests.in_process import start_app
from tests.scripted_openai import Running
from tests.synthesis.conftest import write_config

KEPT_SCENARIOS = ["clinic_appointments-s01", "clinic_appointments-s02", "parking_permits-s01", "parking_permits-s02",
                  "warehouse_inventory-s01", "warehouse_inventory-s02"]
FAILING_ROUTE = "event_ticketing/state_plan/main"  # always 503: the one item that fails


@dataclass
class FirstRun:
    out: Path
    config: Path
    requests: int
    stdout: str
    code: int
    parking_task_prompt: str  # what the scenario stage asked for the environment that lost a tool


def synth(stage: str, config: Path, out: Path, *extra: str) -> int:
    return cli.main(["synth", stage, "--config", str(config), "--out", str(out), *extra])


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory, llm_server: Running) -> Iterator[FirstRun]:
    """One whole run on the fixture corpus, shared by the tests below (each works on its own copy)."""
    import contextlib
    import io

    llm_server.script.reset()
    folder = tmp_path_factory.mktemp("first")
    config = write_config(folder, llm_server.url)
    out = folder / "catalog"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = synth("all", config, out)
    assert not llm_server.script.missing, llm_server.script.missing
    prompt = llm_server.script.conversations["parking_permits/task/s01"][0][1]["content"]
    yield FirstRun(out, config, llm_server.script.count(), stdout.getvalue(), code, prompt)


def copy_of(run: FirstRun, tmp_path: Path) -> Path:
    out = tmp_path / "catalog"
    shutil.copytree(run.out, out)
    return out


def test_synth_all_makes_a_catalog_the_service_serves_with_reward_1(first_run: FirstRun) -> None:
    assert first_run.code == 0, first_run.stdout
    lines = first_run.stdout.splitlines()
    assert [line.split()[0] for line in lines[2:9]] == ["themes", "dedup", "skeletons", "assess", "scenarios", "publish", "total"]
    assert "skeletons: FAILED event_ticketing: chat/completions (gen-large): gave up after 3 attempts" in first_run.stdout
    for reason in ("themes: dropped 1 (open_qa)", "dedup: dropped 1 (duplicate)",
                   "assess: parking_permits: repaired get_permit, issue_permit; removed cancel_permit "
                   "(fail 3, pass 2, warning 1 -> pass 4, warning 1)",
                   "scenarios: clinic_appointments-s02: kept after 2 validations, 1 draft(s); repairs: check"):  # fmt: skip
        assert reason in lines
    summary = json.loads((first_run.out / "_work" / "summary.json").read_text())
    for stage in ("themes", "skeletons", "assess", "scenarios"):
        usage = summary["usage"][stage]
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0 and usage["cost"] > 0
    assert summary["total"]["requests"] >= first_run.requests

    # no environment ships with a tool its assessment labelled fail: each was repaired or removed
    assessments = [json.loads(line) for line in (first_run.out / "_work" / "assessments.jsonl").read_text().splitlines()]
    for record in (r for r in assessments if r["status"] == "kept"):
        assert all(e.get("tool_removed") for e in record["log"] if e.get("verdict") == "fail"), record["key"]
    # every answer sent back to the model is on record: the method cut off, the operation named like an attribute
    clinic = json.loads((first_run.out / "clinic_appointments" / "env.json").read_text())["provenance"]["reasks"]
    assert [(r["stage"], r["template"], r["item"], r["cut_off"]) for r in clinic[:2]] == [
        ("skeletons", "operation_plan", "main", False), ("skeletons", "operation_code", "book_appointment", True)]
    assert "'appointments' is a state attribute" in clinic[0]["problem"]
    scenario = json.loads((first_run.out / "warehouse_inventory" / "scenarios.jsonl").read_text().splitlines()[0])
    assert scenario["provenance"]["reasks"] == [{"template": "check_func", "item": "s01-c3", "turn": 0, "cut_off": False,
                                                 "problem": "line 4: the check modifies the state it inspects; read it "
                                                            "without changing it"}]  # fmt: skip
    # published checks say whether they check a change or something left as it was
    assert {c.get("kind") for c in scenario["checklist"]} <= {"change", "keep"} and scenario["checklist"]
    assert all(c.get("kind") in ("change", "keep") for c in scenario["checklist"])
    provenance = json.loads((first_run.out / "parking_permits" / "env.json").read_text())["provenance"]["assessment"]
    assert (provenance["removed"], provenance["first_counts"]["fail"], provenance["ratio"]) == (["cancel_permit"], 3, 1.0)
    # scenario generation saw only what remains of it: no removed tool, no rule or text about cancelling
    assert "cancel_permit" not in first_run.parking_task_prompt and "issue_permit" in first_run.parking_task_prompt
    assert "Only active permits can be cancelled" not in first_run.parking_task_prompt
    assert "cancel permits" not in first_run.parking_task_prompt

    server = start_app(catalogs=(first_run.out,))
    try:
        with server.client() as http:
            envs = http.get("/v1/environments").json()
            assert sorted(e["env_id"] for e in envs["environments"]) == ["clinic_appointments", "parking_permits",
                                                                         "warehouse_inventory"]  # fmt: skip
            parking = http.get("/v1/environments/parking_permits").json()
            assert "cancel_permit" not in {t["function"]["name"] for t in parking["tools"]}
            # the published catalog is locked, and each served version traces back to the run that made it
            assert http.get("/v1/catalog/manifest").json()["drift"] == []
            traced = [json.loads(line) for line in (first_run.out / "_work" / "versions.jsonl").read_text().splitlines()]
            served = {e["env_id"]: http.get(f"/v1/environments/{e['env_id']}").json() for e in envs["environments"]}
            assert {(t["env_id"], t["version"]) for t in traced} == {(k, v["version"]) for k, v in served.items()}
            assert {t["run"] for t in traced} == {served["parking_permits"]["provenance"]["run"]}
            assert traced[0]["models"] == served["parking_permits"]["provenance"]["models"]
            assert not any("cancel" in rule for rule in parking["rules"]), parking["rules"]
            for scenario_id in KEPT_SCENARIOS:
                scenario = http.get(f"/v1/scenarios/{scenario_id}").json()
                created = http.post("/v1/sessions", json={"scenario_id": scenario_id})
                assert created.status_code == 201, created.text
                session = created.json()["session_id"]
                before = http.post(f"/v1/sessions/{session}/score").json()
                assert before["reward"] < 1.0
                for call in scenario["reference_solution"]:
                    step = http.post(f"/v1/sessions/{session}/calls", json=call).json()
                    assert step["ok"] and step["result"]["success"], step
                score = http.post(f"/v1/sessions/{session}/score").json()
                assert score["reward"] == 1.0, score
                assert score["total"] == len(scenario["checklist"]) >= 2
    finally:
        server.stop()


def test_a_rerun_skips_finished_items_by_their_records_and_retries_failed_ones(
    first_run: FirstRun, tmp_path: Path, llm: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    out = copy_of(first_run, tmp_path)
    shutil.rmtree(out / "_work" / "cache")  # no cache: the records alone must skip finished items
    assert synth("all", first_run.config, out) == 0
    assert {r.route for r in llm.script.requests} == {FAILING_ROUTE} and llm.script.count() == 3
    assert "10/10  resumed 10" in capsys.readouterr().err


def test_a_rerun_of_a_finished_run_makes_no_request(first_run: FirstRun, tmp_path: Path, llm: Running) -> None:
    out = copy_of(first_run, tmp_path)
    # --max-envs 2 leaves the failing environment out, so nothing is unfinished
    assert synth("all", first_run.config, out, "--max-envs", "2") == 0
    assert llm.script.count() == 0
    assert sorted(p.name for p in out.iterdir()) == ["_work", "clinic_appointments", "envfoundry.lock.json",
                                                     "warehouse_inventory"]
    assert synth("all", first_run.config, out, "--max-envs", "2") == 0
    assert llm.script.count() == 0


def test_the_cache_replays_a_whole_run_without_requests(first_run: FirstRun, tmp_path: Path, llm: Running) -> None:
    out = copy_of(first_run, tmp_path)
    for name in ("themes.jsonl", "environments.json", "skeletons.jsonl", "assessments.jsonl", "scenarios.jsonl"):
        (out / "_work" / name).unlink()
    assert synth("all", first_run.config, out) == 0
    assert {r.route for r in llm.script.requests} == {FAILING_ROUTE}  # only failures are never cached
    again = {k: json.loads(line)["scenario"] for line in (out / "_work" / "scenarios.jsonl").read_text().splitlines()
             for k in [json.loads(line)["key"]]}  # fmt: skip
    first = {json.loads(line)["key"]: json.loads(line)["scenario"]
             for line in (first_run.out / "_work" / "scenarios.jsonl").read_text().splitlines()}  # fmt: skip
    assert again == first
    summary = json.loads((out / "_work" / "summary.json").read_text())
    assert summary["usage"]["scenarios"]["cached"] > 0 and summary["usage"]["scenarios"]["requests"] == 0


def test_stages_run_one_at_a_time(tmp_path: Path, llm: Running) -> None:
    config = write_config(tmp_path, llm.url, run={"max_envs": 1})
    out = tmp_path / "catalog"
    assert synth("themes", config, out) == 0
    assert {r.route.split("/")[0] for r in llm.script.requests} == {"corpus", "embeddings"}
    llm.script.reset()
    assert synth("skeletons", config, out) == 0
    assert {r.route.split("/")[0] for r in llm.script.requests} == {"clinic_appointments"}
    assert json.loads((out / "_work" / "skeletons.jsonl").read_text().splitlines()[0])["status"] == "kept"
    assert not (out / "clinic_appointments").exists()  # only the scenarios stage publishes
