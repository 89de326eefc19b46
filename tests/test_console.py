"""The web console, driven in a real browser (Debian's chromium through playwright-core) against real servers:
a user browses the catalog, solves lib-001 by hand through the tool forms, forks and deletes, reads rollout and
synthesis reports, and a keyed server asks for a key. Screenshots go to a folder this test prints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.api.auth import new_key
from service.engine.user_llm import STOP
from tests.conftest import BUNDLED, FIXTURES, Server, start_server
from tests.scripted_openai import Running
from tests.scripted_openai.queue import ChatQueue

HERE = Path(__file__).resolve().parent
CONSOLE_TESTS = HERE / "console"
GRAPHS = HERE / "fixtures" / "graphs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
KEY, KEY_LINE = new_key("console-tests", ["run"])
USER_LINES = ["Hi, I'm returning Kindred today.", "Loan L0003, thanks."]
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def add_hostile_scenario(server: Server) -> str:
    """A scenario whose task, checklist item and state hold markup, as synthesized data might."""
    scenario = lib_001()
    init = json.loads(json.dumps(scenario["init_config"]))
    init["books"]["B001"]["title"] = HOSTILE
    checklist = [{"item": HOSTILE, "check": scenario["checklist"][0]["check"]}]  # type: ignore[index]
    with server.client() as http:
        response = http.post("/v1/scenarios", json={"env_id": scenario["env_id"], "scenario_id": "console-hostile",
                                                    "task": HOSTILE, "init_config": init, "checklist": checklist})
    assert response.status_code == 201, response.text
    return "console-hostile"


def lib_001() -> dict[str, object]:
    for line in (BUNDLED / "library_circulation" / "scenarios.jsonl").read_text().splitlines():
        scenario: dict[str, object] = json.loads(line)
        if scenario["scenario_id"] == "lib-001":
            return scenario
    raise AssertionError("lib-001 is not in the bundled catalog")


def synth_folder(root: Path) -> Path:
    """An `envfoundry synth` output folder's records, in the shape synthesis/run/report.py and assess.py write."""
    work = root / "synth-out" / "_work"
    work.mkdir(parents=True)
    stages = [("themes", 10, 6, {"open_qa": 4}), ("skeletons", 4, 3, {}), ("assess", 3, 2, {"below_pass_ratio": 1})]
    (work / "summary.json").write_text(json.dumps({"stages": [
        {"stage": s, "items": n, "resumed": 0, "kept": k, "dropped": d, "failed": [], "usage": {}}
        for s, n, k, d in stages]}))
    verdicts = [("clinic_booking", {"pass": 7, "warning": 1, "fail": 2}, "kept", None),
                ("parcel_lockers", {"pass": 2, "warning": 0, "fail": 8}, "dropped", "below_pass_ratio")]
    (work / "assessments.jsonl").write_text("".join(json.dumps(
        {"key": k, "counts": c, "judged": 10, "rounds": 10, "ratio": (c["pass"] + c["warning"]) / 10,
         "status": st, "reason": r, "log": []}) + "\n" for k, c, st, r in verdicts))
    return root / "synth-out"


def failed_rollout(path: Path) -> Path:
    """A rollout whose LLM endpoint could not be reached, as `envfoundry rollout` writes it."""
    record = json.loads((HERE / "client" / "expected" / "rollout-task-native.jsonl").read_text().splitlines()[0])
    record.update(reward=0.0, passed=0, finish_reason="llm_error", messages=record["messages"][:2], tool_calls=[],
                  error="no answer from the LLM endpoint (ConnectError: All connection attempts failed) "
                        "(after 4 attempts)")
    path.write_text(json.dumps(record) + "\n")
    return path


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    tmp = tmp_path_factory.mktemp("console")
    with Running(ChatQueue([USER_LINES[0], f"{USER_LINES[1]}\n{STOP}"])) as chat:
        # The graph fixture first: its fs-001 (with parent pointers) takes the id over the bundled one.
        open_server = start_server(tmp, catalogs=(GRAPHS, BUNDLED, FIXTURES), extra_env={
            "ENVFOUNDRY_USER_LLM_BASE_URL": chat.url, "ENVFOUNDRY_USER_LLM_MODEL": "user-sim"})
        try:
            keyed = start_server(tmp, extra_env={"ENVFOUNDRY_API_KEYS": KEY_LINE}, workers=1)
        except Exception:
            open_server.stop()
            raise
        yield open_server, keyed
        keyed.stop()
        open_server.stop()


def test_serve_prints_the_console_url(servers: tuple[Server, Server]) -> None:
    """The start-up output of `envfoundry serve` names the URL to open."""
    open_server, _ = servers
    assert f"console: {open_server.url}/ui/" in open_server.log.read_text()


def test_console_pages_forbid_inline_and_foreign_scripts(servers: tuple[Server, Server]) -> None:
    """The console is served with a content security policy, so markup in environment data cannot run."""
    open_server, _ = servers
    with open_server.client() as http:
        page = http.get("/ui/")
    assert page.status_code == 200 and "<main" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"


def test_the_root_address_opens_the_console(servers: tuple[Server, Server]) -> None:
    """`envfoundry serve` prints http://host:port; opening it leads to the console, not a 404."""
    open_server, _ = servers
    with open_server.client() as http:
        root = http.get("/")
        assert root.status_code == 307 and root.headers["location"] == "/ui/"
        assert "<main" in http.get("/", follow_redirects=True).text


def test_console_in_a_browser(servers: tuple[Server, Server], tmp_path_factory: pytest.TempPathFactory) -> None:
    """A user solves lib-001 by hand in the console and the score reaches 1.0; reports and the key prompt work."""
    node = shutil.which("node")
    missing = [what for what, ok in (("node", node), (CHROMIUM, Path(CHROMIUM).exists()),
                                     ("playwright-core", (CONSOLE_TESTS / "node_modules" / "playwright-core").exists()))
               if not ok]
    assert not missing, f"browser tests need {missing}: run scripts/browser-setup"
    open_server, keyed = servers
    shots = tmp_path_factory.mktemp("console-screenshots")
    print(f"\nconsole screenshots: {shots}")
    env = {**os.environ, "CONSOLE_URL": open_server.url, "CONSOLE_KEYED_URL": keyed.url, "CONSOLE_KEY": KEY,
           "CONSOLE_SHOTS": str(shots), "CONSOLE_SCENARIO": json.dumps(lib_001()), "CHROMIUM": CHROMIUM,
           "CONSOLE_ROLLOUT": str(HERE / "client" / "expected" / "rollout-task-native.jsonl"),
           "CONSOLE_HOSTILE_SCENARIO": add_hostile_scenario(open_server), "CONSOLE_HOSTILE_TEXT": HOSTILE,
           "CONSOLE_USER_LINES": json.dumps(USER_LINES),
           "CONSOLE_SYNTH": str(synth_folder(shots.parent / f"{shots.name}-input")),
           "CONSOLE_ROLLOUT_FAILED": str(failed_rollout(shots.parent / f"{shots.name}-failed.jsonl"))}
    result = subprocess.run([str(node), str(CONSOLE_TESTS / "console.test.mjs")], cwd=CONSOLE_TESTS, env=env,
                            capture_output=True, text=True, timeout=300)
    print(result.stdout)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
