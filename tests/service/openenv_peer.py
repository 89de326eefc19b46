"""Runs inside .venv-openenv (scripts/peer-venvs): OpenEnv's released clients driving an envfoundry base URL.

    python openenv_peer.py play BASE SOLUTION_JSON        GenericEnvClient over the WebSocket, MCPToolClient
                                                         (HTTP /mcp, then a WebSocket step; then /mcp
                                                         alone), openenv validate
    python openenv_peer.py reconnect BASE SOLUTION_JSON   one step, then waits for another base URL on stdin

Prints one JSON object per line: what the clients returned, for the test to judge (one process
plays everything: importing openenv takes seconds). It imports nothing of envfoundry, as a
trainer's process would not.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient


def emit(**fields: Any) -> None:
    print(json.dumps(fields, default=str), flush=True)


def call(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "call_tool", "tool_name": tool["name"], "arguments": tool["arguments"]}


def over_websocket(base: str, solution: list[dict[str, Any]]) -> None:
    emit(kind="part", part="ws")
    with GenericEnvClient(base_url=base).sync() as env:
        opened = env.reset(scenario_id="lib-001")
        emit(kind="reset", observation=opened.observation, reward=opened.reward, done=opened.done)
        listed = env.step({"type": "list_tools"})
        emit(kind="tools", names=[t["name"] for t in listed.observation["tools"]])
        for tool in solution:
            result = env.step(call(tool))
            emit(kind="step", observation=result.observation, reward=result.reward, done=result.done)
        emit(kind="state", state=env.state())


def over_mcp(base: str, solution: list[dict[str, Any]]) -> None:
    emit(kind="part", part="mcp")
    with MCPToolClient(base_url=base).sync() as env:
        opened = env.reset()  # the episode openenv/session/create opened: seed 0 is lib-001
        emit(kind="reset", observation=opened.observation.model_dump(), reward=opened.reward)
        emit(kind="tools", names=[t.name for t in env.list_tools()])
        *first, last = solution
        for tool in first:
            emit(kind="call", record=env.call_tool(tool["name"], **tool["arguments"]))
        result = env.step(CallToolAction(tool_name=last["name"], arguments=last["arguments"]))
        emit(kind="step", observation=result.observation.model_dump(), reward=result.reward)
        emit(kind="state", state=env.state().model_dump())


def over_mcp_calls(base: str, solution: list[dict[str, Any]]) -> None:
    emit(kind="part", part="mcp_calls")
    with MCPToolClient(base_url=base).sync() as env:
        env.reset()
        for tool in solution:  # the whole reference solution through call_tool, as a trainer on /mcp runs it
            emit(kind="call", record=env.call_tool(tool["name"], **tool["arguments"]))
        emit(kind="state", state=env.state().model_dump())


def validated(base: str) -> None:
    # What `openenv validate --url BASE` runs and prints a verdict of.
    from openenv.cli._validation import validate_running_environment

    report = validate_running_environment(base, timeout_s=30)
    emit(kind="part", part="validate")
    emit(kind="report", passed=report["passed"], failed=report["summary"]["failed_criteria"], mode=report["mode"])


def play(base: str, solution: list[dict[str, Any]]) -> None:
    over_websocket(base, solution)
    over_mcp(base, solution)
    over_mcp_calls(base, solution)
    validated(base)


def reconnecting(base: str, solution: list[dict[str, Any]]) -> None:
    env = GenericEnvClient(base_url=base).sync()
    env.connect()
    episode_id = env.reset(scenario_id="lib-001").observation["episode_id"]
    first = env.step(call(solution[0]))
    emit(kind="first", episode_id=episode_id, observation=first.observation)
    other = sys.stdin.readline().strip()  # the test kills this replica, then names the other
    try:
        env.step(call(solution[1]))
        emit(kind="dead", failed=False)
    except Exception as exc:  # the connection to a killed process: what a trainer's loop would catch
        emit(kind="dead", failed=True, error=type(exc).__name__)
    with GenericEnvClient(base_url=other).sync() as again:
        resumed = again.reset(episode_id=episode_id)
        emit(kind="resumed", observation=resumed.observation, reward=resumed.reward)
        for tool in solution[1:]:
            result = again.step(call(tool))
            emit(kind="step", observation=result.observation, reward=result.reward)


if __name__ == "__main__":
    how, base_url, steps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    {"play": play, "reconnect": reconnecting}[how](base_url, steps)
