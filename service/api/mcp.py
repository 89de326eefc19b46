"""Sessions as Model Context Protocol servers, mounted in the REST app.

    /v1/sessions/{session_id}/mcp   one session: its tools are the environment's tools
    /v1/mcp                         the service: list scenarios, create a session, call a tool in it, score it

Both speak Streamable HTTP through the official SDK, in its stateless mode with JSON responses.
Stateless because a session already lives in the store, not in this process: an MCP connection
keeps nothing here, so any replica answers any request (no sticky routing), a restart drops no
MCP session, and there is no second idle timeout to keep in line with the session TTL. JSON
responses because every answer is a single result; nothing is streamed.

A ``tools/call`` goes through ``Sessions.call``, the method behind ``POST .../calls``: the same
sandbox, trajectory, lock and atomic commit, and the same idempotency: a key given as
``_meta["envfoundry/idempotency-key"]`` or as the request's ``Idempotency-Key`` header makes a
retry answer the first attempt's step (``_meta["envfoundry/replayed"]`` is then true). Tool
failures (``ok: false``) are tool results with ``isError`` and the call record as
``structuredContent``, so ``error.type`` is the one REST answers. Service errors (unknown session, busy, unavailable) are JSON-RPC errors whose ``data``
is the problem+json body REST would send; the connection stays usable after either.

Both endpoints take the API key REST takes (``Authorization: Bearer``, scope ``run``) and see
only the key's tenant: a request without a valid key is refused over HTTP with the same 401/403
problem before the MCP transport reads it, and another tenant's session is not found.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from contextvars import ContextVar
from typing import Any

import anyio.lowlevel
import mcp_types as types
from fastapi import FastAPI
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.subscriptions import ListenHandler
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ServerEvent, ToolsListChanged
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sandbox.wire.answers import ToolError
from service.api import calls
from service.api.auth import Principal
from service.api.broadcast import between_replicas
from service.api.problems import problem_body, problem_response, rpc_code
from service.api.schemas import MAX_SEED
from service.api.views import created_body
from service.catalog.arguments import ArgumentChecker, ArgumentLimit
from service.catalog.model import LABEL_PATTERN, MAX_TAGS
from service.catalog.scenario_index import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    check_limit,
    decode_cursor,
    encode_cursor,
    scenario_query,
)
from service.engine import idempotency
from service.engine.calls import Applied
from service.engine.sessions import Sessions
from service.errors import InvalidRequest, ServiceError

SESSION_PATH = "/v1/sessions/{session_id}/mcp"
SERVICE_PATH = "/v1/mcp"
KEY_META = "envfoundry/idempotency-key"
REPLAYED_META = "envfoundry/replayed"
PRINCIPAL = "envfoundry.principal"
Handler = Callable[[Sessions, dict[str, Any], str], Awaitable[Any]]


def service_error(exc: ServiceError) -> MCPError:
    """The JSON-RPC error for a service error; ``data`` is the problem body REST answers with."""
    return MCPError(code=rpc_code(exc), message=exc.detail, data=problem_body(exc))


def call_result(applied: Applied) -> types.CallToolResult:
    """A call record as an MCP tool result: the observation as text, the record as structured content."""
    record = applied.record
    view = calls.view(applied)
    result = types.CallToolResult(content=[types.TextContent(type="text", text=record["observation"])],
                                  structured_content=view, is_error=not record["ok"])
    if applied.replayed:
        result.meta = {REPLAYED_META: True}
    return result


def idempotency_key(params: types.CallToolRequestParams, request: Request) -> str | None:
    """The call's key: from ``_meta`` (per call), else from the HTTP header (per request).

    Raises:
        InvalidRequest: the key is not 1 to 255 printable ASCII characters.
    """
    meta: Any = params.meta or {}
    key = meta.get(KEY_META) if isinstance(meta, dict) else None
    if key is None:
        key = request.headers.get(idempotency.HEADER)
    return calls.checked_key(key)


def _engine(ctx: Any) -> Sessions:
    return ctx.request.app.state.sessions  # type: ignore[no-any-return]


def _tenant(ctx: Any) -> str:
    """The tenant the endpoint authenticated for this HTTP request (see ``_Endpoint``)."""
    principal: Principal = ctx.request.scope[PRINCIPAL]
    return principal.tenant


def _session_id(ctx: Any) -> str:
    request: Request = ctx.request
    return str(request.path_params["session_id"])


# -- one session ----------------------------------------------------------------------------
async def _list_session_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    engine = _engine(ctx)
    try:
        snap = await engine.snapshot(_session_id(ctx), tenant=_tenant(ctx), blobs=False)
        env = await engine.environment_of(snap)
        tools = [_mcp_tool(t["function"]) for t in await engine.turns.tools(snap, env)]
        if await engine.turns.scenario(snap) is not None and env.tool(END_TURN) is None:
            tools.append(_END_TURN_TOOL)  # (an environment's own tool of that name wins)
    except ServiceError as exc:
        raise service_error(exc) from exc
    return types.ListToolsResult(tools=tools)


# A turn-based session's MCP server offers one tool more: the agent ends its turn with it, and its
# answer is the next user message (the tools that arrive with it are then in tools/list).
END_TURN = "end_turn"
_END_TURN_TOOL = types.Tool(
    name=END_TURN, description="End your turn: you have done what the user asked in this turn (or cannot). The "
    "answer is the user's next message and the tools that become available with it, or that every turn has ended.",
    input_schema={"type": "object", "properties": {"content": {
        "type": "string", "description": "Your closing message to the user for this turn, if any."}},
        "additionalProperties": False})


async def _end_turn(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult | None:
    """``end_turn`` on a turn-based session (None: not one, or its environment has a tool of that name)."""
    engine = _engine(ctx)
    snap = await engine.snapshot(_session_id(ctx), tenant=_tenant(ctx), blobs=False)
    if await engine.turns.scenario(snap) is None or (await engine.environment_of(snap)).tool(END_TURN) is not None:
        return None
    content = (params.arguments or {}).get("content")
    if content is not None and not isinstance(content, str):
        raise InvalidRequest("end_turn: content must be a string", field="content")
    answer, replayed = await engine.turns.end(_session_id(ctx), content, key=idempotency_key(params, ctx.request),
                                              tenant=_tenant(ctx))
    return _turn_result(answer, replayed)


def _turn_result(answer: dict[str, Any], replayed: bool = False) -> types.CallToolResult:
    text = "Every turn has ended." if answer["done"] else str(answer["user_message"])
    result = types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=answer)
    if replayed:
        result.meta = {REPLAYED_META: True}
    return result


def _mcp_tool(function: dict[str, Any]) -> types.Tool:
    return types.Tool(name=function["name"], description=function.get("description"),
                      input_schema=function.get("parameters") or {"type": "object", "properties": {}})


async def _call_session_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    try:
        if params.name == END_TURN:
            ended = await _end_turn(ctx, params)
            if ended is not None:
                return ended
        key = idempotency_key(params, ctx.request)
        applied = await calls.run(_engine(ctx), calls.CallRequest(_session_id(ctx), params.name, params.arguments or {},
                                                               key, _tenant(ctx)))
    except ServiceError as exc:
        raise service_error(exc) from exc
    return call_result(applied)


# Which session a ``subscriptions/listen`` stream is opened for, while the SDK's handler subscribes it.
_LISTENING: ContextVar[str] = ContextVar("envfoundry_mcp_listening")


class SessionEvents:
    """The SDK's subscription bus, per session: a listen stream opened on a session's endpoint hears that
    its tools changed (a turn that brought tools ended) in this replica, and with a Redis store in any
    replica (``service.api.broadcast`` relays it); ``tools/list`` is right on every one regardless."""

    def __init__(self) -> None:
        self._listeners: dict[str, dict[object, Callable[[ServerEvent], None]]] = {}

    async def publish(self, event: ServerEvent) -> None:
        await anyio.lowlevel.checkpoint()  # (nothing is published to every session at once)

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        session_id, token = _LISTENING.get(), object()
        self._listeners.setdefault(session_id, {})[token] = listener

        def unsubscribe() -> None:
            listeners = self._listeners.get(session_id, {})
            listeners.pop(token, None)
            if not listeners:
                self._listeners.pop(session_id, None)

        return unsubscribe

    def tools_changed(self, session_id: str) -> None:
        for listener in list(self._listeners.get(session_id, {}).values()):
            listener(ToolsListChanged())


def session_server(events: SessionEvents | None = None) -> Server[Any]:
    listen = ListenHandler(events or SessionEvents())

    async def on_listen(ctx: Any, params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
        engine = _engine(ctx)
        try:  # the session must be the caller's, as for every other request
            await engine.snapshot(_session_id(ctx), tenant=_tenant(ctx), blobs=False)
        except ServiceError as exc:
            raise service_error(exc) from exc
        token = _LISTENING.set(_session_id(ctx))
        try:
            return await listen(ctx, params)
        finally:
            _LISTENING.reset(token)

    return Server("envfoundry-session", version="1.0.0",
                  instructions="The tools of one envfoundry session; every call changes that session's state.",
                  on_list_tools=_list_session_tools, on_call_tool=_call_session_tool, on_subscriptions_listen=on_listen)


# -- the service ----------------------------------------------------------------------------
async def _list_scenarios(engine: Sessions, args: dict[str, Any], tenant: str) -> dict[str, Any]:
    tags = args.get("tag", [])
    if not isinstance(tags, list):
        raise InvalidRequest("tag must be a list of strings", field="tag")
    query = scenario_query(args.get("env_id"), args.get("split"), tags)
    limit = check_limit(args.get("limit", DEFAULT_LIMIT))
    after = decode_cursor(query, args["cursor"]) if args.get("cursor") is not None else None
    found = await engine.registry.scenario_page(query, after, limit, tenant)
    return {"scenarios": [{"scenario_id": s.scenario_id, "env_id": s.env_id, "task": s.task, "split": s.split,
                           "tags": list(s.tags)} for s in found.scenarios],
            "total": found.total, "next_cursor": None if found.last is None else encode_cursor(query, found.last)}


async def _create_session(engine: Sessions, args: dict[str, Any], tenant: str) -> dict[str, Any]:
    # The same rule as the REST body, said here because agents read a plain object schema best.
    if ("scenario_id" in args) == ("env_id" in args):
        raise InvalidRequest("give exactly one of scenario_id or env_id", field="scenario_id")
    if "scenario_id" in args and "init_config" in args:
        raise InvalidRequest("init_config goes with env_id; a scenario brings its own", field="init_config")
    return created_body(await engine.create(args.get("scenario_id"), args.get("env_id"), args.get("init_config"),
                                            mode=args.get("mode", "task"), tenant=tenant, seed=args.get("seed")))


async def _call(engine: Sessions, args: dict[str, Any], tenant: str) -> Applied:
    return await calls.run(engine, calls.CallRequest(args["session_id"], args["name"], args.get("arguments", {}),
                                                  calls.checked_key(args.get("idempotency_key"), "idempotency_key"),
                                                  tenant))


async def _message(engine: Sessions, args: dict[str, Any], tenant: str) -> dict[str, Any]:
    applied = await engine.message(args["session_id"], args["content"], key=args.get("idempotency_key"),
                                   tenant=tenant)
    return {k: applied.record[k] for k in ("step", "reply", "done")}


async def _turn(engine: Sessions, args: dict[str, Any], tenant: str) -> dict[str, Any]:
    answer, _ = await engine.turns.end(args["session_id"], args.get("content"), key=args.get("idempotency_key"),
                                       tenant=tenant)
    return answer


async def _score(engine: Sessions, args: dict[str, Any], tenant: str) -> dict[str, Any]:
    return await engine.score(args["session_id"], tenant=tenant)


_ID = {"type": "string", "minLength": 1}
_KEY = {"type": "string", "pattern": idempotency.KEY_PATTERN,
        "description": "Optional: a retry with the same key answers the first attempt and applies nothing twice."}
SERVICE_TOOLS: dict[str, tuple[str, dict[str, Any], Handler]] = {
    "list_scenarios": (
        "List the scenarios (id, environment, task, split, tags) by id, a page at a time, optionally of one "
        "environment, one split and carrying every tag given. Answers {scenarios, total, next_cursor}: pass "
        "next_cursor as cursor for the next page (null on the last).",
        {"type": "object", "properties": {
            "env_id": _ID, "split": {"type": "string", "pattern": LABEL_PATTERN},
            "tag": {"type": "array", "items": {"type": "string", "pattern": LABEL_PATTERN}, "maxItems": MAX_TAGS},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
            "cursor": {"type": "string", "maxLength": 512}},
         "additionalProperties": False},
        _list_scenarios),
    "create_session": (
        "Start a session from a scenario (scenario_id) or from an environment (env_id, optional init_config). "
        "Answers the session id, the task, the rules and the tools (OpenAI function schemas). With mode "
        "'conversation' a simulated user holds the task: talk to it with send_message. With seed, every draw "
        "the environment makes is reproducible.",
        {"type": "object", "properties": {"scenario_id": _ID, "env_id": _ID, "init_config": {"type": "object"},
                                          "mode": {"enum": ["task", "conversation"]},
                                          "seed": {"type": "integer", "minimum": 0, "maximum": MAX_SEED}},
         "additionalProperties": False},
        _create_session),
    "call_tool": (
        "Call one of a session's tools. Answers {step, ok, result, error, observation}; a failed call "
        "changes nothing and says why in error.type and error.message.",
        {"type": "object", "properties": {"session_id": _ID, "name": {"type": "string"},
                                          "arguments": {"type": ["object", "string"]}, "idempotency_key": _KEY},
         "required": ["session_id", "name"], "additionalProperties": False},
        _call),
    "send_message": (
        "Conversation mode: say something to the simulated user. Answers {step, reply, done}; done means the "
        "user ended the conversation.",
        {"type": "object", "properties": {"session_id": _ID, "content": {"type": "string", "minLength": 1},
                                          "idempotency_key": _KEY},
         "required": ["session_id", "content"], "additionalProperties": False},
        _message),
    "end_turn": (
        "Turn-based scenarios: end the turn in progress (its checks run then). Answers {step, ended_turn, turn, "
        "turns, done, user_message, new_tools}: the user's next message and the tools that arrive with it, or done "
        "after the last turn.",
        {"type": "object", "properties": {"session_id": _ID, "content": {"type": "string"}, "idempotency_key": _KEY},
         "required": ["session_id"], "additionalProperties": False},
        _turn),
    "score_session": (
        "Score a session against its scenario's checks: {reward, passed, total, checks}; turn-based, also each "
        "turn's checks. The session goes on.",
        {"type": "object", "properties": {"session_id": _ID}, "required": ["session_id"],
         "additionalProperties": False},
        _score),
}
_CHECKERS = {name: ArgumentChecker(schema) for name, (_, schema, _) in SERVICE_TOOLS.items()}


async def _list_service_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[types.Tool(name=name, description=text, input_schema=schema)
                                        for name, (text, schema, _) in SERVICE_TOOLS.items()])


async def _call_service_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    """Failures are tool results here: the agent chose the ids, so it should read why and go on."""
    tool = SERVICE_TOOLS.get(params.name)
    if tool is None:
        return _failure(ToolError.UNKNOWN_TOOL, f"unknown tool '{params.name}'; available tools: {', '.join(SERVICE_TOOLS)}")
    arguments = params.arguments or {}
    try:
        wrong = _CHECKERS[params.name].problem(arguments)
    except ArgumentLimit as exc:
        wrong = str(exc)
    if wrong is not None:
        return _failure(ToolError.INVALID_ARGUMENTS, f"{params.name}: {wrong}")
    try:
        answer = await tool[2](_engine(ctx), arguments, _tenant(ctx))
    except ServiceError as exc:
        problem = problem_body(exc)
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"Error ({problem['type']}): "
                                                                                 f"{exc.detail}")],
                                    structured_content={"problem": problem}, is_error=True)
    if isinstance(answer, Applied):
        return call_result(answer)
    return types.CallToolResult(content=[types.TextContent(type="text", text=_json(answer))],
                                structured_content=answer)


def _failure(kind: str, message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"Error ({kind}): {message}")],
                                structured_content={"error": {"type": kind, "message": message}}, is_error=True)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def service_server() -> Server[Any]:
    return Server("envfoundry", version="1.0.0",
                  instructions="Run whole episodes: list_scenarios, create_session, call_tool (or send_message in "
                               "conversation mode; end_turn in a turn-based one), score_session.",
                  on_list_tools=_list_service_tools, on_call_tool=_call_service_tool)


# -- mounting -------------------------------------------------------------------------------
class _Endpoint:
    """Authenticates a request as REST does, then hands it to the manager the app's lifespan started."""

    def __init__(self, name: str, path: str) -> None:
        self.name = name
        self.route = Route(path, self)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope["app"].state
        # FastAPI's own routes leave themselves here; the access log and metrics label requests by it.
        scope["route"] = self.route
        request = Request(scope)
        try:
            scope[PRINCIPAL] = principal = state.keys.authenticate(request.headers.get("authorization"), "run")
            request.state.tenant = principal.tenant or "-"  # for the access log, as the REST routes do
        except ServiceError as exc:
            await problem_response(exc.status, exc.slug, exc.title, exc.detail, scope.get("path"),
                                   **exc.extra)(scope, receive, send)
            return
        manager: StreamableHTTPSessionManager = getattr(state, self.name)
        await manager.handle_request(scope, receive, send)


def mount(app: FastAPI) -> None:
    """Add the MCP routes; they are outside the OpenAPI document (JSON-RPC, not REST)."""
    app.router.routes.append(_Endpoint("mcp_session", SESSION_PATH).route)
    app.router.routes.append(_Endpoint("mcp_service", SERVICE_PATH).route)


class ClientErrorLog(logging.Filter):
    """Keeps the SDK's log about what the server did, not what a client asked for.

    Before a ``tools/call`` the SDK runs our ``tools/list`` handler to check ``Mcp-Param-*``
    headers, and logs any failure at error level with a traceback. A session that is gone, busy
    or another tenant's is the client's problem, answered as a JSON-RPC error: it becomes one
    info line naming the problem. Each manager's "session manager started" line is dropped:
    ``serving`` says once that both endpoints are up. An unavailable store (5xx) stays an error.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "mcp.server.streamable_http_manager" and record.msg == "StreamableHTTP session manager started":
            return False
        error = record.exc_info[1] if record.exc_info else None
        problem = error.data if isinstance(error, MCPError) else None
        if isinstance(problem, dict) and isinstance(problem.get("status"), int) and problem["status"] < 500:
            if not logging.getLogger(record.name).isEnabledFor(logging.INFO):
                return False
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "%s: %s (%s)", (record.getMessage(), problem.get("type"), problem.get("detail"))
            record.exc_info, record.exc_text = None, None
        return True


def _quiet_client_errors() -> None:
    for name in ("mcp.server._streamable_http_modern", "mcp.server.streamable_http_manager"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, ClientErrorLog) for f in logger.filters):
            logger.addFilter(ClientErrorLog())


@asynccontextmanager
async def serving(app: FastAPI, max_body_bytes: int) -> AsyncIterator[None]:
    """Run both MCP managers for the app's lifetime (enter inside the app's lifespan)."""
    _quiet_client_errors()
    async with AsyncExitStack() as stack:
        events = SessionEvents()
        app.state.sessions.turns.tools_changed.append(events.tools_changed)
        others = between_replicas(app.state.store, events.tools_changed)
        if others is not None:  # streams held by other replicas hear it too
            await stack.enter_async_context(others.running())
            app.state.sessions.turns.tools_changed.append(others.publish)
        for name, server in (("mcp_session", session_server(events)), ("mcp_service", service_server())):
            manager = StreamableHTTPSessionManager(server, json_response=True, stateless=True,
                                                   max_request_body_size=max_body_bytes)
            await stack.enter_async_context(manager.run())
            setattr(app.state, name, manager)
        logging.getLogger("envfoundry.mcp").info("MCP endpoints ready: %s and %s", SESSION_PATH, SERVICE_PATH)
        yield
