"""verifiers' own ``vf-eval`` runs envfoundry scenarios through ``envfoundry-verifiers`` against a real server.

verifiers 0.4.0 (PyPI) and the client, installed editable, live in .venv-verifiers
(scripts/peer-venvs): verifiers pins mcp==2.0.0 and the service needs mcp>=2.3. One peer process
(verifiers_peer.py) makes every run, as ``vf-eval ARGS`` would. The model is the scripted
OpenAI-compatible server; the rewards come from the service's ``/score``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api.auth import new_key
from tests.client.agent_scripts import LIB_001, LIB_003_AS_TEXT, STORE_001
from tests.client.test_rollout import task
from tests.conftest import ROOT, Server, drop_keys, start_server
from tests.scripted_openai import Running

PEER = Path(__file__).with_name("verifiers_peer.py")
MODEL = "scripted-agent"
Runs = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def verifiers_python() -> Path:
    """The peer venv's interpreter (scripts/peer-venvs builds it once; scripts/test runs it first)."""
    subprocess.run([str(ROOT / "scripts" / "peer-venvs"), "verifiers"], check=True, timeout=900)
    return ROOT / ".venv-verifiers" / "bin" / "python"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    """A service that takes only its one key."""
    key, line = new_key("trainer", ["run"])
    tmp = tmp_path_factory.mktemp("keyed")
    (tmp / "keys.txt").write_text(line + "\n")
    server = start_server(tmp, extra_env={"ENVFOUNDRY_API_KEYS_FILE": str(tmp / "keys.txt")})
    yield server, key
    server.stop()


@dataclass
class Restarting:
    """A service (on Redis under a key prefix of its own, or on the memory store) that a run restarts."""

    servers: list[Server]
    redis_url: str | None
    prefix: str
    tmp: Path
    started: threading.Thread | None = None

    def restart(self) -> None:
        """Stop the service now; start it again on its port and store once it has been down 2 s, in a thread."""
        self.servers[-1].stop()

        def start() -> None:
            time.sleep(2)  # restarts take 1.7 to 5.5 s; the client's old 4 attempts gave up after 2 to 3.5
            self.servers.append(start_server(self.tmp, redis_url=self.redis_url, port=port_of(self.servers[-1]),
                                             extra_env={"ENVFOUNDRY_KEY_PREFIX": self.prefix}))

        self.started = threading.Thread(target=start)
        self.started.start()


def port_of(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def restarting(redis_url: str | None, tmp: Path) -> Iterator[Restarting]:
    prefix = f"eftest-{secrets.token_hex(4)}"
    service = Restarting([start_server(tmp, redis_url=redis_url, extra_env={"ENVFOUNDRY_KEY_PREFIX": prefix})],
                         redis_url, prefix, tmp)
    yield service
    if service.started is not None:
        service.started.join(60)
    service.servers[-1].stop()
    if redis_url:
        drop_keys(redis_url, prefix)


@pytest.fixture(scope="module")
def on_redis(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restarting]:
    yield from restarting(redis_url, tmp_path_factory.mktemp("redis-ef"))


@pytest.fixture(scope="module")
def on_memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restarting]:
    yield from restarting(None, tmp_path_factory.mktemp("memory-ef"))


def vf_eval_args(chat: Running, outputs: Path) -> list[str]:
    """What every run passes ``vf-eval``: the taskset, the scripted model, and no upload or dashboard."""
    return ["envfoundry-verifiers", "-m", MODEL, "--client.base-url", chat.url, "--client.api-key-var", "SCRIPTED_KEY",
            "--push", "False", "--rich", "None", "-o", str(outputs)]


def peer_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENVFOUNDRY_", "OPENAI_", "PRIME_"))}
    env.update(HOME=str(home), SCRIPTED_KEY="agent-key", **extra)  # verifiers keeps its cache and scratch under HOME
    return env


@pytest.fixture(scope="module")
def runs(verifiers_python: Path, ef_server: Server, keyed: tuple[Server, str], chat: Running,
         on_redis: Restarting, on_memory: Restarting, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Each run's outcome and episodes (traces.jsonl), by name, with the model requests its conversation made."""
    tmp = tmp_path_factory.mktemp("vf")
    lib, store = task(ef_server, "lib-001"), task(ef_server, "store-001")
    written = task(ef_server, "lib-003")
    # lib-001: track 0 solves it, track 1 does one part of three; store-001: the solving track, cut short;
    # lib-003: solved by calls written as text
    chat.script.reset({lib: LIB_001, store: STORE_001[:1], written: LIB_003_AS_TEXT})
    common = vf_eval_args(chat, tmp / "outputs")
    plan = {  # the runs are made in this order
        "solve": ["--env.taskset.scenario-ids", '["lib-001"]', "-r", "2"],
        "foreign": ["--env.taskset.env-ids", '["library_circulation"]', "--env.taskset.scenario-ids", '["store-001"]'],
        "cut": ["--env.taskset.scenario-ids", '["store-001"]',
                "--env.agent.harness.id", "envfoundry-verifiers", "--env.agent.harness.max-turns", "1"],
        "unscripted": ["--env.taskset.scenario-ids", '["lib-002"]'],  # the model answers 404 to this conversation
        "restart": ["--env.taskset.scenario-ids", '["lib-001"]', "-r", "2"],  # on Redis, restarted mid-run
        "keyed": ["--env.taskset.scenario-ids", '["lib-001"]'],  # the third lib-001 rollout: track 0 again
        "lost": ["--env.taskset.scenario-ids", '["lib-001"]', "-r", "2"],  # on memory, restarted: sessions lost
        "text": ["--env.taskset.scenario-ids", '["lib-003"]', "--env.taskset.idle-ttl-seconds", "30"],
        # the flag as the README gives it, without naming the harness
        "turns": ["--env.taskset.scenario-ids", '["lib-003"]', "--env.agent.max-turns", "1"],
    }
    keyed_server, key = keyed
    served = {"keyed": keyed_server, "restart": on_redis.servers[0], "lost": on_memory.servers[0]}
    argv = [{"name": name, "argv": [*common, "--run.dir", name, *extra, "--env.taskset.base-url",
                                    served.get(name, ef_server).url]}
            for name, extra in plan.items()]
    asked_of_lib = [0]

    def restart_mid_run(route: str) -> None:
        # solve asks five times about lib-001; the restart run's second request comes after its first calls
        if route == lib:
            asked_of_lib[0] += 1
            if asked_of_lib[0] == 7:
                on_redis.restart()
            if asked_of_lib[0] == 14:  # lost's first request: its sessions are open
                on_memory.restart()

    chat.script.before_answer = restart_mid_run
    done = subprocess.run([str(verifiers_python), str(PEER), json.dumps(argv)],
                          capture_output=True, text=True, cwd=tmp, env=peer_env(tmp, ENVFOUNDRY_API_KEY=key), timeout=300)
    chat.script.before_answer = None
    for service in (on_redis, on_memory):
        if service.started is not None:
            service.started.join(60)  # the service is back (the rollouts may have given up before it was)
    assert done.returncode == 0, done.stderr[-4000:]
    out: Runs = {}
    for line in done.stdout.splitlines():
        if line.startswith("RUN "):
            result = json.loads(line[4:])
            traces = tmp / "outputs" / result["name"] / "traces.jsonl"
            result["written"] = traces.read_text() if traces.exists() else ""
            result["episodes"] = [json.loads(e) for e in result["written"].splitlines()]
            out[result["name"]] = result
    asked = chat.script.agent_requests()
    of_lib = [r for r in asked if r.route == lib]  # the runs come one after the other: solve, restart, keyed, lost
    out["solve"]["asked"], out["restart"]["asked"], out["keyed"]["asked"] = of_lib[:5], of_lib[5:10], of_lib[10:13]
    out["cut"]["asked"] = [r for r in asked if r.route == store]
    of_text = [r for r in asked if r.route == written]
    out["text"]["asked"], out["turns"]["asked"] = of_text[:4], of_text[4:]
    return out


def played(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [trace for episode in run["episodes"] for trace in episode["traces"]]


def test_vf_eval_plays_lib_001_and_scores_each_rollout_with_the_service(runs: Runs, ef_server: Server) -> None:
    run = runs["solve"]
    assert run["exit"] == 0, run
    traces = played(run)
    assert len(traces) == 2 and all(t["ok"] and not t["errors"] for t in traces), traces
    assert sorted(t["rewards"]["checks"]["score"] for t in traces) == [pytest.approx(1 / 3), 1.0]
    assert sorted((t["metrics"]["checks_passed"], t["metrics"]["checks_total"]) for t in traces) == [(1, 3), (3, 3)]
    assert {t["task"]["key"] for t in traces} == {"lib-001"}
    # the model was offered the session's tools, natively, under the environment's introduction
    environment = httpx.get(f"{ef_server.url}/v1/environments/library_circulation").json()
    for t in traces:
        assert [tool["name"] for tool in t["tools"]] == [tool["function"]["name"] for tool in environment["tools"]]
    asked = run["asked"]
    assert len(asked) == 5  # track 0 answers three times, track 1 twice
    assert all(r.native and r.model == MODEL and r.authorization == "Bearer agent-key" for r in asked)
    assert all(r.messages[0]["role"] == "system" and environment["introduction"] in r.messages[0]["content"]
               for r in asked)
    # each tool message is the service's observation of that call, in the solved session
    solved = next(t for t in traces if t["rewards"]["checks"]["score"] == 1.0)
    messages = [node["message"] for node in solved["nodes"]]
    called = [c["name"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert called == ["list_member_loans", "return_book", "checkout_book", "renew_loan"]
    observations = [m["content"] for m in messages if m["role"] == "tool"]
    assert len(observations) == 4 and all(o.startswith('{"success": true') for o in observations), observations
    # each rollout's session was deleted after it was scored
    for t in traces:
        assert httpx.get(f"{ef_server.url}/v1/sessions/{t['info']['envfoundry_session_id']}").status_code == 404


def test_a_scenario_outside_the_chosen_environments_is_refused_by_name(runs: Runs) -> None:
    run = runs["foreign"]
    assert run["exit"] != 0 and run["episodes"] == []
    assert "scenario_ids not in the chosen environments ['library_circulation']: ['store-001']" in run["message"]


def test_calls_written_as_tool_call_text_reach_the_service_as_verifiers_parsers_read_them(
        runs: Runs, ef_server: Server) -> None:
    run = runs["text"]
    assert run["exit"] == 0, run
    (trace,) = played(run)
    assert trace["ok"] and not trace["errors"], trace
    assert trace["rewards"]["checks"]["score"] == 1.0  # the JSON and the XML blocks were both called
    session = trace["info"]["envfoundry_session_id"]
    asked = run["asked"]
    assert len(asked) == 4
    # each turn's calls came back as <tool_response> blocks: the service's observations, in order
    answers = [m["content"] for m in asked[-1].messages if m["role"] == "user"][1:]
    assert [a.count("<tool_response>") for a in answers] == [1, 3, 1]
    assert answers[1].count('{"success": true') == 3
    assert "Error: the call is not valid JSON" in answers[2] and "nothing was called" in answers[2]
    assert httpx.get(f"{ef_server.url}/v1/sessions/{session}").status_code == 404


def test_the_readmes_max_turns_flag_limits_the_rollout_without_naming_the_harness(runs: Runs) -> None:
    run = runs["turns"]
    assert run["exit"] == 0, run
    (trace,) = played(run)
    assert len(run["asked"]) == 1, trace  # one model turn, then the limit
    assert trace["rewards"]["checks"]["score"] < 1.0


def test_the_config_classes_are_exported_beside_the_parts(verifiers_python: Path) -> None:
    names = subprocess.run([str(verifiers_python), "-c", "import envfoundry_verifiers as m; print(*m.__all__)"],
                           capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert {"EnvfoundryTasksetConfig", "EnvfoundryHarnessConfig", "EnvfoundryEnvConfig"} <= set(names)


def test_the_harness_stops_a_rollout_at_its_turn_limit_and_still_scores_it(runs: Runs, ef_server: Server) -> None:
    run = runs["cut"]
    assert run["exit"] == 0, run
    (trace,) = played(run)
    assert trace["stop_condition"] == "max_turns" and not trace["errors"]
    assert len(run["asked"]) == 1  # one turn: the order is placed, never paid
    assert (trace["metrics"]["checks_passed"], trace["metrics"]["checks_total"]) == (2, 3)  # all but the payment
    assert trace["rewards"]["checks"]["score"] == pytest.approx(2 / 3)
    assert httpx.get(f"{ef_server.url}/v1/sessions/{trace['info']['envfoundry_session_id']}").status_code == 404


def test_a_failing_model_ends_the_rollout_unscored_and_its_session_is_still_deleted(
        runs: Runs, ef_server: Server) -> None:
    run = runs["unscripted"]
    assert run["exit"] == 0, run  # the eval goes on; the failure is the rollout's
    (trace,) = played(run)
    assert not trace["ok"] and trace["stop_condition"] == "provider_error" and trace["rewards"] == {}
    (error,) = trace["errors"]
    assert error["type"] == "ProviderError" and error["status_code"] == 404
    assert httpx.get(f"{ef_server.url}/v1/sessions/{trace['info']['envfoundry_session_id']}").status_code == 404


def test_the_key_from_the_environment_reaches_a_keyed_service_and_no_trace(runs: Runs, keyed: tuple[Server, str]) -> None:
    server, key = keyed
    run = runs["keyed"]
    assert run["exit"] == 0, run
    (trace,) = played(run)
    assert trace["ok"] and not trace["errors"] and trace["rewards"]["checks"]["score"] == 1.0
    assert len(run["asked"]) == 3 and key not in run["written"]
    assert httpx.post(f"{server.url}/v1/sessions", json={"scenario_id": "lib-001"}).status_code == 401


def test_a_restart_mid_run_on_redis_is_invisible_to_the_rollouts(runs: Runs, on_redis: Restarting) -> None:
    run = runs["restart"]
    assert run["exit"] == 0, run
    assert len(on_redis.servers) == 2  # it did restart, while the rollouts were calling tools
    traces = played(run)
    assert len(traces) == 2 and all(t["ok"] and not t["errors"] for t in traces), traces
    assert sorted(t["rewards"]["checks"]["score"] for t in traces) == [pytest.approx(1 / 3), 1.0]
    assert len(run["asked"]) == 5  # as without a restart
    for t in traces:  # each session deleted after scoring, on the restarted service
        assert httpx.get(f"{on_redis.servers[-1].url}/v1/sessions/{t['info']['envfoundry_session_id']}").status_code == 404


def test_sessions_lost_in_a_memory_store_restart_end_their_rollouts_unscored_saying_so(
        runs: Runs, on_memory: Restarting) -> None:
    run = runs["lost"]
    assert run["exit"] == 0, run  # the eval goes on; the failures are the rollouts'
    traces = played(run)
    assert len(traces) == 2 and len(on_memory.servers) == 2
    for trace in traces:
        assert not trace["ok"] and trace["rewards"] == {} and trace["stop_condition"] == "harness_error"
        (error,) = trace["errors"]
        session = trace["info"]["envfoundry_session_id"]
        assert f"envfoundry session {session} is gone: the service restarted on a memory store" in error["message"]


@pytest.fixture
def alone(redis_url: str, tmp_path: Path) -> Iterator[Server]:
    """A service on Redis under a key prefix of its own: every session it lists is the run's."""
    prefix = f"eftest-{secrets.token_hex(4)}"
    server = start_server(tmp_path, redis_url=redis_url, extra_env={"ENVFOUNDRY_KEY_PREFIX": prefix})
    yield server
    server.stop()
    drop_keys(redis_url, prefix)


def live_sessions(server: Server) -> list[str]:
    return [s["session_id"] for s in httpx.get(f"{server.url}/v1/sessions").json()["sessions"]]


@pytest.mark.timeout(300)
def test_sigterm_mid_run_ends_vf_eval_and_deletes_every_session_of_the_run(
        verifiers_python: Path, chat: Running, alone: Server, tmp_path: Path) -> None:
    lib = task(alone, "lib-001")
    chat.script.reset({lib: LIB_001})
    reached, answer = threading.Event(), threading.Event()
    asked = [0]

    def hold_third_request(route: str) -> None:
        # two rollouts open with two requests; the third follows a turn's tool calls, and neither
        # rollout can end before it is answered. Holding it holds the scripted server, so the run
        # stands still with both sessions open.
        if route == lib:
            asked[0] += 1
            if asked[0] == 3:
                reached.set()
                answer.wait(120)

    args = [*vf_eval_args(chat, tmp_path / "outputs"), "--run.dir", "term", "--env.taskset.base-url", alone.url,
            "--env.taskset.scenario-ids", '["lib-001"]', "-r", "2"]
    log = tmp_path / "vf-eval.log"
    chat.script.before_answer = hold_third_request
    # vf-eval in a process group of its own, signalled as a whole, as a scheduler stops a job
    with log.open("w") as out:
        run = subprocess.Popen([str(verifiers_python.parent / "vf-eval"), *args], cwd=tmp_path,
                               env=peer_env(tmp_path), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert reached.wait(180), log.read_text()[-4000:]
        deadline = time.monotonic() + 30
        while len(opened := live_sessions(alone)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(opened) == 2, opened
        os.killpg(run.pid, signal.SIGTERM)
        answer.set()
        code = run.wait(60)
    finally:
        answer.set()
        chat.script.before_answer = None
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    # leases deletes the held sessions in its SIGTERM handler, then hands the signal to verifiers', which
    # raises KeyboardInterrupt: every rollout unwinds through its cleanup (finding its session gone) and
    # vf-eval exits 130, not by the signal. (The cleanups alone delete them too; leases is there for a
    # process whose own handler does not unwind.)
    assert code == 130, log.read_text()[-4000:]
    assert (tmp_path / "outputs" / "term" / "traces.jsonl").read_text() == ""  # nothing scored, nothing half-written
    assert live_sessions(alone) == []
    for session_id in opened:
        assert httpx.get(f"{alone.url}/v1/sessions/{session_id}").status_code == 404
