"""Re-scoring rollout lines against a scenario's checks as they are now, without the model.

Each line's tool calls are replayed in a new session started on exactly the versions the line
records (``scenario_id@scenario_version`` on ``env_id@env_version``), so the state is the one the
episode reached; it is then scored with the checks of the scenario's latest version (or, with
``checks="pinned"``, the ones it was scored with). A line whose replayed calls answer otherwise
than recorded (an environment that draws or reads the clock) says so under ``rescored.diverged``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from envfoundry_client.client import AsyncClient
from envfoundry_client.errors import EnvfoundryError

JSON = dict[str, Any]
Checks = Literal["latest", "pinned"]


async def rescore(ef: AsyncClient, records: list[JSON], *, checks: Checks = "latest",
                  concurrency: int = 4) -> list[JSON]:
    """The records with their reward, checks and ``rescored`` replaced by a fresh scoring."""
    gate = asyncio.Semaphore(concurrency)

    async def one(record: JSON) -> JSON:
        async with gate:
            return await _rescored(ef, record, checks)

    return list(await asyncio.gather(*(one(r) for r in records)))


async def _rescored(ef: AsyncClient, record: JSON, checks: Checks) -> JSON:
    scenario_id = record.get("scenario_id")
    if not scenario_id:
        return {**record, "rescored": {"error": "the line has no scenario to score against"}}
    pinned_scenario = f"{scenario_id}@{record['scenario_version']}" if record.get("scenario_version") else scenario_id
    pinned_env = f"{record['env_id']}@{record['env_version']}" if record.get("env_version") else None
    try:
        session = await ef.create_session(pinned_scenario, env_id=pinned_env)
    except EnvfoundryError as exc:
        return {**record, "rescored": {"error": f"could not start the recorded versions: {exc}"}}
    try:
        diverged = []
        for index, call in enumerate(record.get("tool_calls") or []):
            result = await ef.call(session.session_id, call["name"], call.get("arguments") or {})
            if result.ok != call.get("ok") or (result.ok and result.result != call.get("result")):
                diverged.append(index)
        score = await ef.score(session.session_id, scenario=scenario_id if checks == "latest" else None)
    except EnvfoundryError as exc:
        return {**record, "rescored": {"error": str(exc)}}
    finally:
        try:
            await ef.delete_session(session.session_id)
        except EnvfoundryError:
            pass  # it expires on its own
    return {**record, "reward": score.reward, "passed": score.passed, "total": score.total,
            "checks": [{"item": c.item, "passed": c.passed, "error": c.error} for c in score.checks],
            "rescored": {"checks": checks, "scenario_version": score.scenario_version,
                         "previous_reward": record.get("reward"), "diverged": diverged}}
