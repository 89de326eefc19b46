"""Import and export of EnvScaler's released JSON files (service.catalog.importers.envscaler)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.catalog.collection import Catalog
from service.catalog.folders import bundled_catalog_dir
from service.catalog.importers.envscaler import ImportReport, export_envscaler, import_envscaler
from service.catalog.model import CatalogError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "envscaler"
ENVS = FIXTURES / "envs.json"
SCENARIOS = FIXTURES / "scenarios.json"
CLINIC = "env_101_clinic_appointments"


def _load(folder: Path) -> Catalog:
    catalog = Catalog()
    catalog.load_dir(folder)
    return catalog


def _env_view(catalog: Catalog) -> dict[str, Any]:
    return {
        env_id: {
            "class_name": env.class_name,
            "code": env.code,
            "summary": env.summary,
            "introduction": env.introduction,
            "rules": env.rules,
            "tools": env.tools,
        }
        for env_id, env in catalog.environments.items()
    }


def _scenario_view(catalog: Catalog) -> dict[str, Any]:
    return {scenario_id: scenario.to_json() for scenario_id, scenario in catalog.scenarios.items()}


@pytest.fixture
def write_json(tmp_path: Path) -> Callable[[str, Any], Path]:
    """Factory: write a JSON document to a file under tmp_path."""

    def write(name: str, document: Any) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps(document), encoding="utf-8")
        return path

    return write


@pytest.fixture
def released() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Fresh copies of the fixture files' contents, for variations."""
    envs = json.loads(ENVS.read_text(encoding="utf-8"))
    scenarios = json.loads(SCENARIOS.read_text(encoding="utf-8"))
    return envs, scenarios


def test_import_writes_packages_the_catalog_loads(tmp_path: Path) -> None:
    report = import_envscaler(ENVS, SCENARIOS, tmp_path / "out")

    assert (report.environments, report.scenarios) == (1, 2)
    catalog = _load(tmp_path / "out")
    env = catalog.environments[CLINIC]
    record = json.loads(ENVS.read_text(encoding="utf-8"))[CLINIC]
    assert env.class_name == "ClinicAppointmentSystem"
    assert env.code == record["env_class_code"]
    assert env.introduction == record["environment_introduction"]
    assert env.summary == record["environment_summary"]
    assert env.rules == record["constraints_rules"]
    assert sorted(catalog.scenarios) == ["1", "2"]
    first = catalog.scenarios["1"]
    assert first.env_id == CLINIC
    assert first.task.startswith("Book Maya Lin")
    assert [c.item for c in first.checklist] == [
        "Maya has a booked appointment at 2024-06-01T10:00.",
        "The 10:00 slot is no longer free.",
    ]
    assert first.checklist[0].check.startswith("def check_func(final_state):")
    assert first.reference_solution is None


def test_init_config_given_as_json_string_is_decoded(tmp_path: Path) -> None:
    import_envscaler(ENVS, SCENARIOS, tmp_path / "out")

    catalog = _load(tmp_path / "out")
    decoded = catalog.scenarios["2"].init_config
    assert isinstance(decoded, dict)
    assert decoded == catalog.scenarios["1"].init_config
    assert decoded["free_slots"] == ["2024-06-01T10:00", "2024-06-01T11:00"]


def test_scenario_for_an_unknown_environment_is_skipped_and_reported(tmp_path: Path) -> None:
    report = import_envscaler(ENVS, SCENARIOS, tmp_path / "out")

    assert len(report.skipped) == 1
    assert "task_id 3" in report.skipped[0]
    assert "env_999_unknown" in report.skipped[0]
    assert not (tmp_path / "out" / "env_999_unknown").exists()


def test_tools_are_extracted_from_code_and_released_descriptions_only_fill_gaps(tmp_path: Path) -> None:
    """The released cancel_appointment schema has a mangled parameter name; the code's wins."""
    import_envscaler(ENVS, SCENARIOS, tmp_path / "out")

    env = _load(tmp_path / "out").environments[CLINIC]
    assert env.tool_names == {"get_patient", "book_appointment", "cancel_appointment"}
    cancel = env.tool("cancel_appointment")
    assert cancel is not None
    assert list(cancel["function"]["parameters"]["properties"]) == ["appointment_id"]
    assert cancel["function"]["description"] == "Cancel a booked appointment and free its slot."
    book = env.tool("book_appointment")  # no docstring in the code
    assert book is not None
    assert book["function"]["description"] == "Book a free slot for an existing patient."


def test_summary_falls_back_to_the_introductions_first_sentence(
    tmp_path: Path, write_json: Callable[[str, Any], Path], released: tuple[dict[str, Any], list[Any]]
) -> None:
    envs, _ = released
    del envs[CLINIC]["environment_summary"]
    import_envscaler(write_json("envs.json", envs), None, tmp_path / "out")

    env = _load(tmp_path / "out").environments[CLINIC]
    assert env.summary == "This environment is a small clinic's appointment book."


def test_round_trip_import_export_import_keeps_environments_and_scenarios(tmp_path: Path) -> None:
    import_envscaler(ENVS, SCENARIOS, tmp_path / "first")
    first = _load(tmp_path / "first")

    export_envscaler(first, tmp_path / "export" / "envs.json", tmp_path / "export" / "scenarios.json")
    report = import_envscaler(tmp_path / "export" / "envs.json", tmp_path / "export" / "scenarios.json", tmp_path / "second")
    second = _load(tmp_path / "second")

    assert report == ImportReport(environments=1, scenarios=2, skipped=[])
    assert _env_view(second) == _env_view(first)
    assert _scenario_view(second) == _scenario_view(first)
    assert second.environments[CLINIC].tool_overrides == first.environments[CLINIC].tool_overrides


def test_export_writes_envscalers_shapes(tmp_path: Path) -> None:
    import_envscaler(ENVS, SCENARIOS, tmp_path / "out")
    catalog = _load(tmp_path / "out")

    export_envscaler(catalog, tmp_path / "envs.json", tmp_path / "scenarios.json")

    envs = json.loads((tmp_path / "envs.json").read_text(encoding="utf-8"))
    assert list(envs) == [CLINIC]
    assert set(envs[CLINIC]) >= {
        "env_class_name", "env_class_code", "environment_introduction",
        "environment_summary", "constraints_rules", "tools",
    }  # fmt: skip
    assert envs[CLINIC]["tools"] == catalog.environments[CLINIC].tools
    scenarios = json.loads((tmp_path / "scenarios.json").read_text(encoding="utf-8"))
    assert isinstance(scenarios, list) and len(scenarios) == 2
    second = next(s for s in scenarios if s["task_id"] == "2")
    assert second["env_id"] == CLINIC
    assert second["env_class_name"] == "ClinicAppointmentSystem"
    assert isinstance(second["init_config"], dict)
    assert second["checklist"] == ["Appointment A1 is cancelled.", "The 09:00 slot is free again."]
    assert second["checklist_with_func"][0]["check_item"] == "Appointment A1 is cancelled."
    assert second["checklist_with_func"][0]["check_func"].startswith("def check_func(final_state):")
    assert "reference_solution" not in second


def test_bundled_catalog_round_trips_with_reference_solutions(tmp_path: Path) -> None:
    bundled = _load(bundled_catalog_dir())
    export_envscaler(bundled, tmp_path / "envs.json", tmp_path / "scenarios.json")

    report = import_envscaler(tmp_path / "envs.json", tmp_path / "scenarios.json", tmp_path / "out")
    again = _load(tmp_path / "out")

    assert report.skipped == []
    assert (report.environments, report.scenarios) == (len(bundled.environments), len(bundled.scenarios))
    assert _env_view(again) == _env_view(bundled)
    assert _scenario_view(again) == _scenario_view(bundled)


def test_environment_whose_code_does_not_parse_is_skipped_with_its_scenarios(
    tmp_path: Path, write_json: Callable[[str, Any], Path], released: tuple[dict[str, Any], list[Any]]
) -> None:
    envs, scenarios = released
    envs["env_102_broken"] = {**envs[CLINIC], "env_class_code": "class ClinicAppointmentSystem(:\n    pass\n"}
    scenarios.append({**scenarios[0], "task_id": 4, "env_id": "env_102_broken"})
    report = import_envscaler(write_json("envs.json", envs), write_json("scenarios.json", scenarios), tmp_path / "out")

    assert (report.environments, report.scenarios) == (1, 2)
    assert any("env_102_broken" in reason and "syntax error" in reason for reason in report.skipped)
    assert any("task_id 4" in reason and "was skipped" in reason for reason in report.skipped)
    assert sorted(_load(tmp_path / "out").environments) == [CLINIC]


def test_environment_id_that_is_not_a_safe_folder_name_is_skipped(
    tmp_path: Path, write_json: Callable[[str, Any], Path], released: tuple[dict[str, Any], list[Any]]
) -> None:
    envs, _ = released
    envs["../escape"] = envs[CLINIC]
    report = import_envscaler(write_json("envs.json", envs), None, tmp_path / "out")

    assert report.environments == 1
    assert any("'../escape'" in reason for reason in report.skipped)
    assert not (tmp_path / "escape").exists()


def test_task_ids_repeated_across_environments_are_prefixed_with_the_env_id(
    tmp_path: Path, write_json: Callable[[str, Any], Path], released: tuple[dict[str, Any], list[Any]]
) -> None:
    envs, scenarios = released
    envs["env_102_clinic_copy"] = envs[CLINIC]
    scenarios[1].update(task_id=1, env_id="env_102_clinic_copy")
    report = import_envscaler(write_json("envs.json", envs), write_json("scenarios.json", scenarios), tmp_path / "out")

    assert report.scenarios == 2
    assert sorted(_load(tmp_path / "out").scenarios) == [f"{CLINIC}-1", "env_102_clinic_copy-1"]


def test_conflicting_duplicate_scenario_is_skipped(
    tmp_path: Path, write_json: Callable[[str, Any], Path], released: tuple[dict[str, Any], list[Any]]
) -> None:
    envs, scenarios = released
    scenarios[1]["task_id"] = 1  # same env, same task_id, different content
    report = import_envscaler(write_json("envs.json", envs), write_json("scenarios.json", scenarios), tmp_path / "out")

    assert report.scenarios == 1
    assert any("scenarios[1]" in reason and "already exists" in reason for reason in report.skipped)


def test_missing_checklist_with_func_gives_an_empty_checklist(
    tmp_path: Path, write_json: Callable[[str, Any], Path], released: tuple[dict[str, Any], list[Any]]
) -> None:
    envs, scenarios = released
    del scenarios[0]["checklist_with_func"]
    report = import_envscaler(write_json("envs.json", envs), write_json("scenarios.json", scenarios[:1]), tmp_path / "out")

    assert report.scenarios == 1
    assert _load(tmp_path / "out").scenarios["1"].checklist == []


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"init_config": "{not json"}, "init_config"),
        ({"init_config": "[1, 2]"}, "init_config must be an object"),
        ({"task": ""}, "task is missing"),
        ({"checklist_with_func": [{"check_item": "x", "check_func": "def check_func(final_state):\n    return (\n"}]}, "syntax error"),
    ],
)
def test_bad_scenario_is_skipped_and_the_rest_imported(
    tmp_path: Path,
    write_json: Callable[[str, Any], Path],
    released: tuple[dict[str, Any], list[Any]],
    change: dict[str, Any],
    reason: str,
) -> None:
    envs, scenarios = released
    scenarios[0].update(change)
    report = import_envscaler(write_json("envs.json", envs), write_json("scenarios.json", scenarios), tmp_path / "out")

    assert report.scenarios == 1
    assert any("task_id 1" in r and reason in r for r in report.skipped), report.skipped
    assert sorted(_load(tmp_path / "out").scenarios) == ["2"]


def test_scenarios_as_json_lines_are_accepted(tmp_path: Path, released: tuple[dict[str, Any], list[Any]]) -> None:
    _, scenarios = released
    path = tmp_path / "scenarios.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in scenarios[:2]), encoding="utf-8")
    report = import_envscaler(ENVS, path, tmp_path / "out")

    assert (report.scenarios, report.skipped) == (2, [])


def test_scenarios_keyed_by_an_object_are_accepted(
    tmp_path: Path, write_json: Callable[[str, Any], Path], released: tuple[dict[str, Any], list[Any]]
) -> None:
    _, scenarios = released
    keyed = {str(s["task_id"]): s for s in scenarios[:2]}
    report = import_envscaler(ENVS, write_json("scenarios.json", keyed), tmp_path / "out")

    assert (report.scenarios, report.skipped) == (2, [])


@pytest.mark.parametrize(
    ("envs_text", "scenarios_text", "message"),
    [
        ("{not json", None, "environment file"),
        ("[1, 2", None, "not valid JSON"),
        ("42", None, "keyed by env_id"),
        (None, "[{\"task_id\": 1,", "scenario file"),
        (None, "\"just a string\"", "JSON list"),
    ],
)
def test_malformed_files_raise_catalog_error(
    tmp_path: Path, envs_text: str | None, scenarios_text: str | None, message: str
) -> None:
    envs_path, scenarios_path = ENVS, SCENARIOS
    if envs_text is not None:
        envs_path = tmp_path / "envs.json"
        envs_path.write_text(envs_text, encoding="utf-8")
    if scenarios_text is not None:
        scenarios_path = tmp_path / "scenarios.json"
        scenarios_path.write_text(scenarios_text, encoding="utf-8")

    with pytest.raises(CatalogError, match=message):
        import_envscaler(envs_path, scenarios_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_file_raises_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read"):
        import_envscaler(tmp_path / "absent.json", None, tmp_path / "out")


def test_round_trip_keeps_a_turn_based_scenarios_turns(tmp_path: Path) -> None:
    """Turns, their tools, checks and per-turn solutions survive export and import unchanged."""
    turns_catalog = _load(Path(__file__).resolve().parents[1] / "fixtures" / "turns")
    original = turns_catalog.scenarios["turns-001"]
    export_envscaler(turns_catalog, tmp_path / "envs.json", tmp_path / "scenarios.json")

    exported = json.loads((tmp_path / "scenarios.json").read_text(encoding="utf-8"))
    assert [t["message"] for t in exported[0]["turns"]] == [t.message for t in original.turns]
    report = import_envscaler(tmp_path / "envs.json", tmp_path / "scenarios.json", tmp_path / "out")
    again = _load(tmp_path / "out").scenarios["turns-001"]

    assert report.skipped == []
    assert again.turns == original.turns
    assert again.turns[1].tools == ("archive",)
    assert again.reference_solution == original.reference_solution
    assert again.version == original.version


def test_turns_that_are_not_a_list_skip_the_scenario(
    tmp_path: Path, write_json: Callable[[str, Any], Path], released: tuple[dict[str, Any], list[Any]]
) -> None:
    envs, scenarios = released
    scenarios[0]["turns"] = {"message": "not a list"}
    report = import_envscaler(write_json("envs.json", envs), write_json("scenarios.json", scenarios), tmp_path / "out")

    assert report.scenarios == 1
    assert any("task_id 1" in r and "turns must be a list" in r for r in report.skipped), report.skipped
