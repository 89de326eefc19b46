"""The Gymnasium-style adapter over a real server: reset, every action shape, rewards, limits."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium
import pytest
from envfoundry_client import Client, NotFound
from envfoundry_client.gym import EnvfoundryEnv

from tests.conftest import Server


def test_is_a_gymnasium_env_when_gymnasium_is_installed(ef: Client) -> None:
    assert isinstance(EnvfoundryEnv(ef, scenario_id="lib-001"), gymnasium.Env)


def test_reset_returns_the_task_and_what_the_agent_needs(ef: Client) -> None:
    env = EnvfoundryEnv(ef)
    observation, info = env.reset(seed=3, options={"scenario_id": "lib-001"})
    assert observation == ef.get_scenario("lib-001").task
    assert info["session_id"] and info["mode"] == "task" and info["env_id"] == "library_circulation"
    assert info["rules"] and info["introduction"]
    assert "return_book" in [t["function"]["name"] for t in info["tools"]]
    first = info["session_id"]
    env.reset(options={"scenario_id": "lib-001"})
    with pytest.raises(NotFound):  # a new episode ends the previous session
        ef.get_session(first)
    env.close()


def test_an_episode_solved_with_every_action_shape_earns_reward_one(ef: Client) -> None:
    env = EnvfoundryEnv(ef, scenario_id="lib-001")
    env.reset()
    obs, reward, terminated, truncated, info = env.step(
        {"type": "function", "function": {"name": "return_book", "arguments": '{"loan_id": "L0003"}'}})
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert json.loads(obs)["success"] is True and info["calls"][0].ok
    obs, reward, terminated, _, _ = env.step(
        '<tool_call>\n{"name": "checkout_book", "arguments": {"member_id": "M002", "book_id": "B003"}}\n</tool_call>')
    assert json.loads(obs)["success"] is True and not terminated
    env.step(json.dumps({"name": "renew_loan", "arguments": {"loan_id": "L0001"}}))
    obs, reward, terminated, truncated, info = env.step("Kindred is returned, Parable is yours, Dune is renewed.")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["score"].passed == 3
    with pytest.raises(RuntimeError):
        env.step("again")
    env.close()


def test_a_malformed_action_is_an_observation_not_an_exception(ef: Client) -> None:
    env = EnvfoundryEnv(ef, scenario_id="lib-001")
    env.reset()
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "return_book", </tool_call>')
    assert obs.startswith("Your action could not be read: tool call 1 is not valid JSON")
    assert (reward, terminated, truncated) == (0.0, False, False) and "error" in info
    assert ef.get_session(info["session_id"]).steps == 0
    unknown = env.step({"name": "no_such_tool", "arguments": {}})
    assert "unknown tool 'no_such_tool'" in unknown[0] and not unknown[4]["calls"][0].ok
    env.close()


def test_max_steps_truncates_and_scores(ef: Client) -> None:
    env = EnvfoundryEnv(ef, scenario_id="lib-001", max_steps=2)
    env.reset()
    assert env.step({"name": "return_book", "arguments": {"loan_id": "L0003"}})[3] is False
    _, reward, terminated, truncated, info = env.step({"name": "renew_loan", "arguments": {"loan_id": "L0001"}})
    assert (terminated, truncated) == (False, True)
    assert reward == pytest.approx(2 / 3) and info["score"].passed == 2  # Kindred returned, Dune renewed
    env.close()


def test_reward_every_step_reports_progress(ef: Client) -> None:
    env = EnvfoundryEnv(ef, scenario_id="lib-001", reward_every_step=True)
    env.reset()
    rewards = [env.step({"name": n, "arguments": a})[1] for n, a in [
        ("return_book", {"loan_id": "L0003"}), ("checkout_book", {"member_id": "M002", "book_id": "B003"})]]
    assert rewards == pytest.approx([1 / 3, 2 / 3])
    env.close()


def test_works_without_gymnasium(ef_server: Server) -> None:
    code = (
        "import sys; sys.modules['gymnasium'] = None\n"  # makes `import gymnasium` fail
        "from envfoundry_client.gym import EnvfoundryEnv\n"
        f"env = EnvfoundryEnv(base_url={ef_server.url!r}, scenario_id='store-001')\n"
        "obs, info = env.reset()\n"
        "print(type(env).__mro__[1].__name__, bool(obs), len(info['tools']) > 0)\n"
        "print(env.step('nothing to do')[1:4])\n"
        "env.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["_Plain True True", "(0.0, True, False)"]
