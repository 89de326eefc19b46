"""The engine's answers in the public wire shapes, shared by REST, MCP and OpenEnv."""

from __future__ import annotations

from typing import Any

from service.api import schemas
from service.engine import turns
from service.engine.creation import Created


def created_body(created: Created, turn: int = 0) -> dict[str, Any]:
    """The answer to a create or fork; ``turn``: the turn a turn-based session is in (a fork's may be later)."""
    meta = created.meta
    conversation = meta.mode == "conversation"
    scenario = created.scenario
    if scenario is not None and scenario.turns:
        view = turns.view_at(created.env, scenario, turn)
        return schemas.SessionCreated(
            session_id=meta.session_id, session_ids=[m.session_id for m in created.metas], env_id=created.env.env_id,
            scenario_id=meta.scenario_id, mode="task", task=scenario.task, user_message=view["user_message"],
            introduction=created.env.introduction, rules=created.env.rules, tools=view["tools"],
            env_version=meta.env_version or None, scenario_version=meta.scenario_version or None,
            turn=view["turn"], turns=view["turns"]).model_dump(mode="json", exclude_unset=True)
    return schemas.SessionCreated(
        session_id=meta.session_id,
        session_ids=[m.session_id for m in created.metas],
        env_id=created.env.env_id,
        scenario_id=meta.scenario_id,
        mode="conversation" if conversation else "task",
        task=created.scenario.task if created.scenario and not conversation else None,
        user_message=meta.opening,
        introduction=created.env.introduction,
        rules=created.env.rules,
        tools=created.env.tools,
        env_version=meta.env_version or None,
        scenario_version=meta.scenario_version or None,
    ).model_dump(mode="json")
