"""Conversation mode from the client side: a simulated user (the scripted endpoint, called by the
service) holds the task; the client, the gym adapter and the rollout runner talk to it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from envfoundry_client import Client, ConversationEnded, MessageStep, NotConversation, UserLLMUnavailable
from envfoundry_client.gym import EnvfoundryEnv

from tests.client.agent_scripts import LIB_001_CONVERSATION, LIB_001_OPENING, LIB_001_USER
from tests.client.test_rollout import envfoundry, matches_expected, records, rollout, task
from tests.conftest import Server, start_server
from tests.scripted_openai import Running

# lib-001, two samples. Track 0: 5 agent turns sending 2, 4, 6, 8, 11 messages (10 per message + 5:
# 25+45+65+85+115 = 335), 4 tool calls and 2 messages = 6 steps, reward 1.0. Track 1: 3 turns
# sending 2, 4, 6 (25+45+65 = 135), 1 call and 2 messages = 3 steps, reward 1/3.
TABLE = """\
environment          episodes  failed  mean reward  success        pass@k  mean steps  tokens
-------------------  --------  ------  -----------  -------  ------------  ----------  ------
library_circulation         2       0        0.667    50.0%  100.0% (k=2)         4.5     470"""


@pytest.fixture
def conversing(ef_server: Server, chat: Running) -> Running:
    lib = task(ef_server, "lib-001")
    chat.script.reset({LIB_001_OPENING: LIB_001_CONVERSATION}, users={lib: LIB_001_USER})
    return chat


def test_the_client_talks_with_the_simulated_user(ef: Client, ef_server: Server, conversing: Running) -> None:
    group = ef.create_session("lib-001", mode="conversation", n=2)
    assert (group.mode, group.task, group.user_message) == ("conversation", None, LIB_001_OPENING)
    assert group.prompt == LIB_001_OPENING and len(group.session_ids) == 2
    sid = group.session_id
    ef.call(sid, "return_book", {"loan_id": "L0003"})
    reply = ef.send_message(sid, "Kindred is returned. Anything else?")
    assert (reply.step, reply.reply, reply.done) == (2, LIB_001_USER[1], False)
    assert ef.send_message(sid, "Sorry, not today.").done
    info = ef.get_session(sid)
    assert (info.mode, info.done, info.steps) == ("conversation", True, 3)
    steps = ef.trajectory(sid).steps
    assert [s.kind for s in steps] == ["call", "message", "message"]
    assert isinstance(steps[1], MessageStep) and steps[1].reply == LIB_001_USER[1]
    with pytest.raises(ConversationEnded):
        ef.send_message(sid, "Hello?")
    with pytest.raises(NotConversation):
        ef.send_message(ef.create_session("lib-001").session_id, "Hello?")
    goal = conversing.script.user_requests()[0]
    assert task(ef_server, "lib-001") in goal.messages[0]["content"]  # the task is the user's hidden goal
    assert goal.authorization == "Bearer user-llm-key"


def test_gym_adapter_in_conversation_mode(ef: Client, conversing: Running) -> None:
    env = EnvfoundryEnv(ef)
    observation, info = env.reset(options={"scenario_id": "lib-001", "mode": "conversation"})
    assert observation == LIB_001_OPENING and info["mode"] == "conversation" and info["task"] is None
    env.step({"name": "return_book", "arguments": {"loan_id": "L0003"}})
    obs, reward, terminated, _, _ = env.step("Kindred is returned. Anything else?")
    assert (obs, reward, terminated) == (LIB_001_USER[1], 0.0, False)
    env.step([{"name": "renew_loan", "arguments": {"loan_id": "L0001"}},
              {"name": "checkout_book", "arguments": {"member_id": "M002", "book_id": "B003"}}])
    obs, reward, terminated, truncated, info = env.step("All done.")
    assert (obs, reward, terminated, truncated) == ("That's everything, thank you!", 1.0, True, False)
    env.close()


def test_conversation_rollout_writes_exact_trajectories_and_sft_data(ef_server: Server, conversing: Running,
                                                                     tmp_path: Path) -> None:
    out = tmp_path / "conversation.jsonl"
    done = rollout(ef_server, conversing, out, "--scenario", "lib-001", "--mode", "conversation", "--samples", "2",
                   "--concurrency", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == TABLE + f"\nwrote 2 trajectories to {out}\n"
    got = records(out)
    assert [(r["sample"], r["reward"], r["finish_reason"], r["steps"]) for r in got] == [
        (0, 1.0, "user_done", 6), (1, pytest.approx(1 / 3), "user_done", 3)]
    assert got[0]["messages"][1] == {"role": "user", "content": LIB_001_OPENING}
    assert got[0]["messages"][-1] == {"role": "user", "content": "That's everything, thank you!"}
    matches_expected("rollout-conversation.jsonl", got)
    sft = tmp_path / "sft.jsonl"
    exported = envfoundry("export", "sft", str(out), "--out", str(sft), "--format", "sharegpt", "--min-reward", "1")
    assert exported.stdout.splitlines()[:2] == ["kept 1, dropped 1", "  dropped 1: reward_below_minimum"]
    (example,) = [json.loads(line) for line in sft.read_text().splitlines()]
    assert [t["from"] for t in example["conversations"]] == [
        "human", "function_call", "observation", "function_call", "observation", "gpt", "human", "function_call",
        "observation", "gpt"]  # the user's closing words are not trained on
    matches_expected("sft-conversation-sharegpt.jsonl", [example])


@pytest.fixture(scope="module")
def no_user_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("plain"))
    yield server
    server.stop()


def test_without_a_simulated_user_conversation_mode_is_a_clear_error(no_user_llm: Server, chat: Running,
                                                                     tmp_path: Path) -> None:
    with Client(no_user_llm.url) as ef, pytest.raises(UserLLMUnavailable):
        ef.create_session("lib-001", mode="conversation")
    out = tmp_path / "none.jsonl"
    done = rollout(no_user_llm, chat, out, "--scenario", "lib-001", "--mode", "conversation")
    assert done.returncode == 1 and "user-llm-unavailable" in done.stderr.splitlines()[-1]
