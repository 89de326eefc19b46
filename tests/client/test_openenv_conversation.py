"""OpenEnv's protocol in conversation mode: the simulated user (the scripted endpoint) holds the task."""

from __future__ import annotations

import json
from typing import Any

from websockets.sync.client import connect

from tests.client.agent_scripts import LIB_001_OPENING, LIB_001_USER
from tests.client.test_rollout import task
from tests.conftest import Server
from tests.scripted_openai import Running


def exchange(ws: Any, message: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps(message))
    answer: dict[str, Any] = json.loads(ws.recv(timeout=60))
    return answer


def test_send_message_talks_to_the_user_until_it_is_done(ef_server: Server, chat: Running) -> None:
    chat.script.reset({}, users={task(ef_server, "lib-001"): LIB_001_USER})
    with connect(ef_server.url.replace("http://", "ws://") + "/openenv/library_circulation/ws") as ws:
        opened = exchange(ws, {"type": "reset", "data": {"scenario_id": "lib-001", "mode": "conversation"}})
        observation = opened["data"]["observation"]
        assert (observation["task"], observation["user_message"]) == (None, LIB_001_OPENING)
        first = exchange(ws, {"type": "step", "data": {"type": "send_message", "content": "Which book?"}})["data"]
        assert (first["observation"]["reply"], first["done"]) == (LIB_001_USER[1], False)
        assert isinstance(first["reward"], float)
        last = exchange(ws, {"type": "step", "data": {"type": "send_message", "content": "Anything else?"}})
        assert last["data"]["done"] is True
        tools = exchange(ws, {"type": "step", "data": {"type": "list_tools"}})
        assert tools["data"]["done"] is True
