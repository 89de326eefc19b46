"""The READMEs' examples, run as written against a real server: each episode ends at reward 1.0 and
leaves no session behind. Only the address changes (the examples say 127.0.0.1:8000 or localhost:8000)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import BUNDLED, ROOT, Server, start_server

README = ROOT / "README.md"
CLIENT_README = ROOT / "clients" / "python" / "README.md"


def block(path: Path, heading: str, language: str) -> str:
    """The first ``language`` code block after ``heading`` in a README."""
    text = path.read_text(encoding="utf-8")
    found = re.search(rf"^#+ {re.escape(heading)}\n.*?^```{language}\n(.*?)^```", text, re.S | re.M)
    assert found, f"{path.name} has no {language} block under '{heading}'"
    return found.group(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("readme"), catalogs=(BUNDLED,))
    yield srv
    srv.stop()


def live_sessions(server: Server) -> int:
    return int(httpx.get(f"{server.url}/v1/sessions").json()["total"])


def run_python(source: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", source, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_curl_episode_ends_at_reward_1_and_deletes_what_it_made(server: Server) -> None:
    script = block(README, "A whole episode with curl", "bash").replace("localhost:8000", server.url)
    # Each answer on a line of its own, so the test can read them; the script itself is unchanged.
    wrapped = "set -euo pipefail\ncurl() { command curl --fail-with-body \"$@\"; echo; }\n" + script
    done = subprocess.run(["bash", "-c", wrapped], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    answers: list[Any] = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    scores = [a for a in answers if isinstance(a, dict) and {"reward", "passed", "total", "checks"} <= set(a)]
    assert [s["reward"] for s in scores] == [pytest.approx(1 / 3), 1.0]
    calls = [a for a in answers if isinstance(a, dict) and "observation" in a]
    assert [c["step"] for c in calls] == [1, 2, 3, 4] and all(c["ok"] for c in calls)
    assert all(c["result"]["success"] for c in calls)  # no call of the episode is refused
    assert live_sessions(server) == 0  # the session and its fork are both deleted


def test_the_python_client_examples_end_at_reward_1_and_delete_their_sessions(server: Server) -> None:
    sync = block(CLIENT_README, "Sync", "python").replace("http://127.0.0.1:8000", server.url)
    printed = run_python(sync).splitlines()
    assert printed[0].startswith("True {\"success\": true")  # list_member_loans answered
    assert printed[1] == "True {'success': False, 'error': \"Loan 'L9999' not found\"}"  # a refusal is ok
    assert [float(line) for line in printed[2:4]] == [pytest.approx(1 / 3), 1.0]
    assert printed[4:] == ["1 call", "2 call", "3 call", "4 call", "5 call"]
    asynchronous = block(CLIENT_README, "Async", "python").replace("http://127.0.0.1:8000", server.url)
    assert run_python(asynchronous).split() == ["1.0"]
    assert live_sessions(server) == 0


def test_the_mcp_example_prints_a_tool_answer_and_catches_a_service_error(server: Server) -> None:
    snippet = block(README, "MCP", "python").replace("http://127.0.0.1:8000", server.url)
    imports = "\n".join(line for line in snippet.splitlines() if line.startswith(("from ", "import ")))
    body = "\n".join(line for line in snippet.splitlines() if not line.startswith(("from ", "import ")))
    program = (f"import asyncio, sys\n{imports}\n\nasync def main(session_id: str) -> None:\n"
               f"{textwrap.indent(body, '    ')}\n\nasyncio.run(main(sys.argv[1]))\n")
    with server.client() as http:
        session_id = http.post("/v1/sessions", json={"scenario_id": "lib-001"}).json()["session_id"]
        answered = run_python(program, session_id)
        assert answered.startswith("False {\"success\": true") and "L0003" in answered
        assert http.delete(f"/v1/sessions/{session_id}").status_code == 204
    assert run_python(program, session_id).split() == ["-32002", "urn:envfoundry:problem:not-found"]


def test_the_turns_episode_ends_at_reward_1_and_deletes_what_it_made(server: Server) -> None:
    script = block(README, "Episodes in turns", "bash").replace("localhost:8000", server.url)
    wrapped = "set -euo pipefail\ncurl() { command curl --fail-with-body \"$@\"; echo; }\n" + script
    done = subprocess.run(["bash", "-c", wrapped], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    answers: list[Any] = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    calls = [a for a in answers if isinstance(a, dict) and "observation" in a]
    assert [(c["ok"], (c["error"] or {}).get("type")) for c in calls] == [(True, None), (False, "unknown_tool"),
                                                                         (True, None)]
    ended = [a for a in answers if isinstance(a, dict) and "ended_turn" in a]
    assert [t["function"]["name"] for t in ended[0]["new_tools"]] == ["renew_loan"] and ended[1]["done"] is True
    score = next(a for a in answers if isinstance(a, dict) and "aggregation" in a)
    assert (score["reward"], score["turns_passed"], score["partial_credit"]) == (1.0, 2, 1.0)
    assert live_sessions(server) == 0
    assert httpx.get(f"{server.url}/v1/scenarios/lib-turns-demo").status_code == 404
