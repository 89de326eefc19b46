"""The bare baseline: FastAPI on uvloop holding each session's environment instance in memory.

    BENCH_CATALOG=<folder from workload.write_catalog> uvicorn bench.baseline_app:from_environment --factory --loop uvloop

It offers the service's routes for create, call and fork with nothing behind them but the
environment class itself: no sandbox, no store, no lock, no diff. ``/snap/...`` runs the same call
and then deep-copies the state, as the original method's in-process step does after every call.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from bench import workload


class CallBody(BaseModel):
    name: str
    arguments: dict[str, Any] = {}


class CreateBody(BaseModel):
    scenario_id: str


def create_app(catalog: Path) -> FastAPI:
    cls = workload.load_class()
    configs: dict[str, dict[str, Any]] = {}
    for line in (catalog / workload.ENV_ID / "scenarios.jsonl").read_text().splitlines():
        scenario = json.loads(line)
        configs[scenario["scenario_id"]] = scenario["init_config"]
    sessions: dict[str, Any] = {}
    app = FastAPI()

    def session(session_id: str) -> Any:
        env = sessions.get(session_id)
        if env is None:
            raise HTTPException(404, f"session '{session_id}' not found")
        return env

    def new_session(env: Any) -> dict[str, Any]:
        session_id = secrets.token_hex(8)
        sessions[session_id] = env
        return {"session_id": session_id}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/sessions", status_code=201)
    async def create(body: CreateBody) -> dict[str, Any]:
        return new_session(workload.instantiate(cls, configs[body.scenario_id]))

    @app.post("/v1/sessions/{session_id}/fork", status_code=201)
    async def fork(session_id: str) -> dict[str, Any]:
        return new_session(copy.deepcopy(session(session_id)))

    def step(session_id: str, body: CallBody) -> dict[str, Any]:
        result = getattr(session(session_id), body.name)(**body.arguments)
        return {"step": 1, "ok": True, "result": result, "error": None, "observation": json.dumps(result)}

    @app.post("/v1/sessions/{session_id}/calls")
    async def call(session_id: str, body: CallBody) -> dict[str, Any]:
        return step(session_id, body)

    @app.post("/snap/v1/sessions/{session_id}/calls")
    async def call_and_snapshot(session_id: str, body: CallBody) -> dict[str, Any]:
        answer = step(session_id, body)
        copy.deepcopy(vars(session(session_id)))
        return answer

    return app


def from_environment() -> FastAPI:
    """The factory uvicorn calls (``--factory``): the catalog folder comes from ``BENCH_CATALOG``."""
    return create_app(Path(os.environ["BENCH_CATALOG"]))
