"""``envfoundry catalog import-bfcl`` on a package in bfcl-eval's layout (API classes, entries and ground truth
written for these tests), its catalog validated, and BFCL's state and response checks scored by the real app
(in this process). bfcl-eval itself is not installed for the tests: its dependencies (model SDKs, sentence-transformers,
faiss) are far heavier than the files the importer reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.catalog.importers.bfcl_data import ADDED_FUNCTIONS_PROMPT
from tests.conftest import ROOT
from tests.in_process import start_app
from tests.service.test_api import call, new_session, state
from tests.service.test_cli import run

PACKAGE = ROOT / "tests" / "fixtures" / "bfcl" / "bfcl_eval"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("bfcl") / "catalog"
    result = run("catalog", "import-bfcl", "--source", str(PACKAGE), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out, result.stdout


@pytest.fixture(scope="module")
def mpmath_allowed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Settings that let the MathAPI environment have mpmath: the wheel fetched once through pip's
    configured index (PyPI) into a wheelhouse the service then installs from with no index."""
    wheels = tmp_path_factory.mktemp("mpmath-wheels")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--dest",
                    str(wheels), "mpmath==1.3.0"], check=True, timeout=300)
    wheels.chmod(0o755)  # (pip runs as a uid of its own, which must read the wheelhouse)
    return {"ENVFOUNDRY_ALLOWED_REQUIREMENTS": "mpmath", "ENVFOUNDRY_WHEELHOUSE": str(wheels),
            "ENVFOUNDRY_LAYERS_DIR": str(tmp_path_factory.mktemp("layers"))}


@pytest.fixture(scope="module")
def client(imported: tuple[Path, str], mpmath_allowed: dict[str, str]) -> Iterator[httpx.Client]:
    server = start_app(catalogs=(imported[0],), extra_env=mpmath_allowed)
    try:
        with server.client() as http:
            yield http
    finally:
        server.stop()


def test_one_environment_per_set_of_classes_and_excluded_functions(imported: tuple[Path, str]) -> None:
    out, printed = imported
    assert sorted(p.name for p in out.iterdir()) == ["bfcl_CounterAPI-CalcAPI", "bfcl_CounterAPI-NotesAPI",
                                                     "bfcl_NotesAPI", "bfcl_NotesAPI_without_delete_note"]
    # Each entry turn by turn (all four categories), and base and long_context also all at once.
    assert printed.strip().endswith(f"wrote 4 environments and 12 scenarios to {out}")
    # Classes that import a package outside the standard library (MathAPI's mpmath) declare it, at the
    # version bfcl-eval's own metadata requires.
    assert json.loads((out / "bfcl_CounterAPI-CalcAPI" / "env.json").read_text())["requirements"] == ["mpmath==1.3.0"]
    assert "requirements" not in json.loads((out / "bfcl_NotesAPI" / "env.json").read_text())
    assert "multi_turn_base_2" not in printed
    # A ground truth that breaks BFCL's own schema (BFCL runs it as it is) widens the parameter, said in a note.
    assert ("NOTE multi_turn_base_3: bfcl_NotesAPI: add_note(title) also takes integer: the ground truth passes 5 "
            "where BFCL's doc says string") in printed
    notes = json.loads((out / "bfcl_NotesAPI" / "env.json").read_text())["tools"]["add_note"]["parameters"]
    assert notes["properties"]["title"]["type"] == ["string", "integer"]
    tools = json.loads((out / "bfcl_NotesAPI_without_delete_note" / "env.json").read_text())["tools"]
    assert set(tools) == {"add_note", "list_titles"}
    both = json.loads((out / "bfcl_CounterAPI-NotesAPI" / "env.json").read_text())["tools"]
    assert both["increment"]["parameters"]["type"] == "object"  # BFCL's "dict" spelled as JSON Schema
    assert both["add_note"]["description"].startswith("This tool belongs to the NotesAPI")


def test_ground_truth_calls_become_named_reference_solutions(imported: tuple[Path, str]) -> None:
    lines = (imported[0] / "bfcl_CounterAPI-NotesAPI" / "scenarios.jsonl").read_text().splitlines()
    by_id = {s["scenario_id"]: s for s in map(json.loads, lines)}
    at_once = by_id["bfcl-multi-turn-base-0-all-at-once"]
    assert at_once["split"] == "multi_turn_base_all_at_once" and at_once["tags"] == ["bfcl"]
    assert at_once["reference_solution"] == [
        {"name": "add_note", "arguments": {"title": "todo", "text": "buy milk"}},
        {"name": "increment", "arguments": {"times": 3}},  # positional in BFCL's ground truth
        {"name": "get_count", "arguments": {}},
    ]
    assert at_once["task"].startswith("[turn 1] Add a note") and "[turn 2] Now bump" in at_once["task"]
    assert [c["item"].split("'")[0] for c in at_once["checklist"]] == ["CounterAPI", "NotesAPI",
                                                                       "Every ground-truth result appears among the calls"]
    # BFCL's own protocol: a turn per question, its checks after it, its part of the ground truth.
    turned = by_id["bfcl-multi-turn-base-0"]
    assert turned["split"] == "multi_turn_base" and turned["checklist"] == []
    assert [t["message"] for t in turned["turns"]] == ["Add a note titled 'todo' saying 'buy milk'.",
                                                       "Now bump the counter three times and tell me where it stands."]
    assert [len(t["reference_solution"]) for t in turned["turns"]] == [1, 2]
    assert [c["item"].split("'")[0].split(" (")[0] for c in turned["turns"][1]["checklist"]] == [
        "The model called a function in this turn", "CounterAPI", "NotesAPI",
        "Every ground-truth result appears among the calls"]
    # miss_func: the function BFCL withholds arrives with the turn that only brings functions.
    missed = by_id["bfcl-multi-turn-miss-func-0"]["turns"]
    assert missed[2] == {**missed[2], "tools": ["increment"], "message": ADDED_FUNCTIONS_PROMPT}
    assert missed[1]["checklist"] == [] and missed[1]["reference_solution"] == []  # BFCL checks no empty turn


def test_validate_replays_every_reference_solution_to_one(imported: tuple[Path, str],
                                                          mpmath_allowed: dict[str, str]) -> None:
    result = _validate(imported[0], mpmath_allowed)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("4 environments, 12 scenarios, 0 problems")


def test_validate_names_a_requirement_the_operator_has_not_allowed(imported: tuple[Path, str]) -> None:
    result = _validate(imported[0], {})
    assert result.returncode == 1
    assert ("PROBLEM bfcl_CounterAPI-CalcAPI: requirement_not_allowed: requirements[0]: 'mpmath==1.3.0' is not allowed "
            "on this service (ENVFOUNDRY_ALLOWED_REQUIREMENTS allows nothing)") in result.stdout
    assert result.stdout.strip().endswith("3 environments, 10 scenarios, 1 problems")


def _validate(folder: Path, settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVFOUNDRY_") or k == "ENVFOUNDRY_SANDBOX_IMAGE"}
    return subprocess.run([sys.executable, "-m", "service.cli", "catalog", "validate", str(folder)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, env={**env, **settings})


def test_math_api_entries_are_served_with_mpmath(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="bfcl-multi-turn-base-2")
    assert call(client, sid, "square_root", {"number": 2.0})["observation"] == '{"result": 1.4142135623730951}'
    call(client, sid, "increment", {})
    assert client.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0


def test_each_bfcl_module_keeps_its_own_names_and_answers_as_bfcls_executor(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="bfcl-multi-turn-base-0")
    # Both modules define DEFAULT_STATE; each class loaded its scenario with its own.
    view = state(client, sid)["state"]
    assert "CounterAPI" in view and "NotesAPI" in view
    bad = call(client, sid, "increment", {"times": -1})
    assert bad["observation"] == "Error during execution: times must not be negative"
    assert call(client, sid, "get_count")["observation"] == '{"count": 5}'


def test_bfcls_state_and_response_checks_score_a_session(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="bfcl-multi-turn-base-0-all-at-once")
    call(client, sid, "add_note", {"title": "todo", "text": "buy milk"})
    call(client, sid, "increment", {"times": 2})
    call(client, sid, "increment", {"times": 1})  # the same count as the ground truth's increment(3)
    score = client.post(f"/v1/sessions/{sid}/score").json()
    outcome = {check["item"].split("'")[0]: check["passed"] for check in score["checks"]}
    # The state matches, but {"count": 11} appeared once where the ground truth's increment(3) and get_count()
    # give it twice.
    assert outcome == {"CounterAPI": True, "NotesAPI": True, "Every ground-truth result appears among the calls": False}
    call(client, sid, "get_count")
    assert client.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0  # as in BFCL: results, not calls

    sid = new_session(client, scenario_id="bfcl-multi-turn-base-0-all-at-once")
    call(client, sid, "add_note", {"title": "todo", "text": "buy bread"})
    call(client, sid, "increment", {"times": 3})
    call(client, sid, "get_count")
    score = client.post(f"/v1/sessions/{sid}/score").json()
    outcome = {check["item"].split("'")[0]: check["passed"] for check in score["checks"]}
    assert outcome["NotesAPI"] is False and outcome["CounterAPI"] is True


def test_long_context_entries_load_the_long_context_state(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="bfcl-multi-turn-long-context-0")
    assert call(client, sid, "delete_note", {"title": "archived 7"})["observation"] == '{"deleted": true}'
    titles = json.loads(call(client, sid, "list_titles")["observation"])["titles"]
    assert len(titles) == 50 and "welcome" in titles
    long = client.get("/v1/scenarios", params={"split": "multi_turn_long_context", "tag": "bfcl"}).json()
    assert [s["scenario_id"] for s in long["scenarios"]] == ["bfcl-multi-turn-long-context-0"]


def test_categories_it_cannot_serve_are_refused_by_name(tmp_path: Path) -> None:
    result = run("catalog", "import-bfcl", "--source", str(PACKAGE), "--out", str(tmp_path / "out"),
                 "--category", "multi_turn_composite")
    assert result.returncode == 2 and "invalid choice: 'multi_turn_composite'" in result.stderr
    result = run("catalog", "import-bfcl", "--source", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.returncode == 1 and "not a bfcl_eval package: cannot read BFCL's class mappings" in result.stderr
    assert not (tmp_path / "out").exists()


def test_without_source_it_reads_the_installed_package_without_importing_it(tmp_path: Path) -> None:
    # The fixture's __init__ raises ImportError: the import succeeds only if the package is never imported.
    env = {**os.environ, "PYTHONPATH": f"{PACKAGE.parent}{os.pathsep}{ROOT}"}
    result = subprocess.run([sys.executable, "-m", "service.cli", "catalog", "import-bfcl", "--out",
                             str(tmp_path / "out"), "--category", "multi_turn_base"],
                            capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(f"wrote 4 environments and 8 scenarios to {tmp_path / 'out'}")


def end_turn(client: httpx.Client, sid: str) -> dict[str, Any]:
    answer = client.post(f"/v1/sessions/{sid}/turns")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_bfcl_turn_by_turn_checks_every_turn_as_bfcl_does(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="bfcl-multi-turn-base-0")
    # The whole episode's work in the first turn: BFCL's state check after turn 1 fails (the counter moved).
    call(client, sid, "add_note", {"title": "todo", "text": "buy milk"})
    call(client, sid, "increment", {"times": 3})
    call(client, sid, "get_count")
    end_turn(client, sid)
    end_turn(client, sid)  # nothing called: BFCL fails a turn whose ground truth has calls
    score = client.post(f"/v1/sessions/{sid}/score").json()
    first = {c["item"].split("'")[0].split(" (")[0]: c["passed"] for c in score["turns"][0]["checks"]}
    assert first == {"The model called a function in this turn": True, "CounterAPI": False, "NotesAPI": True,
                     "Every ground-truth result appears among the calls": True}
    assert score["turns"][1]["checks"][0]["passed"] is False
    assert (score["reward"], score["turns_passed"]) == (0.0, 0)


def test_miss_func_and_miss_param_are_played_turn_by_turn(client: httpx.Client) -> None:
    sid = new_session(client, scenario_id="bfcl-multi-turn-miss-func-0")
    call(client, sid, "add_note", {"title": "todo", "text": "buy milk"})
    end_turn(client, sid)
    assert call(client, sid, "increment", {"times": 3})["error"]["type"] == "unknown_tool"  # withheld in turn 2
    arrived = end_turn(client, sid)
    assert arrived["user_message"] == ADDED_FUNCTIONS_PROMPT and [t["function"]["name"] for t in arrived["new_tools"]] == [
        "increment"]
    call(client, sid, "increment", {"times": 3})
    call(client, sid, "get_count")
    assert end_turn(client, sid)["done"] is True
    assert client.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0
    # A do-nothing agent ends every turn without a call: BFCL gives it 0 (the turn that has calls fails);
    # the turn whose parameter is missing passes (BFCL checks nothing there).
    sid = new_session(client, scenario_id="bfcl-multi-turn-miss-param-0")
    end_turn(client, sid)
    end_turn(client, sid)
    score = client.post(f"/v1/sessions/{sid}/score").json()
    assert (score["reward"], score["partial_credit"]) == (0.0, 0.5)
    assert [t["passed"] for t in score["turns"]] == [True, False]


def test_a_withheld_function_the_ground_truth_calls_earlier_arrives_where_it_is_called() -> None:
    from service.catalog.importers.bfcl import _arrivals
    from service.catalog.model import ToolCall

    # miss_func 49's shape: tail is called in turn 1 but listed as missing until turn 3.
    entry = {"missed_function": {"3": ["wc", "tail"]}}
    truth = [[ToolCall("ls", {})], [ToolCall("tail", {"file_name": "a"})], [], [ToolCall("wc", {})]]
    arrival, notes = _arrivals(entry, truth)
    assert arrival == {"wc": 3, "tail": 1}
    assert notes == ["tail arrives in turn 1, where the ground truth calls it, not in turn 3 as BFCL withholds it"]
