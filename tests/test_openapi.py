"""The committed OpenAPI document is the contract external harnesses build against."""

from __future__ import annotations

from pathlib import Path

from service.cli import openapi_text

COMMITTED = Path(__file__).resolve().parent.parent / "openapi" / "openapi.json"


def test_committed_spec_matches_the_code() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == openapi_text(), (
        "openapi/openapi.json is stale: run `envfoundry openapi --out openapi/openapi.json` and commit it"
    )


def test_spec_documents_problem_responses() -> None:
    text = openapi_text()
    assert "application/problem+json" in text
    assert '"/v1/sessions/{session_id}/fork"' in text
