"""An OpenEnv episode whose WebSocket drops without a ``close`` is ended after a grace period (issue 32),
unless a client takes it up again: what TRL's OpenEnv clients leave (they never send ``close``).
A real server with a 1 s grace; plain WebSocket clients."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.conftest import Server
from tests.trainers.conftest import GRACE


@pytest.fixture
def server(memory_server: list[Server]) -> Server:
    """tests/trainers' server, whose grace is GRACE."""
    return memory_server[-1]


def ws_url(server: Server) -> str:
    return server.url.replace("http://", "ws://") + "/openenv/library_circulation/ws"


def exchange(ws: Any, message: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps(message))
    answer: dict[str, Any] = json.loads(ws.recv(timeout=60))
    return answer


def opened(ws: Any, **data: Any) -> str:
    answer = exchange(ws, {"type": "reset", "data": data or {"scenario_id": "lib-001"}})
    episode: str = answer["data"]["observation"]["episode_id"]
    return episode


def status(server: Server, episode: str) -> int:
    return httpx.get(f"{server.url}/v1/sessions/{episode}").status_code


def ended(server: Server, episode: str, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if status(server, episode) == 404:
            return True
        time.sleep(0.2)
    return False


def test_a_dropped_episode_is_ended_after_the_grace(server: Server) -> None:
    with connect(ws_url(server)) as ws:  # leaves without a close message, as TRL's OpenEnv clients do
        episode = opened(ws)
    assert ended(server, episode)


def test_an_episode_taken_up_again_or_moving_on_stays_until_closed(server: Server) -> None:
    with connect(ws_url(server)) as ws:
        again = opened(ws)
    with connect(ws_url(server)) as ws:
        moving = opened(ws)
    with connect(ws_url(server)) as ws:  # reconnects within the grace and goes on with it
        assert opened(ws, episode_id=again) == again
        # the other is stepped through REST meanwhile: someone is using it
        assert httpx.post(f"{server.url}/v1/sessions/{moving}/calls",
                          json={"name": "list_member_loans", "arguments": {"member_id": "M002"}}).status_code == 200
        time.sleep(GRACE * 3)  # the grace has passed for both
        assert (status(server, again), status(server, moving)) == (200, 200)
        exchange(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "return_book",
                                               "arguments": {"loan_id": "L0003"}}})
        ws.send(json.dumps({"type": "close"}))
    assert status(server, again) == 404  # closed by its client
    httpx.delete(f"{server.url}/v1/sessions/{moving}")
