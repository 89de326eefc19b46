"""OpenEnv's MCP methods: plain JSON-RPC 2.0 at ``<base>/mcp`` and in the WebSocket's ``mcp`` messages.

OpenEnv's ``MCPToolClient`` posts one JSON-RPC object and reads one back (no Streamable HTTP
session): ``openenv/session/create`` opens an episode and answers its ``session_id`` (the
episode id), ``tools/list`` and ``tools/call`` name it in ``params.session_id`` (a WebSocket
binds it instead), ``openenv/session/close`` ends it. Service errors are JSON-RPC errors whose
``data`` is the problem body REST would send; a tool failure is a result with ``isError``.

A ``tools/call`` result carries the episode's ``reward`` and ``done`` after the call, as OpenEnv's
own MCP environments answer it (their result is the step's ``CallToolObservation``, reward and done
included), and its ``data`` carries them too, because ``data`` is what ``MCPToolClient.call_tool``
returns: a trainer on the MCP door reads its reward there, as it would from OpenEnv's.
"""

from __future__ import annotations

from typing import Any

from service.api import calls
from service.api.calls import checked_key
from service.api.openenv import Episodes, call_observation, mcp_tools
from service.api.problems import RPC_INVALID_PARAMS, RPC_INVALID_REQUEST, RPC_METHOD_NOT_FOUND, problem_body, rpc_code
from service.errors import InvalidRequest, ServiceError

KEY_META = "envfoundry/idempotency-key"


def rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "error": error, "id": request_id}


async def answer(episodes: Episodes, message: Any, bound: str | None = None) -> dict[str, Any]:
    """The JSON-RPC response to ``message``; ``bound`` is the episode of the WebSocket carrying it."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        request_id = message.get("id") if isinstance(message, dict) else None
        return rpc_error(request_id, RPC_INVALID_REQUEST, "a JSON-RPC 2.0 request needs jsonrpc '2.0' and a method")
    request_id, method = message.get("id"), message["method"]
    params = message.get("params", {})
    if not isinstance(params, dict):
        return rpc_error(request_id, RPC_INVALID_PARAMS, "params must be an object")
    try:
        result = await _dispatch(episodes, method, params, bound)
    except ServiceError as exc:
        return rpc_error(request_id, rpc_code(exc), exc.detail, problem_body(exc))
    if result is None:
        return rpc_error(request_id, RPC_METHOD_NOT_FOUND, f"method not found: {method}")
    return {"jsonrpc": "2.0", "result": result, "id": request_id}


async def _dispatch(episodes: Episodes, method: str, params: dict[str, Any], bound: str | None) -> Any:
    if method == "tools/list":
        env = await episodes.environment()
        if bound or params.get("session_id"):
            snap = await episodes.episode(_episode(params, bound))
            return {"tools": mcp_tools(env, await episodes.engine.turns.tools(snap, env))}  # (a turn's tools)
        return {"tools": mcp_tools(env)}
    if method == "tools/call":
        return await _call(episodes, params, bound)
    if method == "openenv/session/create":
        if bound:
            return {"session_id": bound}
        opened = await episodes.reset({k: v for k, v in params.items() if k != "session_id"})
        return {"session_id": opened.session_id, "observation": opened.payload["observation"]}
    if method == "openenv/session/close":
        episode_id = _episode(params, None)
        if episode_id == bound:
            raise InvalidRequest("this WebSocket holds the episode: close the WebSocket instead",
                                 field="session_id")
        await episodes.close(episode_id)
        return {"session_id": episode_id, "closed": True}
    return None


def _episode(params: dict[str, Any], bound: str | None) -> str:
    episode_id = params.get("session_id", bound)
    if not isinstance(episode_id, str) or not episode_id:
        raise InvalidRequest("params.session_id (from openenv/session/create) is required", field="session_id")
    if bound and episode_id != bound:
        raise InvalidRequest("this WebSocket is bound to another episode", field="session_id")
    return episode_id


async def _call(episodes: Episodes, params: dict[str, Any], bound: str | None) -> dict[str, Any]:
    episode_id = _episode(params, bound)
    name = params.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("params.name, the tool's name, is required", field="name")
    arguments = params.get("arguments") or {}
    meta = params.get("_meta")
    key = checked_key(meta.get(KEY_META) if isinstance(meta, dict) else None, f"_meta.{KEY_META}")
    snap = await episodes.episode(episode_id)
    applied = await calls.run(episodes.engine, calls.CallRequest(episode_id, name, arguments, key, episodes.tenant))
    observation = call_observation(applied)
    outcome = {"reward": await episodes.reward(episode_id), "done": snap.meta.done}
    view = calls.view(applied)
    # ``data`` is what OpenEnv's MCPToolClient.call_tool returns: the whole call record, so a failed call
    # says why instead of looking like an empty result, with the reward and done after it.
    return {"content": [{"type": "text", "text": observation["text"]}], "structuredContent": view,
            "isError": not applied.record["ok"], "data": {**view, **outcome}, **outcome}
