"""The ``synth`` command: its parser, its exit codes, and running it as a module."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from synthesis import cli
from tests.conftest import ROOT, interruptible
from tests.scripted_openai import Running
from tests.synthesis.conftest import write_config


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
    from synthesis.run.pipeline import STAGES

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
    corpus.write_text('{"task_id": "t01", "task": "Cancel Miso\'s grooming appointment and book a dental cleaning."}\n')
    config = write_config(tmp_path, llm.url, corpus=corpus, llm={"api_key_env": "SYNTH_TEST_KEY"})
    assert cli.main(["synth", "themes", "--config", str(config), "--out", str(tmp_path / "out")]) == 0
    assert set(llm.script.authorizations) == {"Bearer sk-from-env"}


def test_runs_as_a_module() -> None:
    result = subprocess.run([sys.executable, "-m", "synthesis.cli", "synth", "all", "--help"], capture_output=True,
                            text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert result.returncode == 0 and "--scenarios-per-env" in result.stdout


def synth(tmp_path: Path, stage: str, config: Path, *extra: str) -> int:
    return cli.main(["synth", stage, "--config", str(config), "--out", str(tmp_path / "out"), *extra])


def corpus_of(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(("stage", "done", "first"), [
    ("skeletons", (), "themes"), ("assess", (), "themes"), ("scenarios", (), "themes"),
    ("assess", ("environments.json",), "skeletons"), ("scenarios", ("environments.json", "skeletons.jsonl"), "assess"),
])  # fmt: skip
def test_a_stage_without_its_input_exits_2_naming_the_first_stage_to_run(
    tmp_path: Path, llm: Running, capsys: pytest.CaptureFixture[str], stage: str, done: tuple[str, ...], first: str
) -> None:
    work = tmp_path / "out" / "_work"
    work.mkdir(parents=True)
    for name in done:
        (work / name).write_text('{"fingerprint": "", "environments": [], "dropped": []}' if name.endswith(".json") else "")
    assert synth(tmp_path, stage, write_config(tmp_path, llm.url)) == 2
    assert f"run `synth {first}` first" in capsys.readouterr().err and llm.script.count() == 0


def test_a_run_where_every_item_failed_exits_3(tmp_path: Path, llm: Running, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = corpus_of(tmp_path, '{"task_id": "t-down", "task": "Cancel my order 12 and refund it."}')
    assert synth(tmp_path, "all", write_config(tmp_path, llm.url, corpus=corpus)) == 3
    captured = capsys.readouterr()
    assert "themes: none of 1 items was kept; the run stopped there" in captured.err
    assert "themes: FAILED t-down" in captured.out and "skeletons" not in captured.out  # later stages did not run


def test_a_run_where_every_item_was_dropped_exits_3(tmp_path: Path, llm: Running) -> None:
    corpus = corpus_of(tmp_path, '{"task_id": "t02", "task": "What is the capital of Australia?"}')
    assert synth(tmp_path, "themes", write_config(tmp_path, llm.url, corpus=corpus)) == 3


def test_an_empty_corpus_exits_2(tmp_path: Path, llm: Running, capsys: pytest.CaptureFixture[str]) -> None:
    assert synth(tmp_path, "themes", write_config(tmp_path, llm.url, corpus=corpus_of(tmp_path))) == 2
    assert "the corpus holds no task" in capsys.readouterr().err


def test_usage_accumulates_across_resumed_runs(tmp_path: Path, llm: Running, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    first = '{"task_id": "t01", "task": "Cancel Miso\'s grooming appointment and book a dental cleaning."}'
    config = write_config(tmp_path, llm.url, corpus=corpus_of(tmp_path, first))
    assert synth(tmp_path, "themes", config) == 0
    summary_path = tmp_path / "out" / "_work" / "summary.json"
    once = json.loads(summary_path.read_text())
    corpus_of(tmp_path, first, '{"task_id": "t10", "task": "Renew the parking permit of plate KX19 TRV."}')
    assert synth(tmp_path, "themes", config) == 0  # resumes t01, judges t10
    twice = json.loads(summary_path.read_text())
    assert len(twice["runs"]) == 2 and twice["runs"][0] == once["runs"][0]
    total, first_run, second_run = (twice["cumulative"]["total"], twice["runs"][0]["total"], twice["runs"][1]["total"])
    assert second_run["requests"] > 0 and twice["total"] == second_run  # the latest run, alone
    for key in ("requests", "prompt_tokens", "completion_tokens"):
        assert total[key] == first_run[key] + second_run[key]
    assert f"all 2 runs into this folder: {total['requests']} requests" in capsys.readouterr().out


def test_a_refused_key_costs_one_request_then_exits_3_naming_the_cause(
    tmp_path: Path, llm: Running, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    llm.script.required_key = "sk-right"
    monkeypatch.setenv("SYNTH_TEST_KEY", "sk-revoked")
    config = write_config(tmp_path, llm.url, llm={"api_key_env": "SYNTH_TEST_KEY", "max_attempts": 5})
    assert synth(tmp_path, "all", config) == 3  # the fixture corpus: 10 tasks, 4 at a time
    assert llm.script.received == 1
    err = capsys.readouterr().err
    assert "error: the endpoint cannot serve this run: chat/completions (gen-large): the endpoint refused the request " \
           "with HTTP 401" in err and "Incorrect API key provided" in err  # fmt: skip
    summary = json.loads((tmp_path / "out" / "_work" / "summary.json").read_text())
    assert (summary["ending"], summary["total"]["requests"]) == ("endpoint_unusable", 1)
    assert not (tmp_path / "out" / "_work" / "themes.jsonl").exists()  # no item recorded as failed: all are retried


def start_synth(tmp_path: Path, config: Path, stage: str = "themes") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "synthesis.cli", "synth", stage, "--config", str(config), "--out",
                             str(tmp_path / "out")], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=interruptible)  # fmt: skip


def wait_for_requests(llm: Running, process: subprocess.Popen[str], count: int) -> None:
    import time

    deadline = time.monotonic() + 30
    while llm.script.received < count:
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.01)
    time.sleep(llm.script.delay / 2)  # between a burst of requests and their answers: none half-sent


def test_a_run_killed_and_resumed_adds_up_to_the_requests_the_server_received(tmp_path: Path, llm: Running) -> None:
    import json
    import signal

    llm.script.delay = 0.3
    config = write_config(tmp_path, llm.url)
    process = start_synth(tmp_path, config)
    wait_for_requests(llm, process, 3)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    killed_requests = llm.script.received
    assert not (tmp_path / "out" / "_work" / "summary.json").exists()  # it had no chance to write one
    llm.script.delay = 0.0
    assert synth(tmp_path, "themes", config) == 0
    summary = json.loads((tmp_path / "out" / "_work" / "summary.json").read_text())
    killed, resumed = summary["runs"]
    assert (killed["ending"], killed["total"]["requests"]) == ("killed", killed_requests)
    assert killed["total"]["cost"] > 0 and resumed["ending"] == "finished"
    assert summary["cumulative"]["total"]["requests"] == llm.script.received > killed_requests


def test_ctrl_c_exits_130_saying_what_was_spent_and_how_to_resume(tmp_path: Path, llm: Running) -> None:
    import json
    import signal

    llm.script.delay = 0.3
    process = start_synth(tmp_path, write_config(tmp_path, llm.url))
    wait_for_requests(llm, process, 3)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    summary = json.loads((tmp_path / "out" / "_work" / "summary.json").read_text())
    assert (summary["ending"], summary["total"]["requests"]) == ("interrupted", llm.script.received)
    tokens = summary["total"]["prompt_tokens"] + summary["total"]["completion_tokens"]
    assert f"interrupted: this run sent {llm.script.received} requests ({tokens} tokens, $" in err
    assert "run the same command again to resume" in err and "Traceback" not in err


def test_an_unreachable_endpoint_exits_3_after_one_requests_retries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tests.conftest import free_port

    config = write_config(tmp_path, f"http://127.0.0.1:{free_port()}/v1")
    assert synth(tmp_path, "all", config) == 3
    assert "error: the endpoint cannot serve this run: chat/completions (gen-large): gave up after 3 attempts; " \
           "last error: connection failed: ConnectError" in capsys.readouterr().err  # fmt: skip
    summary = json.loads((tmp_path / "out" / "_work" / "summary.json").read_text())
    assert summary["total"]["requests"] == 3  # not 3 per task of the corpus
