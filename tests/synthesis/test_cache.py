"""The content-addressed response cache."""

from __future__ import annotations

from pathlib import Path

from synthesis.llm.cache import ResponseCache, request_key


def test_key_is_canonical_and_content_addressed() -> None:
    a = request_key({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7})
    b = request_key({"temperature": 0.7, "messages": [{"content": "hi", "role": "user"}], "model": "m"})
    assert a == b and len(a) == 64
    assert a != request_key({"model": "m", "messages": [{"role": "user", "content": "hi!"}], "temperature": 0.7})


def test_round_trip_and_miss(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path / "cache")
    key = request_key({"x": 1})
    assert cache.get(key) is None
    cache.put(key, {"x": 1}, {"choices": []})
    assert cache.get(key) == {"choices": []}
    assert len(cache) == 1 and (tmp_path / "cache" / key[:2] / f"{key}.json").is_file()


def test_a_torn_entry_reads_as_a_miss(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path)
    key = request_key({"x": 2})
    (tmp_path / key[:2]).mkdir()
    (tmp_path / key[:2] / f"{key}.json").write_text('{"request": {"x": 2}, "respo')
    assert cache.get(key) is None
