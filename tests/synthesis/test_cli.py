"""The ``synth`` command: its parser, its exit codes, and running it as a module."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from synthesis import cli
from tests.conftest import ROOT
from tests.synthesis.conftest import write_config
from tests.synthesis.scripted_llm import Running


def parse(*argv: str) -> argparse.Namespace:
    root = argparse.ArgumentParser(prog="envfoundry")
    cli.add_parser(root.add_subparsers(dest="command", required=True))
    return root.parse_args(list(argv))


def test_add_parser_registers_every_stage_with_its_options() -> None:
    for stage in ("themes", "skeletons", "assess", "scenarios", "all"):
        args = parse("synth", stage, "--config", "c.toml", "--out", "out", "--max-envs", "3",
                     "--scenarios-per-env", "4", "--concurrency", "5")  # fmt: skip
        assert args.run is cli.cmd_synth
        assert (args.config, args.out, args.max_envs, args.scenarios_per_env, args.concurrency) == (
            Path("c.toml"), Path("out"), 3, 4, 5)  # fmt: skip
    assert parse("synth", "all", "--config", "c", "--out", "o").stages == ("themes", "skeletons", "assess", "scenarios")
    assert parse("synth", "assess", "--config", "c", "--out", "o").stages == ("assess",)


def test_the_command_lists_the_pipeline_stages_in_order() -> None:
    from synthesis.pipeline import STAGES

    assert cli.STAGES == STAGES


def test_config_and_out_are_required() -> None:
    with pytest.raises(SystemExit):
        parse("synth", "all", "--out", "o")


def test_a_missing_config_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["synth", "all", "--config", str(tmp_path / "none.toml"), "--out", str(tmp_path)]) == 2
    assert "error:" in capsys.readouterr().err


def test_a_stage_without_its_input_exits_2(tmp_path: Path, llm: Running, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, llm.url)
    assert cli.main(["synth", "skeletons", "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    assert "run `synth themes` first" in capsys.readouterr().err


def test_a_key_variable_that_is_not_set_exits_2(tmp_path: Path, llm: Running, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delenv("SYNTH_TEST_KEY", raising=False)
    config = write_config(tmp_path, llm.url, llm={"api_key_env": "SYNTH_TEST_KEY"})
    assert cli.main(["synth", "themes", "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    assert "SYNTH_TEST_KEY" in capsys.readouterr().err and llm.script.count() == 0


def test_the_key_from_the_environment_reaches_the_endpoint(tmp_path: Path, llm: Running,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("SYNTH_TEST_KEY", "sk-from-env")
    corpus = tmp_path / "tasks.jsonl"
    corpus.write_text('{"task_id": "t03", "task": "Write a poem about autumn leaves."}\n')
    config = write_config(tmp_path, llm.url, corpus=corpus, llm={"api_key_env": "SYNTH_TEST_KEY"})
    assert cli.main(["synth", "themes", "--config", str(config), "--out", str(tmp_path / "out")]) == 0
    assert set(llm.script.authorizations) == {"Bearer sk-from-env"}


def test_runs_as_a_module() -> None:
    result = subprocess.run([sys.executable, "-m", "synthesis.cli", "synth", "all", "--help"], capture_output=True,
                            text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert result.returncode == 0 and "--scenarios-per-env" in result.stdout
