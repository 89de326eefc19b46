"""The envfoundry command as users run it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import BUNDLED, ROOT

ENVSCALER = ROOT / "tests" / "fixtures" / "envscaler"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_validate_passes_on_the_bundled_catalog() -> None:
    result = run("catalog", "validate", str(BUNDLED))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("0 problems")
    summary = result.stdout.strip().splitlines()[-1]
    envs, scenarios = int(summary.split()[0]), int(summary.split()[2])
    assert envs >= 2 and scenarios >= 6


def test_validate_reports_a_reference_solution_that_misses_a_check(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    shutil.copytree(BUNDLED / "library_circulation", catalog / "library_circulation")
    path = catalog / "library_circulation" / "scenarios.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines[0]["reference_solution"] = lines[0]["reference_solution"][:-1]
    lines[1]["reference_solution"].append({"name": "no_such_tool", "arguments": {}})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = run("catalog", "validate", str(catalog))
    assert result.returncode == 1
    assert f"{lines[0]['scenario_id']}: check not passed" in result.stdout
    assert "unknown_tool" in result.stdout


def test_validate_reports_checks_that_cannot_fail(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    shutil.copytree(BUNDLED / "library_circulation", catalog / "library_circulation")
    path = catalog / "library_circulation" / "scenarios.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for check in lines[0]["checklist"]:
        check["check"] = "def check_func(final_state):\n    return True"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = run("catalog", "validate", str(catalog))
    assert result.returncode == 1
    assert f"{lines[0]['scenario_id']}: every check already passes on the initial state" in result.stdout


def test_validate_reads_the_kind_of_a_check_that_passes_before_any_call(tmp_path: Path) -> None:
    """A 'keep' check passing on the initial state is what it is for; a 'change' check passing there
    checks nothing the agent does; a check of no kind gets the note it always got."""
    catalog = tmp_path / "catalog"
    shutil.copytree(BUNDLED / "library_circulation", catalog / "library_circulation")
    path = catalog / "library_circulation" / "scenarios.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    always = "def check_func(final_state):\n    return True"
    keep, change, plain = ({"item": f"{kind} check", "check": always, **({"kind": kind} if kind else {})}
                           for kind in ("keep", "change", None))
    lines[0]["checklist"] += [keep, change]
    lines[1]["checklist"] += [plain]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = run("catalog", "validate", str(catalog))
    assert result.returncode == 1
    first, second = lines[0]["scenario_id"], lines[1]["scenario_id"]
    assert f"{first}: a 'change' check passes before any call, so it checks nothing the agent does: change check" \
        in result.stdout
    assert "keep check" not in result.stdout
    assert f"{second}: passes before any call (fine for a 'leave unchanged' check; give it kind 'keep' to say " \
           "so): None check" in result.stdout
    bad = dict(lines[0], checklist=[{"item": "x", "check": always, "kind": "maybe"}])
    path.write_text(json.dumps(bad) + "\n")
    refused = run("catalog", "validate", str(catalog))
    assert refused.returncode != 0 and "checklist[0].kind must be 'change' or 'keep'" in refused.stdout + refused.stderr


def test_validate_reports_a_package_that_does_not_load(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(BUNDLED / "online_store_orders", broken / "online_store_orders")
    (broken / "online_store_orders" / "env.py").write_text("class OnlineStoreOrderSystem(:\n")
    result = run("catalog", "validate", str(broken))
    assert result.returncode == 1
    assert "syntax error at line 1" in result.stdout + result.stderr


def test_import_then_export_envscaler_json(tmp_path: Path) -> None:
    out = tmp_path / "packages"
    imported = run("catalog", "import-envscaler", str(ENVSCALER / "envs.json"), str(ENVSCALER / "scenarios.json"),
                   "--out", str(out))
    assert imported.returncode == 0, imported.stderr
    assert "SKIPPED" in imported.stdout  # the fixture holds a scenario for a missing environment
    envs_out, scenarios_out = tmp_path / "envs.json", tmp_path / "scenarios.json"
    exported = run("catalog", "export-envscaler", str(out), "--envs-out", str(envs_out),
                   "--scenarios-out", str(scenarios_out))
    assert exported.returncode == 0, exported.stderr
    original = json.loads((ENVSCALER / "envs.json").read_text())
    again = json.loads(envs_out.read_text())
    assert set(again) == set(original)
    for env_id, meta in original.items():
        assert again[env_id]["env_class_code"] == meta["env_class_code"]
    assert all(isinstance(s["init_config"], dict) for s in json.loads(scenarios_out.read_text()))


def test_bad_settings_and_missing_catalogs_are_plain_errors() -> None:
    missing = run("serve", "--catalog", "/nonexistent/catalog")
    assert missing.returncode == 1 and "catalog folder not found" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = subprocess.run([sys.executable, "-m", "service.cli", "serve"], capture_output=True, text=True, cwd=ROOT,
                         timeout=60, env={**os.environ, "ENVFOUNDRY_SANDBOX": "bogus"})
    assert bad.returncode == 2 and "setting sandbox" in bad.stderr and "Traceback" not in bad.stderr


def test_validate_shows_what_synthesis_recorded(tmp_path: Path) -> None:
    """A synthesised package's assessment and its scenarios' repair history are printed with the report."""
    from service.cli import provenance_lines

    package = tmp_path / "cat" / "lib"
    shutil.copytree(BUNDLED / "library_circulation", package)
    manifest = json.loads((package / "env.json").read_text())
    manifest["provenance"] = {"assessment": {"rounds": 30, "counts": {"pass": 27, "warning": 3},
                                             "first_counts": {"pass": 25, "fail": 2}, "repaired": ["renew_loan"],
                                             "removed": [], "ratio": 1.0}}
    (package / "env.json").write_text(json.dumps(manifest))
    lines = (package / "scenarios.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["provenance"] = {"drafts": 2, "validations": 3, "history": [
        {"draft": 1, "passed": False, "diagnosis": {"diagnosis": "task", "reason": "r"}},
        {"draft": 2, "passed": False, "diagnosis": {"diagnosis": "check", "reason": "r"}}, {"draft": 2, "passed": True}]}
    (package / "scenarios.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    printed = provenance_lines([tmp_path / "cat"])
    assert printed == [
        "PROVENANCE library_circulation: 30 rounds, verdicts {'pass': 27, 'warning': 3} (before repair "
        "{'pass': 25, 'fail': 2}), repaired ['renew_loan'], removed []",
        f"PROVENANCE {first['scenario_id']}: 3 validations over 2 drafts, diagnoses ['task', 'check']",
    ]
    result = run("catalog", "validate", str(tmp_path / "cat"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert printed[0] in result.stdout and printed[1] in result.stdout
    assert provenance_lines([BUNDLED]) == []
