"""Loading the run configuration (TOML or JSON) and resolving the API key from the environment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from synthesis.errors import ConfigError
from synthesis.run.config import api_key, load_config
from tests.synthesis.conftest import config_data, write_config


def test_toml_config_loads_and_resolves_the_corpus_next_to_it(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "http://llm.test/v1", corpus="tasks.jsonl"))
    assert config.corpus == (tmp_path / "tasks.jsonl").resolve()
    assert config.models.tester == "gen-small" and config.prices.generator.completion == 0.008
    assert config.thresholds.rounds == 6 and config.run.scenarios_per_env == 2


def test_json_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "synth.json"
    path.write_text(json.dumps(config_data("http://llm.test/v1")))
    assert load_config(path).llm.base_url == "http://llm.test/v1"


def test_unknown_keys_are_errors_with_the_field_named(tmp_path: Path) -> None:
    data = config_data("http://llm.test/v1")
    data["thresholds"]["pass_rate"] = 0.9  # a typo of pass_ratio must not be silently ignored
    path = tmp_path / "synth.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.field == "thresholds.pass_rate"


def test_out_of_range_values_are_refused(tmp_path: Path) -> None:
    data = config_data("http://llm.test/v1", thresholds={"pass_ratio": 1.5})
    path = tmp_path / "synth.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="thresholds.pass_ratio"):
        load_config(path)


def test_malformed_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "synth.toml"
    path.write_text("[llm\nbase_url = 1")
    with pytest.raises(ConfigError, match="cannot read the config"):
        load_config(path)


def test_cli_overrides_replace_run_options_only_when_given(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "http://llm.test/v1"))
    changed = config.with_run(max_envs=3, scenarios_per_env=None, concurrency=1)
    assert (changed.run.max_envs, changed.run.scenarios_per_env, changed.run.concurrency) == (3, 2, 1)


def test_the_key_comes_from_the_named_variable_never_the_file(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "http://llm.test/v1", llm={"api_key_env": "MY_LLM_KEY"}))
    assert api_key(config, {"MY_LLM_KEY": "sk-test"}) == "sk-test"
    with pytest.raises(ConfigError, match="MY_LLM_KEY"):
        api_key(config, {})
    keyless = load_config(write_config(tmp_path, "http://llm.test/v1", llm={"api_key_env": ""}))
    assert api_key(keyless, {}) is None


@pytest.mark.parametrize(("section", "key", "value"), [("thresholds", "rounds", "16"), ("llm", "timeout", "120"),
                                                        ("run", "scenarios_per_env", 2.0), ("repair", "remove_unrepaired", "no")])  # fmt: skip
def test_a_value_of_the_wrong_type_is_an_error_naming_the_key(tmp_path: Path, section: str, key: str, value: object) -> None:
    sections: dict[str, dict[str, Any]] = {section: {key: value}}
    path = write_config(tmp_path, "http://llm.test/v1", corpus="tasks.jsonl", **sections)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.field == f"{section}.{key}" and json.dumps(value) in caught.value.message


def test_each_role_has_its_own_temperature_and_the_checker_judges_at_zero(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "http://llm.test/v1", llm={"temperature": 0.9},
                                      temperatures={"tester": 0.4}))  # fmt: skip
    assert [config.temperature_for(r) for r in ("generator", "tester", "checker")] == [0.9, 0.4, 0.0]
