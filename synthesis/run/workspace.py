"""The output folder: a catalog of packages plus ``_work/``, where stages keep their records.

    <out>/<env_id>/...           packages (``envfoundry serve --catalog <out>``)
    <out>/_work/themes.jsonl     one record per corpus task
    <out>/_work/environments.json   deduplicated, thresholded themes
    <out>/_work/skeletons.jsonl  one record per environment
    <out>/_work/assessments.jsonl   one record per environment, with the full log
    <out>/_work/scenarios.jsonl  one record per candidate scenario
    <out>/_work/cache/           LLM responses by content hash
    <out>/_work/usage.jsonl      every request, answer and cache hit, as it happens
    <out>/_work/summary.json     every run's usage and the latest run's summary

The catalog loader only reads folders holding an ``env.json``, and ``_work``
never does; environment ids are snake_case, so none can be ``_work``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class RecordFile:
    """Append-only JSON Lines, one record per item, keyed by ``record["key"]``; the last record of a key wins.

    Each record is written and flushed when its item finishes, so an interrupted
    run keeps every finished item; a line torn by a crash is ignored on reading.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, dict[str, Any]]:
        records: dict[str, dict[str, Any]] = {}
        if not self.path.is_file():
            return records
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("key"), str):
                records[record["key"]] = record
        return records

    def append(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            # A line torn by an earlier crash must not swallow this record.
            if handle.tell() and not self._ends_with_newline():
                handle.write("\n")
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as raw:
            raw.seek(-1, 2)
            return raw.read(1) == b"\n"


class Workspace:
    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.work = self.out / "_work"
        self.themes = RecordFile(self.work / "themes.jsonl")
        self.skeletons = RecordFile(self.work / "skeletons.jsonl")
        self.assessments = RecordFile(self.work / "assessments.jsonl")
        self.scenarios = RecordFile(self.work / "scenarios.jsonl")
        self.environments = self.work / "environments.json"
        self.cache = self.work / "cache"
        self.summary = self.work / "summary.json"
        self.usage = self.work / "usage.jsonl"
        self.published = self.work / "published.json"

    def read_json(self, path: Path) -> Any:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def write_json(self, path: Path, value: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(path)
