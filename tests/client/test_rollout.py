"""``envfoundry rollout`` and ``envfoundry export sft`` end to end: the real CLI, a real server, and a
scripted agent LLM; the output files are compared exactly with the ones under ``expected/``.

Set ``ENVFOUNDRY_UPDATE_EXPECTED=1`` to rewrite those files after a deliberate change (then read the diff).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.client.agent_scripts import LIB_001, STORE_001
from tests.conftest import ROOT, Server, free_port
from tests.scripted_openai import Running

EXPECTED = Path(__file__).parent / "expected"
# Tokens: the scripted LLM counts 10 per message sent plus 5 per answer. lib-001 track 0 sends 2, 4
# and 8 messages (155), track 1 sends 2 and 4 (70); store-001 track 0 sends 2, 4, 6 (135), track 1
# 2, 4, 6, 8 (220). Steps are tool calls: 4 and 1, 2 and 2.
TABLE = """\
environment          episodes  failed  mean reward  success        pass@k  mean steps  tokens
-------------------  --------  ------  -----------  -------  ------------  ----------  ------
library_circulation         2       0        0.667    50.0%  100.0% (k=2)         2.5     225
online_store_orders         2       0        1.000   100.0%  100.0% (k=2)         2.0     355
all                         4       0        0.833    75.0%  100.0% (k=2)         2.2     580"""


def envfoundry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def task(server: Server, scenario_id: str) -> str:
    return str(httpx.get(f"{server.url}/v1/scenarios/{scenario_id}").json()["task"])


def records(path: Path) -> list[dict[str, Any]]:
    """The records in a stable order, without the field that differs per run (the session id) and
    the versions, which change with the catalogs (checked here to be the digests they name)."""
    out = [json.loads(line) for line in path.read_text().splitlines()]
    for r in out:
        assert r.pop("session_id").startswith("ses_")
        for name in ("env_version", "scenario_version", "catalog_digest"):
            assert re.fullmatch("[0-9a-f]{64}", r.pop(name)), name
    return sorted(out, key=lambda r: (r["scenario_id"], r["sample"]))


def matches_expected(name: str, actual: list[dict[str, Any]]) -> None:
    path = EXPECTED / name
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in actual)
    if os.environ.get("ENVFOUNDRY_UPDATE_EXPECTED") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from the expected file"


def rollout(server: Server, chat: Running, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return envfoundry("rollout", "--server", server.url, "--llm-base-url", chat.url, "--model", "scripted-agent",
                      "--llm-api-key", "agent-key", "--out", str(out), *extra)


@pytest.fixture
def scripted(ef_server: Server, chat: Running) -> Running:
    chat.script.reset({task(ef_server, "lib-001"): LIB_001, task(ef_server, "store-001"): STORE_001})
    return chat


def test_task_rollout_writes_exact_trajectories_table_and_sft_data(ef_server: Server, scripted: Running,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "rollout.jsonl"
    done = rollout(ef_server, scripted, out, "--scenario", "lib-001", "--scenario", "store-001", "--samples", "2",
                   "--concurrency", "1", "--tool-format", "native")
    assert done.returncode == 0, done.stderr
    assert done.stdout == TABLE + f"\nwrote 4 trajectories to {out}\n"
    assert done.stderr.splitlines()[-1] == "rollout 4/4 episodes | mean reward 0.833 | running 0 | tokens 580"
    got = records(out)
    assert [(r["scenario_id"], r["sample"], r["reward"], r["finish_reason"]) for r in got] == [
        ("lib-001", 0, 1.0, "stop"), ("lib-001", 1, pytest.approx(1 / 3), "stop"),
        ("store-001", 0, 1.0, "stop"), ("store-001", 1, 1.0, "stop")]
    tools = {e: httpx.get(f"{ef_server.url}/v1/environments/{e}").json()["tools"]
             for e in ("library_circulation", "online_store_orders")}
    assert all(r["tools"] == tools[r["env_id"]] for r in got)
    assert all(a.authorization == "Bearer agent-key" and a.native for a in scripted.script.agent_requests())
    matches_expected("rollout-task-native.jsonl", got)

    for fmt in ("openai", "sharegpt"):
        sft = tmp_path / f"sft-{fmt}.jsonl"
        exported = envfoundry("export", "sft", str(out), "--out", str(sft), "--format", fmt, "--min-reward", "0.5")
        assert exported.returncode == 0, exported.stderr
        assert exported.stdout.splitlines() == [
            "kept 2, dropped 2", "  dropped 1: reward_below_minimum", "  dropped 1: unparsable_assistant_turn",
            f"wrote 2 {fmt} examples to {sft}"]
        examples = [json.loads(line) for line in sft.read_text().splitlines()]
        matches_expected(f"sft-{fmt}.jsonl", sorted(examples, key=lambda e: json.dumps(e, sort_keys=True)))


def test_prompt_tool_format_lists_tools_in_the_system_prompt_and_reads_tool_call_blocks(
        ef_server: Server, scripted: Running, tmp_path: Path) -> None:
    native, prompt = tmp_path / "native.jsonl", tmp_path / "prompt.jsonl"
    for fmt, out in (("native", native), ("prompt", prompt)):
        scripted.script.reset(dict(scripted.script.scripts))
        done = rollout(ef_server, scripted, out, "--scenario", "lib-001", "--tool-format", fmt)
        assert done.returncode == 0, done.stderr
        if fmt == "prompt":
            sent = scripted.script.agent_requests()
            assert sent and not any(r.native for r in sent)
            system = sent[0].messages[0]["content"]
            assert "<tools>" in system and all(t["function"]["name"] in system for t in records(out)[0]["tools"])
            assert sent[-1].messages[-1]["content"].startswith("<tool_response>\n")

    def projection(r: dict[str, Any]) -> Any:
        messages = [{k: v for k, v in m.items() if k not in ("tool_call_id", "tool_calls")} for m in r["messages"][1:]]
        calls = [{k: v for k, v in c.items() if k != "id"} for c in r["tool_calls"]]
        return messages, calls, r["reward"], r["checks"], r["steps"], r["turns"], r["finish_reason"]

    (n,), (p,) = records(native), records(prompt)
    assert p["tool_format"] == "prompt" and projection(p) == projection(n)
    assert [m["role"] for m in p["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool", "tool",
                                                  "tool", "assistant"]
    assert [c["function"]["name"] for c in p["messages"][4]["tool_calls"]] == ["return_book", "checkout_book",
                                                                               "renew_loan"]


def test_environment_selection_step_limit_and_llm_errors_end_episodes_cleanly(
        ef_server: Server, scripted: Running, tmp_path: Path) -> None:
    out = tmp_path / "store.jsonl"
    done = rollout(ef_server, scripted, out, "--env", "online_store_orders", "--max-steps", "1", "--concurrency", "3")
    assert done.returncode == 0, done.stderr
    got = records(out)
    failed = len(got) - 1
    assert done.stderr.splitlines()[-1].startswith(
        f"warning: {failed} of {len(got)} episodes failed outside the agent (llm_error {failed}); their rewards are "
        "not the agent's. First cause: llm_error: the LLM endpoint answered 404")
    assert done.stdout.splitlines()[2].split()[:3] == ["online_store_orders", str(len(got)), str(failed)]
    store_ids = [s["scenario_id"] for s in
                 httpx.get(f"{ef_server.url}/v1/environments/online_store_orders/scenarios").json()["scenarios"]]
    assert [r["scenario_id"] for r in got] == sorted(store_ids) and len(got) >= 2
    first = got[0]
    assert (first["scenario_id"], first["finish_reason"], first["turns"], first["steps"]) == ("store-001", "max_steps",
                                                                                               1, 1)
    assert first["reward"] == pytest.approx(2 / 3)  # the order is placed (stock, coupon) but not paid
    assert first["messages"][-1]["role"] == "tool"
    for r in got[1:]:  # the scripted LLM has no script for them: it answers 404, which is not retried
        assert r["finish_reason"] == "llm_error" and "404" in r["error"] and r["turns"] == 1
        assert r["reward"] < 1.0 and r["total"] > 0  # scored as it was left: nothing done
    sft = tmp_path / "sft.jsonl"
    exported = envfoundry("export", "sft", str(out), "--out", str(sft))
    assert exported.stdout.splitlines()[:3] == [f"kept 0, dropped {len(got)}", f"  dropped {len(got) - 1}: episode_failed",
                                                "  dropped 1: not_ended_by_assistant"]
    assert sft.read_text() == ""


def test_an_unknown_scenario_fails_before_any_episode(ef_server: Server, scripted: Running, tmp_path: Path) -> None:
    out = tmp_path / "none.jsonl"
    done = rollout(ef_server, scripted, out, "--scenario", "no-such-scenario")
    assert done.returncode == 1 and "error: 404 urn:envfoundry:problem:not-found" in done.stderr
    assert not out.exists() and not scripted.script.agent_requests()


def test_a_run_whose_llm_is_unreachable_says_so_and_exits_non_zero(ef_server: Server, tmp_path: Path) -> None:
    out = tmp_path / "unreachable.jsonl"
    nobody = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    done = envfoundry("rollout", "--server", ef_server.url, "--llm-base-url", nobody, "--model", "m",
                      "--scenario", "lib-001", "--samples", "2", "--out", str(out))
    assert done.returncode == 1, done.stderr
    message = done.stderr.splitlines()[-1]
    assert message.startswith("error: all 2 episodes failed outside the agent (llm_error 2); their rewards are not "
                              "the agent's. First cause: llm_error: no answer from the LLM endpoint (ConnectError")
    assert message.endswith("(after 4 attempts)")
    assert done.stdout.splitlines()[2].split()[:4] == ["library_circulation", "2", "2", "0.000"]
    assert "rollout 2/2 episodes | mean reward 0.000 | failed 2 | running 0" in done.stderr  # the progress line too
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["finish_reason"] for r in written] == ["llm_error", "llm_error"]  # the records are still written
    assert all(httpx.get(f"{ef_server.url}/v1/sessions/{r['session_id']}").status_code == 404 for r in written)


def test_concurrent_groups_give_the_same_episodes(ef_server: Server, scripted: Running, tmp_path: Path) -> None:
    out = tmp_path / "concurrent.jsonl"
    done = rollout(ef_server, scripted, out, "--scenario", "lib-001", "--scenario", "store-001", "--samples", "2",
                   "--concurrency", "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(TABLE)  # which sample drew which script may differ; the totals may not

    def outcome(r: dict[str, Any]) -> tuple[Any, ...]:
        return r["scenario_id"], r["reward"], r["steps"], r["turns"], r["usage"]["total_tokens"]

    expected = [json.loads(line) for line in (EXPECTED / "rollout-task-native.jsonl").read_text().splitlines()]
    got = records(out)
    assert sorted(map(outcome, got)) == sorted(map(outcome, expected))
    assert sorted(r["sample"] for r in got) == [0, 0, 1, 1]


TURNS_SCENARIO = {
    "scenario_id": "lib-turns-rollout", "env_id": "library_circulation",
    "init_config": {"members": {"M002": {"member_id": "M002", "name": "Priya Shah", "status": "active", "max_loans": 3}},
                    "books": {"B001": {"book_id": "B001", "title": "Dune", "total_copies": 1, "available_copies": 0}},
                    "loans": {"L0001": {"loan_id": "L0001", "book_id": "B001", "member_id": "M002",
                                        "due_date": "2024-05-08", "returned": False, "renewals": 0}}},
    "turns": [
        {"message": "When is my Dune due? I am member M002.", "checklist": [{"item": "looked up", "check": (
            "def check_func(s):\n    return any(c['name'] == 'list_member_loans' for c in turn_responses['calls'])")}]},
        {"message": "Please renew it.", "tools": ["renew_loan"], "checklist": [{"item": "renewed", "check": (
            "def check_func(s):\n    return s['loans']['L0001']['renewals'] == 1")}]}]}


def test_a_turn_based_episode_ends_each_turn_with_the_agents_answer(ef_server: Server, chat: Running,
                                                                     tmp_path: Path) -> None:
    assert httpx.post(f"{ef_server.url}/v1/scenarios", json=TURNS_SCENARIO).status_code == 201
    try:
        chat.script.reset({"When is my Dune due? I am member M002.": [[
            {"tool_calls": [{"name": "list_member_loans", "arguments": {"member_id": "M002"}}]},
            {"content": "Dune is due on 2024-05-08."},
            {"tool_calls": [{"name": "renew_loan", "arguments": {"loan_id": "L0001"}}]},
            {"content": "Renewed."}]]})
        out = tmp_path / "turns.jsonl"
        done = rollout(ef_server, chat, out, "--scenario", "lib-turns-rollout")
        assert done.returncode == 0, done.stderr
        [record] = records(out)
        assert (record["reward"], record["finish_reason"], record["steps"]) == (1.0, "user_done", 4)
        assert [m["content"] for m in record["messages"] if m["role"] == "user"] == [
            "When is my Dune due? I am member M002.", "Please renew it."]
        # renew_loan arrived with the second turn: offered from then on, and the call went through
        assert record["tool_calls"][-1]["name"] == "renew_loan" and record["tool_calls"][-1]["ok"] is True
        assert "renew_loan" in [t["function"]["name"] for t in record["tools"]]
    finally:
        httpx.delete(f"{ef_server.url}/v1/scenarios/lib-turns-rollout")


def test_rescore_replays_the_recorded_versions_and_scores_them_with_fixed_checks(
        ef_server: Server, scripted: Running, tmp_path: Path) -> None:
    scenario = httpx.get(f"{ef_server.url}/v1/scenarios/lib-001").json()
    scenario_id = f"lib-rescore-{tmp_path.name[-6:]}"
    body = {k: scenario[k] for k in ("env_id", "task", "init_config", "checklist", "reference_solution")}
    added = httpx.post(f"{ef_server.url}/v1/scenarios", json={**body, "scenario_id": scenario_id})
    assert added.status_code == 201, added.text
    out = tmp_path / "rollout.jsonl"
    done = rollout(ef_server, scripted, out, "--scenario", scenario_id, "--samples", "2", "--concurrency", "1")
    assert done.returncode == 0, done.stderr
    before = sorted((r["sample"], r["reward"]) for r in map(json.loads, out.read_text().splitlines()))
    assert before == [(0, 1.0), (1, pytest.approx(1 / 3))]
    # the checks are fixed later: only the first one counts now (a new version of the scenario)
    fixed = httpx.post(f"{ef_server.url}/v1/scenarios", json={**body, "scenario_id": scenario_id,
                                                               "checklist": scenario["checklist"][:1]})
    assert fixed.status_code == 201 and fixed.json()["version"] != added.json()["version"]
    for checks, expected in (("latest", [(0, 1.0), (1, 1.0)]), ("pinned", before)):
        again = tmp_path / f"rescored-{checks}.jsonl"
        rescored = envfoundry("rescore", str(out), "--server", ef_server.url, "--checks", checks, "--out", str(again))
        assert rescored.returncode == 0, rescored.stderr
        lines = [json.loads(line) for line in again.read_text().splitlines()]
        assert sorted((r["sample"], r["reward"]) for r in lines) == expected, checks
        assert all(r["rescored"]["diverged"] == [] for r in lines)  # the replay answered as recorded
        assert {r["rescored"]["scenario_version"] for r in lines} == {
            fixed.json()["version"] if checks == "latest" else added.json()["version"]}
    assert "rescored 2 of 2 lines (latest checks): 1 rewards changed" in envfoundry(
        "rescore", str(out), "--server", ef_server.url, "--out", str(tmp_path / "x.jsonl")).stdout
