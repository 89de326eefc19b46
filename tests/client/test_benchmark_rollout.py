"""``envfoundry rollout`` on imported benchmark catalogs prints each benchmark's own metric: tau-bench's
pass^k and BFCL's accuracy. The catalogs are imported from the fixtures in each benchmark's layout; the
agent is the scripted chat endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from envfoundry_client.report import benchmark_lines, pass_hat_k

from tests.client.agent_scripts import Turn, call
from tests.client.test_rollout import envfoundry
from tests.conftest import ROOT, Server, start_server
from tests.scripted_openai import Running

FIXTURES = ROOT / "tests" / "fixtures"

TAU_TEST_0: list[list[Turn]] = [
    [{"tool_calls": [call("find_user", email="ada@example.com")]},
     {"tool_calls": [call("cancel_order", order_id="#W1", reason="no longer needed")]},
     {"content": "Order #W1 is cancelled."}],
    [{"tool_calls": [call("cancel_order", order_id="#W1", reason="ordered by mistake")]},  # the wrong reason
     {"content": "Order #W1 is cancelled."}],
]
TAU_TEST_1: list[list[Turn]] = [
    [{"tool_calls": [call("get_order", order_id="#W2")]},
     {"tool_calls": [call("respond", content="Your order cost 40.0.")]},
     {"content": "Anything else?"}],
]
BFCL_BASE_0: list[list[Turn]] = [
    [{"tool_calls": [call("add_note", title="todo", text="buy milk"), call("increment", times=3),
                     call("get_count")]},
     {"content": "Noted, and the counter is at 11."}],
    [{"tool_calls": [call("add_note", title="todo", text="buy milk")]},  # forgets the counter
     {"content": "Noted."}],
]


@pytest.fixture(scope="module")
def bench_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    out = tmp_path_factory.mktemp("bench-catalogs")
    for args in (("import-taubench", str(FIXTURES / "taubench")),
                 ("import-bfcl", "--source", str(FIXTURES / "bfcl" / "bfcl_eval"))):
        done = envfoundry("catalog", *args, "--out", str(out))
        assert done.returncode == 0, done.stderr
    server = start_server(tmp_path_factory.mktemp("bench-server"), catalogs=(out,))
    yield server
    server.stop()


def task(server: Server, scenario_id: str) -> str:
    return str(httpx.get(f"{server.url}/v1/scenarios/{scenario_id}").json()["task"])


def rollout(server: Server, chat: Running, out: Path, *extra: str) -> list[str]:
    done = envfoundry("rollout", "--server", server.url, "--llm-base-url", chat.url, "--model", "scripted-agent",
                      "--llm-api-key", "agent-key", "--out", str(out), "--samples", "2", "--concurrency", "1", *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("selection", [("--split", "test", "--tag", "taubench", "--tag", "shop"),
                                       ("--prefix", "taubench-shop-test-")])
def test_a_tau_bench_split_prints_pass_hat_k(bench_server: Server, chat: Running, tmp_path: Path,
                                             selection: tuple[str, ...]) -> None:
    chat.script.reset({task(bench_server, "taubench-shop-test-0"): TAU_TEST_0,
                       task(bench_server, "taubench-shop-test-1"): TAU_TEST_1})
    lines = rollout(bench_server, chat, tmp_path / "tau.jsonl", *selection)
    # test-0 succeeds in one sample of two, test-1 in both: pass^1 (0.5 + 1) / 2, pass^2 (0 + 1) / 2.
    assert "tau-bench: pass^1 0.750  pass^2 0.500 (2 tasks, 4 episodes)" in lines
    assert lines[-1] == f"wrote 4 trajectories to {tmp_path / 'tau.jsonl'}"  # the train split was not run


# miss_param entry 0: the first turn leaves the title out (BFCL expects no call, only a question); the
# second gives it. The first sample asks, then adds; the second guesses a title at once and fails turn 1.
BFCL_MISS_PARAM_0: list[list[Turn]] = [
    [{"content": "What should the note be titled?"},
     {"tool_calls": [call("add_note", title="todo", text="buy milk")]},
     {"content": "Added."}],
    [{"tool_calls": [call("add_note", title="note", text="buy milk")]},
     {"content": "Added."},
     {"content": "It is titled 'note'."}],
]


def test_bfcl_prints_accuracy_per_category(bench_server: Server, chat: Running, tmp_path: Path) -> None:
    """A turn-based miss_param entry and the all-at-once form of a base entry: each category's accuracy,
    and the overall figure over BFCL's own categories only."""
    all_at_once = "bfcl-multi-turn-base-0-all-at-once"
    miss_param = "bfcl-multi-turn-miss-param-0"
    chat.script.reset({task(bench_server, all_at_once): BFCL_BASE_0,
                       task(bench_server, miss_param): BFCL_MISS_PARAM_0})
    lines = rollout(bench_server, chat, tmp_path / "bfcl.jsonl", "--scenario", all_at_once,
                    "--scenario", miss_param)
    bfcl = [line for line in lines if line.startswith("BFCL")]
    assert bfcl == ["BFCL multi-turn miss_param: accuracy 0.500 (1/2 episodes)",
                    "BFCL multi-turn base_all_at_once: accuracy 0.500 (1/2 episodes)",
                    "BFCL multi-turn overall: accuracy 0.500 (mean of 1 category)"]
    assert not any(line.startswith("tau-bench") for line in lines)


def test_bfcl_overall_accuracy_is_the_unweighted_mean_of_its_categories() -> None:
    """An entry counts only with reward 1.0 (every turn passed); a category with more episodes weighs
    no more in the overall figure; ids that are not BFCL entries are shown apart."""
    def record(scenario_id: str, reward: float) -> dict[str, object]:
        return {"env_id": "bfcl_notes_api", "scenario_id": scenario_id, "reward": reward}

    records = [record("bfcl-multi-turn-base-0", 1.0), record("bfcl-multi-turn-base-1", 1.0),
               record("bfcl-multi-turn-base-2", 1.0), record("bfcl-multi-turn-base-3", 0.0),
               record("bfcl-multi-turn-long-context-0", 0.0),
               record("bfcl-multi-turn-miss-func-0", 1.0), record("bfcl-multi-turn-miss-func-1", 0.5),
               record("bfcl-multi-turn-miss-param-0", 1.0),
               record("bfcl-multi-turn-long-context-0-all-at-once", 1.0), record("bfcl-custom", 1.0)]

    assert benchmark_lines(records) == [
        "BFCL multi-turn base: accuracy 0.750 (3/4 episodes)",
        "BFCL multi-turn long_context: accuracy 0.000 (0/1 episodes)",
        "BFCL multi-turn miss_func: accuracy 0.500 (1/2 episodes)",
        "BFCL multi-turn miss_param: accuracy 1.000 (1/1 episodes)",
        "BFCL multi-turn long_context_all_at_once: accuracy 1.000 (1/1 episodes)",
        "BFCL multi-turn other: accuracy 1.000 (1/1 episodes)",
        "BFCL multi-turn overall: accuracy 0.562 (mean of 4 categories)",
    ]


def test_a_selection_that_matches_nothing_or_mixes_names_and_filters_runs_nothing(
        bench_server: Server, chat: Running, tmp_path: Path) -> None:
    for extra, said in ((("--split", "nosuch"), "no scenario matches the selection"),
                        (("--scenario", "bfcl-multi-turn-base-0", "--split", "test"), "not both")):
        done = envfoundry("rollout", "--server", bench_server.url, "--llm-base-url", chat.url, "--model", "m",
                          "--out", str(tmp_path / "none.jsonl"), *extra)
        assert done.returncode == 1 and said in done.stderr
        assert not (tmp_path / "none.jsonl").exists()


def test_pass_hat_k_is_tau_benchs_estimator() -> None:
    records = [{"env_id": "taubench_retail", "scenario_id": s, "reward": r}
               for s, r in [("a", 1.0), ("a", 1.0), ("a", 0.0), ("b", 1.0), ("b", 0.0), ("b", 0.0)]]
    # a: 2 of 3 succeed, b: 1 of 3. pass^1 = (2/3 + 1/3) / 2, pass^2 = (1/3 + 0) / 2, pass^3 = 0.
    assert pass_hat_k(records) == pytest.approx([0.5, 1 / 6, 0.0])
    assert benchmark_lines(records) == ["tau-bench: pass^1 0.500  pass^2 0.167  pass^3 0.000 (2 tasks, 6 episodes)"]
    assert benchmark_lines([{"env_id": "library_circulation", "scenario_id": "x", "reward": 1.0}]) == []
