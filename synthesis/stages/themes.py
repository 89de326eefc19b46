"""Stage 1a, theme mining: judge each corpus task and infer the environment it needs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from synthesis.errors import ConfigError, Dropped
from synthesis.llm.dialogue import ask
from synthesis.llm.prompts import render
from synthesis.parsing.answers import parse_theme
from synthesis.run.context import Context
from synthesis.run.report import KEPT, StageReport

STAGE = "themes"
ID_KEYS = ("task_id", "id")
TEXT_KEYS = ("task", "text", "query", "instruction")


@dataclass(frozen=True)
class CorpusTask:
    task_id: str
    text: str


def read_corpus(path: Path) -> list[CorpusTask]:
    """One JSON object per line with the task text under ``task``/``text``/``query``/``instruction``
    and an optional id under ``task_id``/``id`` (else a hash of the text, stable across runs).

    Raises:
        ConfigError: unreadable file, a line that is not such an object, or a repeated id.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the corpus: {exc}", path=str(path)) from exc
    tasks: dict[str, CorpusTask] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            data: Any = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{where}: not JSON: {exc}", path=where) from exc
        text = next((data[k] for k in TEXT_KEYS if isinstance(data, dict) and isinstance(data.get(k), str)), None)
        if not text or not text.strip():
            raise ConfigError(f"{where}: no task text under {', '.join(TEXT_KEYS)}", path=where)
        raw_id = next((data[k] for k in ID_KEYS if data.get(k) is not None), None)
        task_id = str(raw_id) if raw_id is not None else "t" + hashlib.sha256(text.encode()).hexdigest()[:12]
        if task_id in tasks:
            raise ConfigError(f"{where}: the task id '{task_id}' is used twice", path=where)
        tasks[task_id] = CorpusTask(task_id, text.strip())
    return list(tasks.values())


async def run(ctx: Context) -> StageReport:
    if ctx.config.corpus is None:
        raise ConfigError("the config names no corpus (corpus = \"tasks.jsonl\")", field="corpus")
    tasks = {t.task_id: t for t in read_corpus(ctx.config.corpus)}
    if not tasks:
        raise ConfigError("the corpus holds no task", path=str(ctx.config.corpus))

    async def judge(key: str) -> dict[str, Any]:
        task = tasks[key]
        prompt = render("theme_judge", env="corpus", item=key, task=task.text)
        theme = await ask(ctx.client, "generator", prompt, parse_theme, stage=STAGE)
        if theme.decision == "drop":
            raise Dropped(theme.category, theme.reason)
        return {"status": KEPT, "task": task.text, "theme": asdict(theme)}

    return await ctx.run_items(STAGE, sorted(tasks), ctx.workspace.themes, judge)
