"""Conversation mode: a simulated user (a scripted OpenAI-compatible endpoint) holds the task."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest

from service.engine.user_llm import STOP
from tests.in_process import AppServer, start_app
from tests.scripted_openai import Running
from tests.scripted_openai.queue import ChatQueue
from tests.service.test_api import call, new_session, problem, state

pytestmark = pytest.mark.in_process

TASK_START = "Add item A1 named Apple"


@pytest.fixture
def chat() -> Iterator[Running]:
    with Running(ChatQueue()) as server:
        yield server


@pytest.fixture
def served(chat: Running) -> Iterator[AppServer]:
    server = start_app(extra_env={"ENVFOUNDRY_USER_LLM_BASE_URL": chat.url, "ENVFOUNDRY_USER_LLM_MODEL": "user-sim",
                                  "ENVFOUNDRY_USER_LLM_TIMEOUT": "2"})
    yield server
    server.stop()


def converse(client: httpx.Client, sid: str, content: str, status: int = 200) -> httpx.Response:
    response = client.post(f"/v1/sessions/{sid}/messages", json={"content": content})
    assert response.status_code == status, response.text
    return response


def test_a_whole_conversation_episode(served: AppServer, chat: Running) -> None:
    chat.script.extend(["Hi, I need an item added to my list.", "It's A1, called Apple, two of them.",
                    f"Great, that's all.\n{STOP}"])
    with served.client() as client:
        opened = client.post("/v1/sessions", json={"scenario_id": "probe-001", "mode": "conversation"})
        assert opened.status_code == 201, opened.text
        body = opened.json()
        sid = body["session_id"]
        assert body["mode"] == "conversation" and body["task"] is None
        assert body["user_message"] == "Hi, I need an item added to my list."
        # the hidden goal reaches the simulated user only, in its system prompt
        system = chat.script.requests[0].messages[0]
        assert system["role"] == "system" and TASK_START in system["content"] and STOP in system["content"]
        assert chat.script.requests[0].model == "user-sim"

        first = converse(client, sid, "Sure, which item?").json()
        assert first == {"step": 1, "reply": "It's A1, called Apple, two of them.", "done": False}
        # the user sees the conversation so far with roles turned around: it plays the user
        sent = chat.script.requests[1].messages
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
        assert sent[2]["content"] == body["user_message"] and sent[3]["content"] == "Sure, which item?"

        call(client, sid, "add_item", {"item_id": "A1", "name": "Apple", "qty": 2})
        call(client, sid, "increment", {"by": 3})
        last = converse(client, sid, "Done: A1 Apple x2 added.").json()
        assert last == {"step": 4, "reply": "Great, that's all.", "done": True}
        assert [m["content"] for m in chat.script.requests[2].messages[4:]] == [
            "It's A1, called Apple, two of them.", "Done: A1 Apple x2 added."]

        info = client.get(f"/v1/sessions/{sid}").json()
        assert info["done"] is True and info["steps"] == 4
        steps = client.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]
        assert [s["kind"] for s in steps] == ["message", "call", "call", "message"]
        assert steps[3] == {"step": 4, "kind": "message", "content": "Done: A1 Apple x2 added.",
                            "reply": "Great, that's all.", "done": True}
        assert client.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0
        problem(client.post(f"/v1/sessions/{sid}/messages", json={"content": "anything else?"}), 409,
                "conversation-ended")
        assert len(chat.script.requests) == 3


def test_a_failing_user_llm_leaves_the_session_as_it_was(served: AppServer, chat: Running) -> None:
    chat.script.extend(["Hello, I need help.", ("status", 500), ("raw", b"not json at all"), ("raw", b'{"choices": []}'),
                    ("sleep", 3.0), "", "Item A1 please."])
    with served.client() as client:
        sid = client.post("/v1/sessions", json={"scenario_id": "probe-001", "mode": "conversation"}).json()["session_id"]
        before = state(client, sid)
        for expected in ("HTTP 500", "without a chat completion", "without a chat completion", "timed out", "empty"):
            failed = problem(converse(client, sid, "How can I help?", 502), 502, "user-llm-failed")
            assert expected in failed["detail"]
            assert state(client, sid) == before
            assert client.get(f"/v1/sessions/{sid}/trajectory").json()["total"] == 0
        # the session is still usable
        assert converse(client, sid, "How can I help?").json() == {"step": 1, "reply": "Item A1 please.", "done": False}


def test_a_keyed_message_is_sent_to_the_user_once(served: AppServer, chat: Running) -> None:
    chat.script.extend(["Hi.", "A1 please."])
    with served.client() as client:
        sid = client.post("/v1/sessions", json={"scenario_id": "probe-001", "mode": "conversation"}).json()["session_id"]
        key = {"Idempotency-Key": secrets.token_hex(8)}
        first = client.post(f"/v1/sessions/{sid}/messages", json={"content": "Which item?"}, headers=key)
        again = client.post(f"/v1/sessions/{sid}/messages", json={"content": "Which item?"}, headers=key)
        assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
        assert len(chat.script.requests) == 2


def test_a_conversation_group_shares_one_opening(served: AppServer, chat: Running) -> None:
    chat.script.extend(["Hi, one opening for all."])
    with served.client() as client:
        group = client.post("/v1/sessions", json={"scenario_id": "probe-001", "mode": "conversation", "n": 3}).json()
        assert len(group["session_ids"]) == 3 and len(chat.script.requests) == 1
        for sid in group["session_ids"]:
            assert client.get(f"/v1/sessions/{sid}").json()["mode"] == "conversation"


def test_opening_failure_creates_nothing(served: AppServer, chat: Running) -> None:
    chat.script.extend([("status", 503)])
    with served.client() as client:
        problem(client.post("/v1/sessions", json={"scenario_id": "probe-001", "mode": "conversation"}), 502,
                "user-llm-failed")


def test_conversation_rules(client: httpx.Client) -> None:
    """Without a configured user LLM conversation mode is a clear 503; task sessions take no messages."""
    body = problem(client.post("/v1/sessions", json={"scenario_id": "probe-001", "mode": "conversation"}), 503,
                   "user-llm-unavailable")
    assert "ENVFOUNDRY_USER_LLM_BASE_URL" in body["detail"]
    assert "Retry-After" not in client.post("/v1/sessions", json={"scenario_id": "probe-001",
                                                                  "mode": "conversation"}).headers
    problem(client.post("/v1/sessions", json={"env_id": "probe", "mode": "conversation"}), 422, "invalid-request")
    sid = new_session(client, scenario_id="probe-001")
    problem(client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}), 409, "not-conversation")
    problem(client.post(f"/v1/sessions/{sid}/messages", json={"content": ""}), 422, "invalid-request")
