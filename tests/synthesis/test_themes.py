"""Stage 1a: reading the corpus and judging each task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from synthesis.errors import ConfigError
from synthesis.stages import themes
from tests.scripted_openai import Running
from tests.synthesis.conftest import CORPUS


def test_corpus_ids_under_task_id_survive_intact(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"task_id": "task_id-7", "task": "Book a table."}\n\n{"id": 12, "query": "Cancel order 5."}\n'
                    '{"instruction": "Refund my last order."}\n')  # fmt: skip
    tasks = themes.read_corpus(path)
    assert [t.task_id for t in tasks][:2] == ["task_id-7", "12"]
    assert tasks[2].task_id.startswith("t") and len(tasks[2].task_id) == 13  # a stable hash of the text
    assert themes.read_corpus(path)[2].task_id == tasks[2].task_id


@pytest.mark.parametrize(("lines", "message"), [
    ('{"task_id": "a", "task": "x"}\n{"task_id": "a", "task": "y"}\n', "used twice"),
    ('{"task_id": "a"}\n', "no task text"),
    ('not json\n', "not JSON"),
    ('["a list"]\n', "no task text"),
])  # fmt: skip
def test_bad_corpus_lines_are_config_errors_naming_the_line(tmp_path: Path, lines: str, message: str) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(lines)
    with pytest.raises(ConfigError, match=message) as caught:
        themes.read_corpus(path)
    assert caught.value.path and caught.value.path.startswith(str(path))


@pytest.mark.anyio
async def test_each_task_is_judged_and_recorded_with_its_reason(contexts: Any, llm: Running) -> None:
    ctx = contexts()
    report = await themes.run(ctx)
    records = ctx.workspace.themes.load()
    assert {k: (r["status"], r.get("reason")) for k, r in records.items()} == {
        "t01": ("kept", None), "t02": ("dropped", "open_qa"), "t03": ("dropped", "content_creation"),
        "t04": ("kept", None), "t05": ("dropped", "calculation"), "t06": ("kept", None),
        "t07": ("dropped", "chit_chat"), "t08": ("kept", None), "t09": ("kept", None), "t10": ("kept", None),
    }  # fmt: skip
    assert records["t01"]["theme"]["env_id"] == "clinic_appointments"
    assert records["t08"]["theme"]["modelability"] == 3  # the score threshold is applied by deduplication
    assert (report.items, report.kept, sum(report.dropped.values()), report.failed) == (10, 6, 4, [])
    # 10 tasks + a re-ask (t02) + a 429 (t03) + a 500 and a junk body (t05) + a timeout (t07)
    assert llm.script.count("corpus/") == 15


@pytest.mark.anyio
async def test_a_rerun_skips_judged_tasks_without_a_request(contexts: Any, llm: Running) -> None:
    await themes.run(contexts())
    before = llm.script.count()
    report = await themes.run(contexts(llm={"embedding_model": None}))  # a fresh client: no shared memory
    assert llm.script.count() == before and report.resumed == 10


@pytest.mark.anyio
async def test_an_item_that_fails_is_recorded_and_the_others_finish(contexts: Any, llm: Running, tmp_path: Path) -> None:
    corpus = tmp_path / "tasks.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in [
        {"task_id": "t01", "task": "Cancel Miso's grooming appointment."},
        {"task_id": "t99", "task": "A task the script has no answer for."},
    ]))  # fmt: skip
    ctx = contexts()
    ctx.config = ctx.config.model_copy(update={"corpus": corpus})
    report = await themes.run(ctx)
    records = ctx.workspace.themes.load()
    assert records["t01"]["status"] == "kept" and records["t99"]["status"] == "failed"
    assert "HTTP 400" in records["t99"]["error"] and report.failed[0][0] == "t99"


@pytest.mark.anyio
async def test_without_a_corpus_the_stage_refuses_to_start(contexts: Any) -> None:
    ctx = contexts()
    ctx.config = ctx.config.model_copy(update={"corpus": None})
    with pytest.raises(ConfigError, match="names no corpus"):
        await themes.run(ctx)


def test_fixture_corpus_has_ten_tasks() -> None:
    assert len(themes.read_corpus(CORPUS)) == 10
