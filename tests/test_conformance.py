"""The conformance cases pass against a real server, and the runner can tell when they do not."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT, Server

RUNNER = ROOT / "openapi" / "conformance" / "run.py"


def runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conformance_run", RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
def test_every_case_passes_against_a_live_server(server: Server) -> None:
    """The runner is started as a user would start it: a separate stdlib-only Python process."""
    done = subprocess.run([sys.executable, "-I", str(RUNNER), "--base-url", server.url],
                          capture_output=True, text=True, timeout=280)
    cases = json.loads((RUNNER.parent / "cases.json").read_text())["cases"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == f"conformance: {len(cases)} passed, 0 failed"


def test_the_cases_cover_every_error_status_and_problem_type() -> None:
    cases = json.loads((RUNNER.parent / "cases.json").read_text())["cases"]
    problems = {(c["expect"]["status"], c["expect"]["body"]["type"]) for c in cases
                if c["expect"].get("content_type") == "application/problem+json"}
    slugs = {(status, kind.rsplit(":", 1)[1]) for status, kind in problems}
    assert {(403, "forbidden"), (404, "not-found"), (405, "method-not-allowed"), (409, "not-conversation"), (413, "payload-too-large"),
            (422, "invalid-request"), (422, "idempotency-key-reused"), (422, "limit-exceeded"), (422, "invalid-environment"),
            (503, "user-llm-unavailable")} <= slugs
    kinds = {c["expect"]["body"]["error"]["type"] for c in cases
             if isinstance(c["expect"].get("body"), dict) and isinstance(c["expect"]["body"].get("error"), dict)}
    assert {"unknown_tool", "invalid_arguments"} <= kinds


def test_a_wrong_answer_fails_its_case_and_names_the_place(server: Server, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        {"name": "wrong status", "request": {"method": "GET", "path": "/v1/sessions/ses_nope"},
         "expect": {"status": 200}},
        {"name": "wrong value", "request": {"method": "GET", "path": "/healthz"},
         "expect": {"status": 200, "body": {"status": "down"}}},
        {"name": "wrong type", "request": {"method": "GET", "path": "/v1/environments"},
         "expect": {"status": 200, "body": {"environments": {"$type": "object"}}}},
        {"name": "missing capture", "request": {"method": "GET", "path": "/v1/sessions/{{nothing}}"},
         "expect": {"status": 200}},
        {"name": "right", "request": {"method": "GET", "path": "/healthz"},
         "expect": {"status": 200, "content_type": "application/json", "body": {"status": {"$type": "string"}}}},
    ]
    assert runner().run(server.url, cases, {}) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("not ok - wrong status: status: expected 200, got 404")
    assert lines[1] == 'not ok - wrong value: body.status: expected "down", got "ok"'
    assert lines[2].startswith("not ok - wrong type: body.environments: expected type object")
    assert lines[3].startswith("not ok - missing capture")
    assert lines[4:] == ["ok - right", "conformance: 1 passed, 4 failed"]


@pytest.mark.parametrize(("expected", "actual", "ok"), [
    ({"a": 1}, {"a": 1, "b": 2}, True),
    ({"a": 1}, {"b": 1}, False),
    ([1, 2], [1, 2, 3], False),
    ({"$type": "number"}, 3, True),
    ({"$type": "integer"}, 3.5, False),
    ({"$type": "boolean"}, 0, False),
    ({"$contains": "ab"}, "xaby", True),
    ({"$contains": [{"k": 1}]}, [{"k": 2}, {"k": 1, "j": 0}], True),
    ({"$contains": [{"k": 3}]}, [{"k": 2}], False),
    ({"$length": 2}, [0, 0], True),
    ({"$present": True}, None, True),
    ({"a": {"$absent": True}}, {"b": 1}, True),
    ({"a": {"$absent": True}}, {"a": None}, False),
    (1, 1.0, True),
    (None, False, False),
])
def test_matchers(expected: object, actual: object, ok: bool) -> None:
    module = runner()
    try:
        module.match(expected, actual)
    except module.Mismatch:
        assert not ok
    else:
        assert ok
