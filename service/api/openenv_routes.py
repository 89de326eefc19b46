"""OpenEnv's HTTP and WebSocket endpoints, per environment at ``/openenv/{env_id}``.

    WS   /ws        one connection, one episode at a time: reset, step, state, mcp, close messages
    POST /reset     open an episode (or continue one by episode_id); answers its episode_id
    POST /step      {action, episode_id, request_id?}; without episode_id, one action on a throwaway episode
    GET  /state     ?episode_id=
    GET  /schema    action, observation and state JSON Schemas (the action's names every tool)
    GET  /metadata  name, description, rules, tools and scenarios
    GET  /health    {"status": "healthy"}
    GET  /openapi.json  these endpoints, for OpenEnv's tools that read them
    POST /mcp       JSON-RPC (see service/api/openenv_rpc.py)

OpenEnv's own servers answer HTTP ``/reset`` and ``/step`` from a throwaway environment per
request; here an HTTP episode is a stored session, so ``/step`` names its ``episode_id`` to go on
with one. A ``/step`` without it is OpenEnv's stateless simulation: a fresh episode (what a reset
without arguments opens) takes the action and is ended.

Every endpoint takes the API key REST takes (scope ``run``) and sees only the key's tenant. The
WebSocket authenticates its upgrade request the same way, before accepting it: a refused upgrade
(no key, a wrong one, a key without ``run``, or past a WebSocket cap of ``service/api/sockets.py``) is
answered with the problem+json REST would answer and its connection closed at once (logged and
counted as message type ``connect``). It bounds each message as REST bounds a body; each message
is logged and counted (method ``WS``) as a request is. A socket that waits too long for a message,
or whose connection the server needs for another client, is closed (1001 or 1013) and its episode
stays, as when a connection drops. A WebSocket ``close``
message ends the episode the connection opened; a connection that just drops leaves it in the
store (idle sessions expire), so a client can reconnect, here or on another replica, and continue
with ``reset(episode_id=...)``. ``?session_id=`` binds the connection to an episode opened
elsewhere (OpenEnv's MCPToolClient opens one over ``/mcp`` first); ``close`` then leaves it open.

These routes are outside ``openapi/openapi.json``, as the MCP ones are: their contract is
OpenEnv's, and its clients are what the tests drive them with.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Body, FastAPI, Header, Query, Request, WebSocket
from starlette.websockets import WebSocketDisconnect

from service.api import openenv_rpc, problems
from service.api.auth import Principal
from service.api.calls import checked_key
from service.api.limits import non_finite
from service.api.openenv import Episodes, mcp_tools
from service.api.openenv_orphans import Orphans
from service.api.problems import openenv_code, problem_body
from service.api.scopes import Run
from service.api.sockets import Closing, Socket
from service.engine import idempotency
from service.errors import InvalidRequest, LimitExceeded, ServiceError

BASE = "/openenv/{env_id}"
WS_ROUTE = f"{BASE}/ws"
MESSAGE_TYPES = frozenset({"reset", "step", "state", "mcp", "close"})
log = logging.getLogger("envfoundry.access")
router = APIRouter(prefix=BASE, include_in_schema=False)

OBSERVATION_SCHEMA = {
    "type": "object",
    "description": "reset: episode_id, env_id, scenario_id, seed, mode, step, task (or user_message in "
                   "conversation mode), introduction, rules, tool_schemas (OpenAI function schemas). "
                   "call_tool: tool_name, result, error (OpenEnv ToolError or null), ok, step, text. "
                   "list_tools: tools. send_message: step, reply. Turn-based scenarios: reset also turn, turns "
                   "(user_message is the turn's message, tool_schemas its tools); end_turn: step, ended_turn, "
                   "turn, turns, done, user_message, new_tools.",
}
STATE_SCHEMA = {
    "type": "object",
    "properties": {"episode_id": {"type": "string"}, "step_count": {"type": "integer", "minimum": 0},
                   "env_id": {"type": "string"}, "scenario_id": {"type": ["string", "null"]},
                   "mode": {"enum": ["task", "conversation"]}, "done": {"type": "boolean"},
                   "state": {"type": "object", "description": "the session's state view (see the README)"}},
    "required": ["episode_id", "step_count"],
}


def _episodes(request: Request, env_id: str, who: Principal) -> Episodes:
    return Episodes(request.app.state.sessions, env_id, who.tenant)


def _episode_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest("episode_id must name the episode reset answered (a string): this server keeps "
                             "episodes, so state names one, and a step goes on with one", field="episode_id")
    return value


@router.post("/reset")
async def reset(request: Request, env_id: str, body: dict[str, Any] = Body(default_factory=dict),
                who: Principal = Run) -> dict[str, Any]:
    return (await _episodes(request, env_id, who).reset(body)).payload


@router.post("/step")
async def step(request: Request, env_id: str, body: dict[str, Any] = Body(...), who: Principal = Run,
               header_key: str | None = Header(default=None, alias=idempotency.HEADER)) -> dict[str, Any]:
    key = checked_key(body.get("request_id"), "request_id") or checked_key(header_key, idempotency.HEADER)
    if "action" not in body:
        raise InvalidRequest("step needs an action", field="action")
    episodes = _episodes(request, env_id, who)
    if body.get("episode_id") is None:
        return await episodes.step_fresh(body["action"])
    return await episodes.step(_episode_id(body.get("episode_id")), body["action"], key)


@router.get("/state")
async def state(request: Request, env_id: str, episode_id: str | None = Query(default=None),
                who: Principal = Run) -> dict[str, Any]:
    return await _episodes(request, env_id, who).state(_episode_id(episode_id))


@router.get("/schema")
async def schema(request: Request, env_id: str, who: Principal = Run) -> dict[str, Any]:
    env = await _episodes(request, env_id, who).environment()
    calls = [{"type": "object", "description": t["description"],
              "properties": {"type": {"const": "call_tool"}, "tool_name": {"const": t["name"]},
                             "arguments": t["inputSchema"]},
              "required": ["type", "tool_name", "arguments"]} for t in mcp_tools(env)]
    others = [{"type": "object", "properties": {"type": {"const": "list_tools"}}, "required": ["type"]},
              {"type": "object", "properties": {"type": {"const": "send_message"},
                                                "content": {"type": "string", "minLength": 1}},
               "required": ["type", "content"], "description": "conversation mode: a message to the user"},
              {"type": "object", "properties": {"type": {"const": "end_turn"}, "content": {"type": "string"}},
               "required": ["type"], "description": "turn-based scenarios: end the turn in progress"}]
    return {"action": {"oneOf": calls + others}, "observation": OBSERVATION_SCHEMA, "state": STATE_SCHEMA,
            "reset_observation": OBSERVATION_SCHEMA}


@router.get("/metadata")
async def metadata(request: Request, env_id: str, who: Principal = Run) -> dict[str, Any]:
    episodes = _episodes(request, env_id, who)
    env = await episodes.environment()
    return {"name": env.env_id, "description": env.summary or env.introduction, "readme_content": env.introduction,
            "version": "1.0.0", "rules": env.rules, "tools": mcp_tools(env),
            "scenarios": [{"scenario_id": s.scenario_id, "task": s.task} for s in await episodes.scenarios()]}


@router.get("/health")
async def health(request: Request, env_id: str, who: Principal = Run) -> dict[str, str]:
    await _episodes(request, env_id, who).environment()
    return {"status": "healthy"}


def _operation(summary: str) -> dict[str, Any]:
    return {"summary": summary, "responses": {"200": {"description": "OK"}}}


@router.get("/openapi.json")
async def openapi(request: Request, env_id: str, who: Principal = Run) -> dict[str, Any]:
    """The endpoints at this base URL, for OpenEnv's tools (``openenv validate --url``) that read them."""
    env = await _episodes(request, env_id, who).environment()
    return {"openapi": "3.1.0", "info": {"title": f"envfoundry {env.env_id} (OpenEnv protocol)", "version": "1.0.0"},
            "paths": {"/reset": {"post": _operation("Open an episode, or continue one by episode_id")},
                      "/step": {"post": _operation("Apply an action to an episode")},
                      "/state": {"get": _operation("An episode's state")},
                      "/schema": {"get": _operation("Action, observation and state schemas")},
                      "/metadata": {"get": _operation("The environment, its tools and scenarios")},
                      "/health": {"get": _operation("Health")},
                      "/mcp": {"post": _operation("MCP JSON-RPC")}}}


@router.post("/mcp")
async def mcp(request: Request, env_id: str, who: Principal = Run) -> dict[str, Any]:
    body = await request.body()
    try:
        message = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return openenv_rpc.rpc_error(None, -32700, "parse error: the body is not JSON")
    if found := non_finite(body):  # (a body not sent as JSON passes the middleware's check)
        return openenv_rpc.rpc_error(None, -32700, f"parse error: {found[0]}: {found[1]} is not a JSON number")
    return await openenv_rpc.answer(_episodes(request, env_id, who), message)


# -- the WebSocket ------------------------------------------------------------------------------
@dataclass
class Connection:
    """What one WebSocket holds: its current episode, and whether this connection opened it."""

    episodes: Episodes
    orphans: Orphans
    current: str | None = None
    owned: bool = False

    def hold(self, episode_id: str, owned: bool) -> None:
        self.current, self.owned = episode_id, owned
        self.orphans.attach(episode_id)


async def _handle(conn: Connection, message: Any) -> dict[str, Any] | None:
    """The reply to one message (None for ``close``).

    Raises:
        ServiceError: rendered as an ``error`` message by the caller.
    """
    if not isinstance(message, dict):
        raise InvalidRequest("a message is a JSON object with a type", field="type")
    kind = message.get("type")
    data = message.get("data", {})
    episodes = conn.episodes
    if kind == "reset":
        if not isinstance(data, dict):
            raise InvalidRequest("reset data must be an object", field="data")
        opened = await episodes.reset(data, conn.current, conn.owned)
        if opened.session_id != conn.current:
            await _release(conn)  # the episode it replaces (if this connection opened it)
            # Opened here, or taken over by its episode_id after a reconnect: this connection ends it.
            conn.hold(opened.session_id, owned=True)
        return {"type": "observation", "data": opened.payload}
    if kind == "step":
        key = checked_key(message.get("request_id"), "request_id")
        return {"type": "observation", "data": await episodes.step(_held(conn), data, key)}
    if kind == "state":
        return {"type": "state", "data": await episodes.state(_held(conn))}
    if kind == "mcp":
        return {"type": "mcp", "data": await openenv_rpc.answer(episodes, data, conn.current)}
    if kind == "close":
        await _release(conn)
        return None
    raise InvalidRequest("type must be one of reset, step, state, mcp, close", field="type")


def _held(conn: Connection) -> str:
    if conn.current is None:
        raise InvalidRequest("no episode yet: send a reset first", field="type")
    return conn.current


async def _release(conn: Connection) -> None:
    """End the episode this connection opened (one it was bound to stays: its opener ends it)."""
    if conn.current is not None:
        conn.orphans.detach(conn.current)
        if conn.owned:
            await conn.episodes.end(conn.current)
    conn.current, conn.owned = None, False


def _dropped(conn: Connection) -> None:
    """The connection ended without a ``close``: the episode it opened ends after the grace period,
    unless a client takes it up again (see ``openenv_orphans``)."""
    if conn.current is not None:
        conn.orphans.detach(conn.current)
        if conn.owned:
            conn.orphans.dropped(conn.episodes, conn.current)
    conn.current, conn.owned = None, False


def _error(exc: ServiceError) -> dict[str, Any]:
    return {"type": "error", "data": {"message": exc.detail, "code": openenv_code(exc), "problem": problem_body(exc)}}


def _parsed(text: str, max_bytes: int, max_values: int) -> Any:
    """Raises LimitExceeded, InvalidRequest: the message is over a body bound, not JSON, or holds
    NaN or Infinity (which Python's parser would take, as REST bodies are checked for)."""
    if len(text.encode()) > max_bytes:
        raise LimitExceeded(f"message exceeds the {max_bytes} byte limit", limit="max_body_bytes", value=max_bytes)
    if text.count(",") >= max_values:
        raise LimitExceeded(f"message holds more than {max_values} JSON values", limit="max_body_values",
                            value=max_values)
    try:
        message = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"the message is not JSON: {exc}", field="type") from None
    if found := non_finite(text.encode()):
        where, word = found
        raise InvalidRequest(f"{where}: {word} is not a JSON number (JSON has no NaN or Infinity)", field=where)
    return message


async def websocket_endpoint(websocket: WebSocket, env_id: str) -> None:
    state = websocket.app.state
    started = time.perf_counter()
    tenant = "-"
    try:
        # Before accepting: a refused upgrade is answered and its connection closed at once.
        who = state.keys.authenticate(websocket.headers.get("authorization"), "run")
        tenant = who.tenant
        held = state.sockets.claim(who.tenant if state.keys.enabled else _address(websocket))
    except ServiceError as exc:
        _observe(state.metrics, "connect", str(exc.status), time.perf_counter() - started, tenant, None)
        await _deny(websocket, exc)
        return
    try:
        await websocket.accept()
        await _serve(websocket, env_id, who, held)
    finally:
        state.sockets.release(held)


def _address(websocket: WebSocket) -> str:
    """Without API keys every client is one tenant: its sockets are capped per address instead."""
    return websocket.client.host if websocket.client else ""


async def _deny(websocket: WebSocket, exc: ServiceError) -> None:
    """Answer the upgrade request with the problem REST would answer (401, 403, 429 or 503)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(problems.error_response(exc, websocket.url.path))
    else:
        await websocket.close(1008)  # a server without the denial extension answers a bare 403


async def _serve(websocket: WebSocket, env_id: str, who: Principal, held: Socket) -> None:
    state = websocket.app.state
    try:
        conn = Connection(Episodes(state.sessions, env_id, who.tenant), state.orphans)
        await conn.episodes.environment()
        bound = websocket.query_params.get("session_id")
        if bound:
            await conn.episodes.episode(bound)
            conn.hold(bound, owned=False)
    except ServiceError as exc:
        refusal = _error(exc)
        refusal["data"]["code"] = "SESSION_ERROR"  # no session could start on this connection
        await websocket.send_text(json.dumps(refusal))
        await websocket.close(1008)
        return
    settings = state.settings
    try:
        await _converse(websocket, conn, who, held, settings)
    finally:
        _dropped(conn)  # (nothing left after a close message)


async def _converse(websocket: WebSocket, conn: Connection, who: Principal, held: Socket, settings: Any) -> None:
    state = websocket.app.state
    while True:
        try:
            received = await state.sockets.receive(held, websocket.receive)
        except Closing as closing:  # idle too long, or its connection is needed: the episode waits out the grace
            with contextlib.suppress(WebSocketDisconnect):
                await websocket.close(closing.code, closing.reason)
            return
        if received["type"] == "websocket.disconnect":
            return  # the episode waits a grace period for a reconnect
        started = time.perf_counter()
        kind: Any = "-"
        reply: dict[str, Any] | None
        try:
            message = _parsed(received.get("text") or (received.get("bytes") or b"").decode("utf-8", "replace"),
                              settings.max_body_bytes, settings.max_body_values)
            kind = message.get("type") if isinstance(message, dict) else "-"
            kind = kind if kind in MESSAGE_TYPES else "-"  # a label value, so never the client's free text
            reply = await _handle(conn, message)
            status = "ok"
        except ServiceError as exc:
            reply, status = _error(exc), str(exc.status)
        _observe(state.metrics, kind, status, time.perf_counter() - started, who.tenant, conn.current)
        if reply is None:
            await websocket.close()
            return
        try:
            await websocket.send_text(json.dumps(reply))
        except WebSocketDisconnect:
            return


def _observe(metrics: Any, kind: str, status: str, elapsed: float, tenant: str, session: str | None) -> None:
    route = f"{WS_ROUTE} {kind}"
    metrics.requests.labels("WS", route, status).inc()
    metrics.latency.labels("WS", route).observe(elapsed)
    log.info("WS %s %s", route, status, extra={"route": route, "method": "WS", "status": status,
                                              "duration_ms": round(elapsed * 1000, 3), "tenant": tenant or "-",
                                              "session": session})


def mount(app: FastAPI) -> None:
    app.include_router(router)
    app.add_api_websocket_route(WS_ROUTE, websocket_endpoint)
