"""TRL's own GRPOTrainer trains on envfoundry through the factory's class, and survives a real run.

trl 1.16, transformers and torch (CPU) live in .venv-trl (scripts/peer-venvs); trl_peer.py runs
the trainer there with a tiny random model whose generation is scripted (see its docstring), against
a real server this test owns and restarts. What a long run meets (issue 32):

- the service restarts mid-run (Redis store): the rollouts' calls find no server for a few seconds
  and the client's retries ride over it, so every rollout still scores 1.0;
- arguments as the model wrote them reach the service: a misspelled one gets the service's hint
  and is a step of the session;
- SIGTERM mid-run, and a normal exit, leave no session open.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, Server, drop_keys, start_server

PEER = Path(__file__).with_name("trl_peer.py")
MISSPELLED = [{"name": "return_book", "arguments": {"loan": "L0003"}}]
HINT = "unexpected argument 'loan' (did you mean 'loan_id'?)"


@pytest.fixture(scope="module")
def trl_python() -> Path:
    """The peer venv's interpreter (scripts/peer-venvs builds it once; scripts/test runs it first)."""
    subprocess.run([str(ROOT / "scripts" / "peer-venvs"), "trl"], check=True, timeout=1800)
    return ROOT / ".venv-trl" / "bin" / "python"


class Peer:
    """The trainer process; reads its lines as they come and acts on RESTART and PAUSED."""

    def __init__(self, python: Path, config: dict[str, Any], on_line: dict[str, Any]) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen([str(python), str(PEER), json.dumps(config)], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self._on_line = on_line
        self._stderr: list[str] = []
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=lambda: self._stderr.extend(self.process.stderr or []), daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self) -> None:
        for line in self.process.stdout or []:
            self.lines.append(line.rstrip("\n"))
            action = self._on_line.get(line.split(" ", 1)[0].strip())
            if action is not None:
                action()

    def wait(self, timeout: float = 300) -> int:
        try:
            code = self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        for reader in self._readers:
            reader.join(10)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()
        return code

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)[-4000:]

    def sessions(self) -> list[str]:
        return [line.split()[1] for line in self.lines if line.startswith("SESSION ")]

    def result(self) -> dict[str, Any]:
        found = [line[len("RESULT "):] for line in self.lines if line.startswith("RESULT ")]
        assert found, self.stderr
        return json.loads(found[-1])


def left_open(server: Server, sessions: list[str]) -> list[str]:
    return [sid for sid in sessions if httpx.get(f"{server.url}/v1/sessions/{sid}").status_code != 404]


@pytest.fixture(scope="module")
def prefix(redis_url: str) -> Iterator[str]:
    """The module's own key namespace (removed afterwards)."""
    name = f"eftest-{secrets.token_hex(4)}"
    yield name
    drop_keys(redis_url, name)


@pytest.fixture(scope="module")
def redis_server(redis_url: str, prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    """A server on Redis for the module; a restart appends the new one (the last runs)."""
    servers = [start_server(tmp_path_factory.mktemp("trl"), redis_url=redis_url,
                            extra_env={"ENVFOUNDRY_KEY_PREFIX": prefix})]
    yield servers
    servers[-1].stop()


def test_a_restart_mid_run_on_redis_is_invisible_and_arguments_reach_the_service(
        trl_python: Path, redis_server: list[Server], redis_url: str, prefix: str, tmp_path: Path) -> None:
    first = redis_server[-1]
    port = int(first.url.rsplit(":", 1)[1])

    def restart() -> None:
        # a real restart, on the same port and store; the trainer's calls meanwhile find nobody, for 2 s
        # at least (restarts take 1.7 to 5.5 s; the client's old 4 attempts gave up after 2 to 3.5)
        redis_server[-1].stop()
        time.sleep(2)
        redis_server.append(start_server(tmp_path, redis_url=redis_url, port=port,
                                         extra_env={"ENVFOUNDRY_KEY_PREFIX": prefix}))

    # one step: two rollouts of five turns (the misspelled call, lib-001's three calls, the answer);
    # the restart comes at the third turn, after two calls of each rollout
    peer = Peer(trl_python, {"url": first.url, "env_id": "library_circulation", "scenarios": ["lib-001"],
                             "steps": 1, "misspelled": MISSPELLED, "restart_at": 3}, {"RESTART": restart})
    assert peer.wait() == 0, peer.stderr
    result = peer.result()
    assert redis_server[-1] is not first  # it did restart
    assert result["rewards"] == [1.0, 1.0], result
    assert result["warnings"] == []
    # the misspelled call reached the service: its hint came back, and it is a step of the session
    assert result["steps"] == [4, 4]
    assert sum(HINT in seen for seen in result["observations"]) == 2
    # a normal exit leaves nothing open: TRL keeps the last batch's instances, and their sessions
    assert len(peer.sessions()) == 2 and left_open(redis_server[-1], peer.sessions()) == []


def test_sigterm_mid_run_closes_every_session(trl_python: Path, redis_server: list[Server]) -> None:
    server = redis_server[-1]

    def terminate() -> None:
        peer.process.send_signal(signal.SIGTERM)

    # the first step's rollouts have made their first calls when the scheduler's SIGTERM comes
    peer = Peer(trl_python, {"url": server.url, "env_id": "library_circulation", "scenarios": ["lib-001"],
                             "steps": 1, "pause_at": 2}, {"PAUSED": terminate})
    assert peer.wait() == -signal.SIGTERM, peer.stderr  # still ended by the signal, as it was sent
    assert len(peer.sessions()) == 2
    assert left_open(server, peer.sessions()) == []
