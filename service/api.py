"""REST API v1 routes. Handlers translate wire models to engine calls and back; nothing more."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from service import schemas
from service.catalog import CatalogError, Scenario, ToolCall, build_environment, new_scenario_id
from service.catalog import CheckItem as CatalogCheck
from service.problems import MEDIA_TYPE, InvalidEnvironment
from service.registry import Registry
from service.sessions import Created, Sessions

PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.Problem, "content": {MEDIA_TYPE: {}}, "description": text}
    for status, text in {404: "Not found", 409: "Conflict", 413: "Payload too large", 422: "Invalid request",
                         503: "Unavailable"}.items()
}

router = APIRouter(responses=PROBLEMS)


def sessions(request: Request) -> Sessions:
    return request.app.state.sessions  # type: ignore[no-any-return]


def registry(request: Request) -> Registry:
    return request.app.state.registry  # type: ignore[no-any-return]


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


@router.get("/healthz", response_model=schemas.Health, tags=["service"])
async def healthz() -> schemas.Health:
    return schemas.Health(status="ok")


# -- environments ---------------------------------------------------------------------------
@router.get("/v1/environments", response_model=schemas.EnvironmentList, tags=["environments"])
async def list_environments(reg: Registry = Depends(registry)) -> schemas.EnvironmentList:
    envs = await reg.environments()
    counts: dict[str, int] = {}
    for scenario in await reg.scenarios():
        counts[scenario.env_id] = counts.get(scenario.env_id, 0) + 1
    return schemas.EnvironmentList(environments=[
        schemas.EnvironmentSummary(env_id=e.env_id, class_name=e.class_name, summary=e.summary,
                                   tool_count=len(e.tools), scenario_count=counts.get(e.env_id, 0))
        for e in envs
    ])


def _env_detail(env: Any) -> schemas.EnvironmentDetail:
    return schemas.EnvironmentDetail(env_id=env.env_id, class_name=env.class_name, summary=env.summary,
                                     introduction=env.introduction, rules=env.rules, tools=env.tools)


@router.get("/v1/environments/{env_id}", response_model=schemas.EnvironmentDetail, tags=["environments"])
async def get_environment(env_id: str, reg: Registry = Depends(registry)) -> schemas.EnvironmentDetail:
    return _env_detail(await reg.environment(env_id))


@router.post("/v1/environments", status_code=201, response_model=schemas.EnvironmentDetail, tags=["environments"])
async def create_environment(body: schemas.EnvironmentCreate,
                             reg: Registry = Depends(registry)) -> schemas.EnvironmentDetail:
    try:
        # Static analysis of up to 1 MiB of code: off the event loop.
        env = await asyncio.to_thread(
            build_environment, env_id=body.env_id, class_name=body.class_name, code=body.code, summary=body.summary,
            introduction=body.introduction, rules=body.rules)
    except CatalogError as exc:
        raise InvalidEnvironment(f"{exc.reason}: {exc.message}", reason=exc.reason, field="code") from exc
    return _env_detail(await reg.add_environment(env))


# -- scenarios ------------------------------------------------------------------------------
@router.get("/v1/environments/{env_id}/scenarios", response_model=schemas.ScenarioList, tags=["scenarios"])
async def list_scenarios(env_id: str, reg: Registry = Depends(registry)) -> schemas.ScenarioList:
    await reg.environment(env_id)
    items = [s for s in await reg.scenarios() if s.env_id == env_id]
    return schemas.ScenarioList(scenarios=[
        schemas.ScenarioSummary(scenario_id=s.scenario_id, env_id=s.env_id, task=s.task)
        for s in sorted(items, key=lambda s: s.scenario_id)
    ])


def _scenario_detail(s: Scenario) -> schemas.ScenarioDetail:
    return schemas.ScenarioDetail.model_validate(s.to_json())


@router.get("/v1/scenarios/{scenario_id}", response_model=schemas.ScenarioDetail, tags=["scenarios"])
async def get_scenario(scenario_id: str, reg: Registry = Depends(registry)) -> schemas.ScenarioDetail:
    return _scenario_detail(await reg.scenario(scenario_id))


@router.post("/v1/scenarios", status_code=201, response_model=schemas.ScenarioDetail, tags=["scenarios"])
async def create_scenario(body: schemas.ScenarioCreate, reg: Registry = Depends(registry)) -> schemas.ScenarioDetail:
    scenario = Scenario(
        scenario_id=body.scenario_id or new_scenario_id(),
        env_id=body.env_id,
        task=body.task,
        init_config=body.init_config,
        checklist=[CatalogCheck(item=c.item, check=c.check) for c in body.checklist],
        reference_solution=None if body.reference_solution is None else [
            ToolCall(name=c.name, arguments=c.arguments) for c in body.reference_solution
        ],
    )
    return _scenario_detail(await reg.add_scenario(scenario))


# -- sessions -------------------------------------------------------------------------------
def _created(created: Created) -> schemas.SessionCreated:
    return schemas.SessionCreated(
        session_id=created.meta.session_id,
        env_id=created.env.env_id,
        scenario_id=created.meta.scenario_id,
        task=created.scenario.task if created.scenario else None,
        introduction=created.env.introduction,
        rules=created.env.rules,
        tools=created.env.tools,
    )


@router.post("/v1/sessions", status_code=201, response_model=schemas.SessionCreated, tags=["sessions"])
async def create_session(body: schemas.SessionCreate, engine: Sessions = Depends(sessions)) -> schemas.SessionCreated:
    return _created(await engine.create(body.scenario_id, body.env_id, body.init_config))


@router.get("/v1/sessions/{session_id}", response_model=schemas.SessionInfo, tags=["sessions"])
async def get_session(session_id: str, engine: Sessions = Depends(sessions)) -> schemas.SessionInfo:
    snap = await engine.snapshot(session_id)
    meta = snap.meta
    return schemas.SessionInfo(session_id=meta.session_id, env_id=meta.env_id, scenario_id=meta.scenario_id,
                               parent_id=meta.parent_id, steps=meta.step, created_at=_utc(meta.created_at),
                               expires_at=_utc(snap.expires_at))


@router.get("/v1/sessions/{session_id}/tools", response_model=schemas.ToolList, tags=["sessions"])
async def get_tools(session_id: str, engine: Sessions = Depends(sessions)) -> schemas.ToolList:
    env = await engine.environment_of(await engine.snapshot(session_id))
    return schemas.ToolList(tools=env.tools)


@router.post("/v1/sessions/{session_id}/calls", response_model=schemas.CallResult, tags=["sessions"])
async def call_tool(session_id: str, body: schemas.ToolCallRequest,
                    engine: Sessions = Depends(sessions)) -> schemas.CallResult:
    record = await engine.call(session_id, body.name, body.arguments)
    return schemas.CallResult(step=record["step"], ok=record["ok"], result=record["result"],
                              error=record["error"], observation=record["observation"])


@router.get("/v1/sessions/{session_id}/state", response_model=schemas.StateView, tags=["sessions"])
async def get_state(session_id: str, engine: Sessions = Depends(sessions)) -> schemas.StateView:
    step, state = await engine.state_view(session_id)
    return schemas.StateView(step=step, state=state)


@router.get("/v1/sessions/{session_id}/trajectory", response_model=schemas.Trajectory, tags=["sessions"])
async def get_trajectory(session_id: str, engine: Sessions = Depends(sessions)) -> schemas.Trajectory:
    return schemas.Trajectory.model_validate({"steps": await engine.trajectory(session_id)})


@router.post("/v1/sessions/{session_id}/score", response_model=schemas.Score, tags=["sessions"])
async def score_session(session_id: str, engine: Sessions = Depends(sessions)) -> schemas.Score:
    return schemas.Score.model_validate(await engine.score(session_id))


@router.post("/v1/sessions/{session_id}/fork", status_code=201, response_model=schemas.SessionCreated,
             tags=["sessions"])
async def fork_session(session_id: str, engine: Sessions = Depends(sessions)) -> schemas.SessionCreated:
    return _created(await engine.fork(session_id))


@router.delete("/v1/sessions/{session_id}", status_code=204, response_class=Response, tags=["sessions"])
async def delete_session(session_id: str, engine: Sessions = Depends(sessions)) -> Response:
    await engine.delete(session_id)
    return Response(status_code=204)

