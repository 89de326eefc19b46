"""The factory's rollouts through a restart, across processes, and out of every kind of exit (issue 32).

Real servers in subprocesses, restarted for real; the client runs here or in a child process that
ends the way a training run does. No trainer is needed for what is checked here (test_trl.py runs
TRL's own), so these stay fast.
"""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from envfoundry_client import Client, Retry, TransportError
from envfoundry_client.factory import RolloutFailed, environment_factory

from tests.conftest import ROOT, Server, free_port, interruptible
from tests.trainers.conftest import restart


def test_a_session_lost_in_a_memory_store_restart_fails_its_rollout_with_a_reason(
        memory_server: list[Server], tmp_path: Path) -> None:
    Library = environment_factory(memory_server[-1].url, "library_circulation")
    env = Library()
    env.reset(scenario_id="lib-001")
    lost = env.session_id
    restart(memory_server, tmp_path)  # a memory store forgets every session
    with pytest.raises(RolloutFailed, match=f"session {lost} .*is gone: the service restarted"):
        env.return_book(loan_id="L0003")  # what TRL shows the model
    with pytest.warns(RuntimeWarning, match="not scored: .*restarted on a memory store"):
        assert env.get_reward() is None  # not a crash of train(): TRL leaves a None reward out
    assert env.failure is not None and lost in env.failure
    env.reset(scenario_id="lib-001")  # the next rollout starts afresh
    assert env.failure is None and env.return_book(loan_id="L0003").startswith('{"success": true')
    assert env.get_reward() == pytest.approx(1 / 3)


def test_the_client_waits_out_a_restart_within_its_time_budget(memory_server: list[Server], tmp_path: Path) -> None:
    with Client(memory_server[0].url) as ef:
        assert ef.config.retry.seconds == 30.0  # the default budget
        restart(memory_server, tmp_path, wait=False)
        assert ef.health() == "ok"  # sent while nothing listens yet; answered once the server is up
    with Client(f"http://127.0.0.1:{free_port()}", retry=Retry(seconds=0.3)) as ef, \
            pytest.raises(TransportError, match=r"\(after \d+ attempts\)"):
        ef.health()  # nobody there: a short budget gives up soon, and says how often it tried


def test_the_class_pickles_and_an_instance_pickles_without_its_session(memory_server: list[Server]) -> None:
    Library = environment_factory(memory_server[-1].url, "library_circulation")
    Again = pickle.loads(pickle.dumps(Library))  # what TRL's AsyncGRPOTrainer does to send it to its workers
    assert Again.__name__ == Library.__name__ and Again.__doc__ == Library.__doc__
    env = Again()
    env.reset(scenario_id="lib-001")
    env.return_book(loan_id="L0003")
    assert env.get_reward() == pytest.approx(1 / 3)
    copy = pickle.loads(pickle.dumps(env))
    assert type(copy).__name__ == "LibraryCirculation" and copy.session_id is None


CHILD = """
import os, signal, sys, time
from envfoundry_client.factory import environment_factory
how = sys.argv[2]
if how == "sighup-chained":
    signal.signal(signal.SIGHUP, lambda *_: print("PREVIOUS", flush=True) or sys.exit(3))
Library = environment_factory(sys.argv[1], "library_circulation")
envs = [Library(), Library()]
for env in envs:
    env.reset(scenario_id="lib-001")
    print("SESSION", env.session_id, flush=True)
if how == "exception":
    raise RuntimeError("the training loop failed")
if how == "sigint":
    os.kill(os.getpid(), signal.SIGINT)
if how == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
if how == "sighup-chained":
    os.kill(os.getpid(), signal.SIGHUP)
time.sleep(30)
"""


@pytest.mark.parametrize(("how", "code"), [("exception", 1), ("sigint", -signal.SIGINT), ("sigterm", -signal.SIGTERM),
                                          ("sighup-chained", 3), ("normal", 0)])
def test_no_exit_leaves_a_session_open(memory_server: list[Server], how: str, code: int) -> None:
    server = memory_server[-1]
    script = CHILD if how != "normal" else CHILD.replace("time.sleep(30)", "")
    done = subprocess.run([sys.executable, "-c", script, server.url, how], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, preexec_fn=interruptible)
    assert done.returncode == code, done.stderr
    sessions = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("SESSION ")]
    assert len(sessions) == 2
    assert [httpx.get(f"{server.url}/v1/sessions/{sid}").status_code for sid in sessions] == [404, 404]
    if how == "sighup-chained":
        assert "PREVIOUS" in done.stdout  # the handler that was there before still ran, after the sessions closed
