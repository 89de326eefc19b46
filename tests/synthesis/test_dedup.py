"""Stage 1b: deduplication by embeddings or token overlap, the score order, and --max-envs."""

from __future__ import annotations

from typing import Any

import pytest

from synthesis.parsing.answers import parse_theme
from synthesis.run.context import Context
from synthesis.stages import dedup
from tests.scripted_openai import Running
from tests.synthesis.conftest import ANSWERS, latest

pytestmark = pytest.mark.anyio


def seed_themes(ctx: Context, tasks: tuple[str, ...] = ("t01", "t04", "t06", "t08", "t09", "t10")) -> None:
    """Kept theme records as the judge writes them, straight from the fixture answers."""
    from dataclasses import asdict

    for task in tasks:
        theme = parse_theme(latest(ANSWERS / "corpus" / "theme_judge", task))
        ctx.workspace.themes.append({"key": task, "status": "kept", "task": "", "theme": asdict(theme)})


def env_ids(ctx: Context) -> list[str]:
    return [e["env_id"] for e in dedup.environments(ctx)]


async def test_embeddings_drop_the_near_duplicate_keeping_the_better_scored(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_themes(ctx)
    report = await dedup.run(ctx)
    assert env_ids(ctx) == ["clinic_appointments", "warehouse_inventory", "event_ticketing", "parking_permits"]
    outcome = ctx.workspace.read_json(ctx.workspace.environments)
    assert outcome["method"] == "embeddings" and llm.script.count("embeddings") == 1
    low, duplicate = outcome["dropped"]
    assert (duplicate["env_id"], duplicate["reason"]) == ("warehouse_stock", "duplicate")
    assert "similar to warehouse_inventory" in duplicate["detail"]
    assert (low["env_id"], low["reason"]) == ("smart_home_vision", "low_score")
    assert low["detail"] == "usefulness 6, modelability 3; both must reach 5"
    assert (report.kept, dict(report.dropped)) == (4, {"duplicate": 1, "low_score": 1})


async def test_without_an_embedding_model_the_lexical_fallback_deduplicates(contexts: Any, llm: Running) -> None:
    ctx = contexts(llm={"embedding_model": None})
    seed_themes(ctx)
    await dedup.run(ctx)
    assert "warehouse_stock" not in env_ids(ctx) and llm.script.count() == 0
    assert ctx.workspace.read_json(ctx.workspace.environments)["method"] == "lexical"


async def test_an_endpoint_without_the_model_falls_back_and_says_why(contexts: Any, llm: Running) -> None:
    ctx = contexts(llm={"embedding_model": "text-embedding-missing"})
    seed_themes(ctx)
    await dedup.run(ctx)
    outcome = ctx.workspace.read_json(ctx.workspace.environments)
    assert outcome["method"] == "lexical" and "HTTP 404" in outcome["fallback_reason"]
    assert "warehouse_stock" not in env_ids(ctx)


async def test_max_envs_keeps_the_best_scored(contexts: Any) -> None:
    ctx = contexts(run={"max_envs": 2})
    seed_themes(ctx)
    report = await dedup.run(ctx)
    assert env_ids(ctx) == ["clinic_appointments", "warehouse_inventory"]
    assert dict(report.dropped) == {"duplicate": 1, "over_max_envs": 2, "low_score": 1}


async def test_unchanged_inputs_reuse_the_result_without_a_request(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_themes(ctx)
    await dedup.run(ctx)
    again = await dedup.run(contexts())
    assert llm.script.count("embeddings") == 1 and again.resumed == 6


async def test_a_new_score_threshold_applies_to_themes_already_judged(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    seed_themes(ctx)
    await dedup.run(ctx)
    lenient = contexts(thresholds={"keep_score": 3})
    await dedup.run(lenient)
    assert "smart_home_vision" in env_ids(lenient) and llm.script.count("corpus/") == 0


async def test_distinct_themes_with_the_same_name_get_distinct_ids(contexts: Any) -> None:
    ctx = contexts(llm={"embedding_model": None})
    seed_themes(ctx, ("t01",))
    theme = parse_theme(latest(ANSWERS / "corpus" / "theme_judge", "t09"))
    ctx.workspace.themes.append({"key": "t99", "status": "kept",
                                 "theme": {**vars(theme), "env_id": "clinic_appointments"}})  # fmt: skip
    await dedup.run(ctx)
    assert env_ids(ctx) == ["clinic_appointments", "clinic_appointments_2"]


ROOM_SERVICE = ("room service orders\nGuests of a hotel order meals to their rooms; staff add items, set quantities, "
                "deliver and cancel orders.\nThe hotel keeps guests with their room numbers, a menu of dishes with prices "
                "and availability, and room-service orders with their items, quantities, totals and status (placed, "
                "preparing, delivered, cancelled). Staff place orders for a room, add or remove menu items, mark orders "
                "delivered and cancel orders that were not delivered.")  # fmt: skip
IN_ROOM_DINING = ("in room dining\nTracks in-room dining requests of hotel guests: menu dishes, ordered items and their "
                  "delivery.\nEach guest stays in a room; the kitchen's menu lists dishes with a price and whether they "
                  "can be ordered. A dining request belongs to a room and holds dishes with quantities, a total and a "
                  "state from received through in preparation to delivered, or cancelled. Staff open requests, add "
                  "dishes, deliver and cancel them.")  # fmt: skip


def test_similarity_measures() -> None:
    assert dedup.cosine([1.0, 0.0], [1.0, 0.0]) == 1.0 and dedup.cosine([0.0, 0.0], [1.0, 0.0]) == 0.0
    assert dedup.lexical("The blue mugs", "blue mug!") == pytest.approx(1.0) and dedup.lexical("", "") == 0.0
    assert dedup.stem("orders") == dedup.stem("ordered") == dedup.stem("ordering") == "order"


def test_without_embeddings_paraphrased_themes_are_duplicates_and_distinct_domains_are_not() -> None:
    from synthesis.run.config import Thresholds

    threshold = Thresholds().lexical_similarity
    assert dedup.lexical(ROOM_SERVICE, IN_ROOM_DINING) >= threshold
    for task in ("t01", "t04", "t09", "t10"):
        theme = parse_theme(latest(ANSWERS / "corpus" / "theme_judge", task))
        text = f"{theme.env_id.replace('_', ' ')}\n{theme.summary}\n{theme.introduction}"
        assert dedup.lexical(ROOM_SERVICE, text) < threshold - 0.1, task
