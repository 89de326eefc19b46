"""Stage records: append-only JSON Lines where the last record of a key wins."""

from __future__ import annotations

from pathlib import Path

from synthesis.run.workspace import RecordFile


def test_last_record_of_a_key_wins(tmp_path: Path) -> None:
    records = RecordFile(tmp_path / "r.jsonl")
    records.append({"key": "a", "status": "failed"})
    records.append({"key": "b", "status": "kept"})
    records.append({"key": "a", "status": "kept"})
    assert {k: r["status"] for k, r in records.load().items()} == {"a": "kept", "b": "kept"}


def test_a_line_torn_by_a_crash_is_ignored_and_does_not_swallow_the_next(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"key": "a", "status": "kept"}\n{"key": "b", "stat')
    records = RecordFile(path)
    assert list(records.load()) == ["a"]
    records.append({"key": "c", "status": "dropped"})
    assert list(records.load()) == ["a", "c"]


def test_missing_file_loads_empty(tmp_path: Path) -> None:
    assert RecordFile(tmp_path / "none.jsonl").load() == {}
