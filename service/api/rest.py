"""REST API v1 routes. Handlers translate wire models to engine calls and back; nothing more."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.api import calls, schemas
from service.api.auth import Principal
from service.api.problems import MEDIA_TYPE
from service.api.scopes import Admin, Run
from service.api.views import created_body
from service.catalog.model import LABEL_PATTERN, MAX_TAGS, CatalogError, Scenario, ToolCall, Turn, new_scenario_id
from service.catalog.model import CheckItem as CatalogCheck
from service.catalog.registry import Registry
from service.catalog.scenario_index import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    ScenarioQuery,
    decode_cursor,
    encode_cursor,
    scenario_query,
)
from service.catalog.versions import check_label
from service.engine import idempotency, turns
from service.engine.calls import Applied
from service.engine.creation import Created
from service.engine.sessions import Sessions
from service.errors import InvalidEnvironment, InvalidRequest, Unavailable
from service.observability import Metrics
from service.stores.store import Snapshot, StoreError

PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.Problem, "content": {MEDIA_TYPE: {}}, "description": text}
    for status, text in {401: "Unauthorized", 403: "Forbidden", 404: "Not found", 409: "Conflict",
                         413: "Payload too large", 422: "Invalid request", 429: "Quota exceeded",
                         502: "Upstream failed", 503: "Unavailable"}.items()
}
# Trajectory pages: large enough for whole RL episodes, small enough to bound one response.
MAX_PAGE = 1000

IdempotencyKey = Header(default=None, alias=idempotency.HEADER, pattern=idempotency.KEY_PATTERN,
                        description="Retries with the same key and body return the first answer and apply "
                                    "nothing twice.")

router = APIRouter(responses=PROBLEMS)


async def sessions(request: Request) -> Sessions:
    return request.app.state.sessions  # type: ignore[no-any-return]


async def registry(request: Request) -> Registry:
    return request.app.state.registry  # type: ignore[no-any-return]


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


@router.get("/healthz", response_model=schemas.Health, tags=["service"])
async def healthz() -> schemas.Health:
    """Liveness: the process answers."""
    return schemas.Health(status="ok")


@router.get("/readyz", response_model=schemas.Health, tags=["service"])
async def readyz(request: Request) -> schemas.Health:
    """Readiness: the session store answers and the sandbox pool has a live worker (503 otherwise)."""
    engine: Sessions = request.app.state.sessions
    try:
        await asyncio.wait_for(engine.store.ping(), 2.0)
    except (StoreError, TimeoutError) as exc:
        raise Unavailable(f"the session store does not answer: {exc}") from None
    pool = engine.pool
    if pool.size - pool.starting <= 0:
        raise Unavailable("no sandbox worker is running; they are being restarted")
    return schemas.Health(status="ready")


@router.get("/metrics", tags=["service"], response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this replica."""
    registry: Metrics = request.app.state.metrics
    registry.observe_pool(request.app.state.pool)
    registry.websockets.set(request.app.state.sockets.open)
    return Response(generate_latest(registry.registry), media_type=CONTENT_TYPE_LATEST)


# -- environments ---------------------------------------------------------------------------
@router.get("/v1/environments", response_model=schemas.EnvironmentList, tags=["environments"])
async def list_environments(who: Principal = Run, reg: Registry = Depends(registry)) -> schemas.EnvironmentList:
    envs = await reg.environments(who.tenant)
    counts = await reg.scenario_counts(who.tenant)
    return schemas.EnvironmentList(environments=[
        schemas.EnvironmentSummary(env_id=e.env_id, class_name=e.class_name, summary=e.summary,
                                   tool_count=len(e.tools), scenario_count=counts.get(e.env_id, 0))
        for e in envs
    ])


def _env_detail(env: Any) -> schemas.EnvironmentDetail:
    return schemas.EnvironmentDetail(env_id=env.env_id, class_name=env.class_name, summary=env.summary,
                                     introduction=env.introduction, rules=env.rules, tools=env.tools,
                                     source=env.code, provenance=env.provenance, requirements=env.requirements,
                                     version=env.version, label=env.label or None)


@router.get("/v1/environments/{env_id}", response_model=schemas.EnvironmentDetail, tags=["environments"])
async def get_environment(env_id: str, who: Principal = Run,
                          reg: Registry = Depends(registry)) -> schemas.EnvironmentDetail:
    return _env_detail(await reg.environment(env_id, who.tenant))


@router.get("/v1/catalog/manifest", response_model=schemas.CatalogManifest, tags=["environments"])
async def catalog_manifest(request: Request, who: Principal = Run) -> schemas.CatalogManifest:
    """The version of everything the loaded catalogs serve (what API tenants added is not part of it)."""
    return schemas.CatalogManifest.model_validate(request.app.state.manifest)


@router.get("/v1/environments/{env_id}/versions", response_model=schemas.EnvironmentVersions, tags=["environments"])
async def list_environment_versions(env_id: str, who: Principal = Run,
                                    reg: Registry = Depends(registry)) -> schemas.EnvironmentVersions:
    """Every version of the environment this tenant sees, oldest first, with what changed in its tools."""
    versions = await reg.version_list(env_id, who.tenant)
    return schemas.EnvironmentVersions.model_validate({"env_id": env_id, "versions": versions})


@router.post("/v1/environments", status_code=201, response_model=schemas.EnvironmentDetail, tags=["environments"])
async def create_environment(body: schemas.EnvironmentCreate, request: Request, who: Principal = Admin,
                             reg: Registry = Depends(registry)) -> schemas.EnvironmentDetail:
    check_label(body.label)
    try:
        # Static analysis of up to 1 MiB of code, in a bounded child process.
        env = await request.app.state.analysis.environment(
            env_id=body.env_id, class_name=body.class_name, code=body.code, summary=body.summary,
            introduction=body.introduction, rules=body.rules, tenant=who.tenant, requirements=body.requirements)
    except CatalogError as exc:
        raise InvalidEnvironment(f"{exc.reason}: {exc.message}", reason=exc.reason, field="code") from exc
    return _env_detail(await reg.add_environment(env, who.tenant, body.label))


@router.delete("/v1/environments/{env_id}", status_code=204, response_class=Response, tags=["environments"])
async def delete_environment(env_id: str, who: Principal = Admin, reg: Registry = Depends(registry)) -> Response:
    """Remove an environment this tenant added; its sessions answer 404 from then on."""
    await reg.delete("environments", env_id, who.tenant)
    return Response(status_code=204)


# -- scenarios ------------------------------------------------------------------------------
SplitFilter = Query(default=None, pattern=LABEL_PATTERN, description="Only scenarios of this split.")
TagFilter = Query(default=[], description=f"Only scenarios carrying this tag; repeat for all of several (at most "
                  f"{MAX_TAGS}).")
CursorParam = Query(default=None, max_length=512, description="The `next_cursor` of the previous page.")


def _limit(default: int) -> Any:
    return Query(default=default, ge=1, le=MAX_LIMIT, description=f"Scenarios per page, 1 to {MAX_LIMIT}.")


async def _scenario_list(request: Request, reg: Registry, tenant: str, query: ScenarioQuery, limit: int,
                         cursor: str | None) -> schemas.ScenarioList:
    after = None if cursor is None else decode_cursor(query, cursor)
    found = await reg.scenario_page(query, after, limit, tenant)
    next_cursor = None if found.last is None else encode_cursor(query, found.last)
    link = None
    if next_cursor is not None:
        params = [(k, v) for k, v in request.query_params.multi_items() if k != "cursor"]
        link = f"{request.url.path}?{urlencode([*params, ('cursor', next_cursor)])}"
    return schemas.ScenarioList(
        scenarios=[schemas.ScenarioSummary(scenario_id=s.scenario_id, env_id=s.env_id, task=s.task, split=s.split,
                                           tags=list(s.tags)) for s in found.scenarios],
        total=found.total, next_cursor=next_cursor, next=link)


@router.get("/v1/scenarios", response_model=schemas.ScenarioList, tags=["scenarios"])
async def find_scenarios(request: Request,
                         env: str | None = Query(default=None, max_length=128, description="Only this environment's."),
                         split: str | None = SplitFilter, tag: list[str] = TagFilter,
                         limit: int = _limit(DEFAULT_LIMIT), cursor: str | None = CursorParam,
                         who: Principal = Run, reg: Registry = Depends(registry)) -> schemas.ScenarioList:
    """The scenarios this tenant sees (the loaded catalogs' and its own), by id, filtered and a page at a time."""
    return await _scenario_list(request, reg, who.tenant, scenario_query(env, split, tag), limit, cursor)


@router.get("/v1/environments/{env_id}/scenarios", response_model=schemas.ScenarioList, tags=["scenarios"])
async def list_scenarios(env_id: str, request: Request, split: str | None = SplitFilter, tag: list[str] = TagFilter,
                         limit: int = _limit(MAX_LIMIT), cursor: str | None = CursorParam, who: Principal = Run,
                         reg: Registry = Depends(registry)) -> schemas.ScenarioList:
    """One environment's scenarios, by id; as GET /v1/scenarios?env=env_id. Without `limit`, pages are as large as
    they may be, so a client written before paging gets every scenario of an environment of up to that many."""
    return await _scenario_list(request, reg, who.tenant, scenario_query(env_id, split, tag), limit, cursor)


def _scenario_detail(s: Scenario) -> schemas.ScenarioDetail:
    return schemas.ScenarioDetail.model_validate({**s.to_json(), "version": s.version, "label": s.label or None})


@router.get("/v1/scenarios/{scenario_id}", response_model=schemas.ScenarioDetail, tags=["scenarios"])
async def get_scenario(scenario_id: str, who: Principal = Run,
                       reg: Registry = Depends(registry)) -> schemas.ScenarioDetail:
    return _scenario_detail(await reg.scenario(scenario_id, who.tenant))


@router.post("/v1/scenarios", status_code=201, response_model=schemas.ScenarioDetail, tags=["scenarios"])
async def create_scenario(body: schemas.ScenarioCreate, who: Principal = Admin,
                          reg: Registry = Depends(registry)) -> schemas.ScenarioDetail:
    if body.task is None and not body.turns:
        raise InvalidRequest("task is required unless turns are given", field="task")
    turn_list = tuple(Turn(
        message=t.message, tools=tuple(t.tools),
        checklist=tuple(CatalogCheck(item=c.item, check=c.check, kind=c.kind) for c in t.checklist),
        reference_solution=None if t.reference_solution is None else tuple(
            ToolCall(name=c.name, arguments=c.arguments) for c in t.reference_solution))
        for t in body.turns or [])
    solution = body.reference_solution
    if turn_list and any(t.reference_solution is not None for t in turn_list):
        solution = [c for t in body.turns or [] for c in t.reference_solution or []]
    scenario = Scenario(
        scenario_id=body.scenario_id or new_scenario_id(),
        env_id=body.env_id,
        task=body.task if body.task is not None else turn_list[0].message,
        init_config=body.init_config,
        checklist=[CatalogCheck(item=c.item, check=c.check, kind=c.kind) for c in body.checklist],
        reference_solution=None if solution is None else [
            ToolCall(name=c.name, arguments=c.arguments) for c in solution
        ],
        split=body.split,
        tags=tuple(body.tags),
        turns=turn_list,
    )
    check_label(body.label)
    return _scenario_detail(await reg.add_scenario(scenario, who.tenant, body.label))


@router.delete("/v1/scenarios/{scenario_id}", status_code=204, response_class=Response, tags=["scenarios"])
async def delete_scenario(scenario_id: str, who: Principal = Admin, reg: Registry = Depends(registry)) -> Response:
    """Remove a scenario this tenant added."""
    await reg.delete("scenarios", scenario_id, who.tenant)
    return Response(status_code=204)


# -- sessions -------------------------------------------------------------------------------
def _group_size(n: int, request: Request) -> int:
    limit = request.app.state.settings.max_group
    if n > limit:
        raise InvalidRequest(f"n: at most {limit} sessions per request (max_group)", field="n", limit="max_group",
                             value=limit)
    return n


async def _once(request: Request, response: Response, key: str | None, route: str, body: Callable[[], Any],
                run: Any, tenant: str) -> dict[str, Any]:
    """Run a session-creating request once per Idempotency-Key. ``body`` gives what the key's
    fingerprint covers; it is asked only with a key (a create's body may carry megabytes of config,
    and dumping it costs several parses of it)."""
    if key is None:
        answer: dict[str, Any] = await run()
        return answer
    engine: Sessions = request.app.state.sessions
    answer, replayed = await idempotency.once(engine.store, f"{tenant}:{route}", key,
                                              idempotency.fingerprint(route, body()),
                                              engine.pool.longest_request, run)
    if replayed:
        response.headers[idempotency.REPLAYED] = "true"
    return answer


@router.post("/v1/sessions", status_code=201, response_model=schemas.SessionCreated, tags=["sessions"])
async def create_session(body: schemas.SessionCreate, request: Request, response: Response,
                         key: str | None = IdempotencyKey, who: Principal = Run,
                         engine: Sessions = Depends(sessions)) -> Any:
    n = _group_size(body.n, request)

    async def run() -> dict[str, Any]:
        return created_body(await engine.create(body.scenario_id, body.env_id, body.init_config, n=n, mode=body.mode,
                                                tenant=who.tenant, seed=body.seed, group_seeds=body.group_seeds,
                                                idle_ttl=body.idle_ttl_seconds))

    raw = await request.body() if key is not None else b""  # (read already: starlette keeps it)
    return await _once(request, response, key, "create", lambda: _create_fingerprint(body, raw), run, who.tenant)


# A create body from this size is fingerprinted by its bytes.
LARGE_BODY = 64 * 1024


def _create_fingerprint(body: schemas.SessionCreate, raw: bytes) -> Any:
    """What an Idempotency-Key's fingerprint covers of a create: its body as parsed, canonically
    dumped; a large one (an init_config of megabytes) by the digest of its bytes instead, as a
    retry sends them again, since dumping it costs several parses of it (pydantic's dump and the
    sorted JSON). A small body is fingerprinted exactly as before, so keys taken before match."""
    if len(raw) < LARGE_BODY:
        return body.model_dump(mode="json")
    # (a list, where the parsed form is an object: no small body fingerprints alike)
    return ["body sha256", hashlib.sha256(raw).hexdigest()]


async def _turn_of(engine: Sessions, created: Created) -> int:
    """The turn a new session (a fork's may be past the first) is in; 0 for any other."""
    if created.scenario is None or not created.scenario.turns or created.meta.step == 0:
        return 0
    return await engine.turns.ended(Snapshot(created.meta, "", "", 0.0))


def _info(snap: Snapshot) -> schemas.SessionInfo:
    meta = snap.meta
    return schemas.SessionInfo(session_id=meta.session_id, env_id=meta.env_id, scenario_id=meta.scenario_id,
                               parent_id=meta.parent_id, mode="conversation" if meta.mode == "conversation" else "task",
                               done=meta.done, steps=meta.step, created_at=_utc(meta.created_at),
                               expires_at=_utc(snap.expires_at), env_version=meta.env_version or None,
                               scenario_version=meta.scenario_version or None)


@router.get("/v1/sessions", response_model=schemas.SessionList, tags=["sessions"])
async def list_sessions(offset: int = Query(default=0, ge=0), limit: int = Query(default=100, ge=1, le=MAX_PAGE),
                        who: Principal = Run, engine: Sessions = Depends(sessions)) -> schemas.SessionList:
    """This tenant's live sessions, the next to expire first."""
    snaps, total = await engine.live(offset, limit, tenant=who.tenant)
    return schemas.SessionList(sessions=[_info(s) for s in snaps], total=total, offset=offset)


@router.get("/v1/sessions/{session_id}", response_model=schemas.SessionInfo, tags=["sessions"])
async def get_session(session_id: str, who: Principal = Run,
                      engine: Sessions = Depends(sessions)) -> schemas.SessionInfo:
    return _info(await engine.snapshot(session_id, tenant=who.tenant))


@router.get("/v1/sessions/{session_id}/tools", response_model=schemas.ToolList, tags=["sessions"])
async def get_tools(session_id: str, who: Principal = Run, engine: Sessions = Depends(sessions)) -> schemas.ToolList:
    snap = await engine.snapshot(session_id, tenant=who.tenant, blobs=False)
    env = await engine.environment_of(snap)
    return schemas.ToolList(tools=await engine.turns.tools(snap, env))


@router.get("/v1/sessions/{session_id}/turns", response_model=schemas.TurnView, tags=["sessions"],
            responses={409: PROBLEMS[409]})
async def get_turn(session_id: str, who: Principal = Run, engine: Sessions = Depends(sessions)) -> schemas.TurnView:
    """Turn-based scenarios: the turn in progress, its user message and its tools (409 `not-turn-based` otherwise)."""
    snap = await engine.snapshot(session_id, tenant=who.tenant, blobs=False)
    view = await engine.turns.view(snap, await engine.environment_of(snap))
    if view is None:
        raise turns.not_turn_based(session_id)
    return schemas.TurnView.model_validate(view)


@router.post("/v1/sessions/{session_id}/turns", response_model=schemas.TurnResult, tags=["sessions"])
async def end_turn(session_id: str, response: Response, body: schemas.TurnEnd | None = None,
                   key: str | None = IdempotencyKey, who: Principal = Run,
                   engine: Sessions = Depends(sessions)) -> schemas.TurnResult:
    """Turn-based scenarios: end the turn in progress. Its checks run on the state and the turn's responses (see
    POST /score); the answer is the next user message and the tools that arrive with it, or done after the last
    turn. 409 `turns-ended` once every turn has ended, `not-turn-based` for a session without turns."""
    answer, replayed = await engine.turns.end(session_id, body.content if body else None, key=key, tenant=who.tenant)
    if replayed:
        response.headers[idempotency.REPLAYED] = "true"
    return schemas.TurnResult.model_validate(answer)


def _replayed(applied: Applied, response: Response) -> dict[str, Any]:
    if applied.replayed:
        response.headers[idempotency.REPLAYED] = "true"
    return applied.record


@router.post("/v1/sessions/{session_id}/calls", response_model=schemas.CallResult, tags=["sessions"])
async def call_tool(session_id: str, body: schemas.ToolCallRequest, response: Response,
                    key: str | None = IdempotencyKey, who: Principal = Run,
                    engine: Sessions = Depends(sessions)) -> schemas.CallResult:
    applied = await calls.run(engine, calls.CallRequest(session_id, body.name, body.arguments, key, who.tenant))
    _replayed(applied, response)
    return schemas.CallResult(**calls.view(applied))


@router.post("/v1/sessions/{session_id}/messages", response_model=schemas.MessageResult, tags=["sessions"])
async def send_message(session_id: str, body: schemas.MessageRequest, response: Response,
                       key: str | None = IdempotencyKey, who: Principal = Run,
                       engine: Sessions = Depends(sessions)) -> schemas.MessageResult:
    record = _replayed(await engine.message(session_id, body.content, key=key, tenant=who.tenant), response)
    return schemas.MessageResult(step=record["step"], reply=record["reply"], done=record["done"])


@router.get("/v1/sessions/{session_id}/state", response_model=schemas.StateView, tags=["sessions"])
async def get_state(session_id: str, step: int | None = Query(default=None, ge=0, description=(
                        "Show the state after this step (0: the initial state) instead of the current one; "
                        "it is rebuilt as for a fork at that step (see fork).")),
                    who: Principal = Run, engine: Sessions = Depends(sessions)) -> Response:
    step, view = await engine.state_view(session_id, step=step, tenant=who.tenant)
    # Already JSON text: re-encoding a large state through the response model would hold the loop again.
    return Response(content=f'{{"step":{step},"state":{view}}}', media_type="application/json")


@router.get("/v1/sessions/{session_id}/trajectory", response_model=schemas.Trajectory, tags=["sessions"],
            response_model_exclude_unset=True)
async def get_trajectory(session_id: str, offset: int = Query(default=0, ge=0),
                         limit: int = Query(default=MAX_PAGE, ge=1, le=MAX_PAGE), who: Principal = Run,
                         engine: Sessions = Depends(sessions)) -> schemas.Trajectory:
    steps, total = await engine.trajectory(session_id, offset, limit, tenant=who.tenant)
    return schemas.Trajectory.model_validate({"steps": steps, "total": total, "offset": offset})


@router.post("/v1/sessions/{session_id}/score", response_model=schemas.Score, tags=["sessions"],
             response_model_exclude_unset=True)
async def score_session(session_id: str, scenario: str | None = Query(default=None, max_length=200, description=(
                            "Score with the checks of this version of the session's own scenario instead of the "
                            "one it started on: its id for the latest, or scenario_id@<label or digest prefix> "
                            "(re-scoring after a check was fixed).")),
                        who: Principal = Run, engine: Sessions = Depends(sessions)) -> schemas.Score:
    return schemas.Score.model_validate(await engine.score(session_id, tenant=who.tenant, against=scenario))


@router.post("/v1/sessions/{session_id}/fork", status_code=201, response_model=schemas.SessionCreated,
             tags=["sessions"])
async def fork_session(session_id: str, request: Request, response: Response,
                       body: schemas.ForkRequest | None = None, key: str | None = IdempotencyKey,
                       who: Principal = Run, engine: Sessions = Depends(sessions)) -> Any:
    n = _group_size(body.n if body else 1, request)
    step = body.step if body else None
    seed, group_seeds = (body.seed, body.group_seeds) if body else (None, "derived")

    async def run() -> dict[str, Any]:
        created = await engine.fork(session_id, n=n, step=step, tenant=who.tenant, seed=seed, group_seeds=group_seeds)
        return created_body(created, await _turn_of(engine, created))

    asked = {"session_id": session_id, "n": n, **({"step": step} if step is not None else {}),
             **({"seed": seed, "group_seeds": group_seeds} if seed is not None else {})}
    return await _once(request, response, key, "fork", lambda: asked, run, who.tenant)


@router.delete("/v1/sessions/{session_id}", status_code=204, response_class=Response, tags=["sessions"])
async def delete_session(session_id: str, who: Principal = Run, engine: Sessions = Depends(sessions)) -> Response:
    await engine.delete(session_id, tenant=who.tenant)
    return Response(status_code=204)

