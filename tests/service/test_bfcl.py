"""``envfoundry catalog import-bfcl`` on a package in bfcl-eval's layout (API classes, entries and ground truth
written for these tests), its catalog validated, and BFCL's state and response checks scored through a real
server. bfcl-eval itself is not installed for the tests: its dependencies (model SDKs, sentence-transformers,
faiss) are far heavier than the files the importer reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, start_server
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
def client(imported: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory,
           mpmath_allowed: dict[str, str]) -> Iterator[httpx.Client]:
    server = start_server(tmp_path_factory.mktemp("bfcl-server"), catalogs=(imported[0],), extra_env=mpmath_allowed)
    try:
        with server.client() as http:
            yield http
    finally:
        server.stop()


def test_one_environment_per_set_of_classes_and_excluded_functions(imported: tuple[Path, str]) -> None:
    out, printed = imported
    assert sorted(p.name for p in out.iterdir()) == ["bfcl_CounterAPI-CalcAPI", "bfcl_CounterAPI-NotesAPI",
                                                     "bfcl_NotesAPI", "bfcl_NotesAPI_without_delete_note"]
    assert printed.strip().endswith(f"wrote 4 environments and 4 scenarios to {out}")
    # Classes that import a package outside the standard library (MathAPI's mpmath) declare it, at the
    # version bfcl-eval's own metadata requires.
    assert json.loads((out / "bfcl_CounterAPI-CalcAPI" / "env.json").read_text())["requirements"] == ["mpmath==1.3.0"]
    assert "requirements" not in json.loads((out / "bfcl_NotesAPI" / "env.json").read_text())
    assert "multi_turn_base_2" not in printed
    # So is one whose ground truth the service could never replay: it breaks BFCL's own schema.
    assert ("SKIPPED multi_turn_base_3: its ground truth does not match BFCL's own schema: add_note: "
            "argument 'title': 5 is not of type 'string'") in printed
    tools = json.loads((out / "bfcl_NotesAPI_without_delete_note" / "env.json").read_text())["tools"]
    assert set(tools) == {"add_note", "list_titles"}
    both = json.loads((out / "bfcl_CounterAPI-NotesAPI" / "env.json").read_text())["tools"]
    assert both["increment"]["parameters"]["type"] == "object"  # BFCL's "dict" spelled as JSON Schema
    assert both["add_note"]["description"].startswith("This tool belongs to the NotesAPI")


def test_ground_truth_calls_become_named_reference_solutions(imported: tuple[Path, str]) -> None:
    line = (imported[0] / "bfcl_CounterAPI-NotesAPI" / "scenarios.jsonl").read_text().splitlines()[0]
    scenario = json.loads(line)
    assert scenario["scenario_id"] == "bfcl-multi-turn-base-0"
    assert scenario["split"] == "multi_turn_base" and scenario["tags"] == ["bfcl"]
    assert scenario["reference_solution"] == [
        {"name": "add_note", "arguments": {"title": "todo", "text": "buy milk"}},
        {"name": "increment", "arguments": {"times": 3}},  # positional in BFCL's ground truth
        {"name": "get_count", "arguments": {}},
    ]
    assert scenario["task"].startswith("[turn 1] Add a note") and "[turn 2] Now bump" in scenario["task"]
    assert [c["item"].split("'")[0] for c in scenario["checklist"]] == ["CounterAPI", "NotesAPI",
                                                                        "Every ground-truth result appears among the calls"]


def test_validate_replays_every_reference_solution_to_one(imported: tuple[Path, str],
                                                          mpmath_allowed: dict[str, str]) -> None:
    result = _validate(imported[0], mpmath_allowed)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("4 environments, 4 scenarios, 0 problems")


def test_validate_names_a_requirement_the_operator_has_not_allowed(imported: tuple[Path, str]) -> None:
    result = _validate(imported[0], {})
    assert result.returncode == 1
    assert ("PROBLEM bfcl_CounterAPI-CalcAPI: requirement_not_allowed: requirements[0]: 'mpmath==1.3.0' is not allowed "
            "on this service (ENVFOUNDRY_ALLOWED_REQUIREMENTS allows nothing)") in result.stdout
    assert result.stdout.strip().endswith("3 environments, 3 scenarios, 1 problems")


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
    sid = new_session(client, scenario_id="bfcl-multi-turn-base-0")
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

    sid = new_session(client, scenario_id="bfcl-multi-turn-base-0")
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
                 "--category", "multi_turn_miss_func")
    assert result.returncode == 2 and "invalid choice: 'multi_turn_miss_func'" in result.stderr
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
    assert result.stdout.strip().endswith(f"wrote 3 environments and 3 scenarios to {tmp_path / 'out'}")
