"""tests/trainers' server: one, on the memory store, with a 1 s OpenEnv grace; tests restart it in place."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, Server, server_command, start_server

GRACE = 1.0  # ENVFOUNDRY_OPENENV_GRACE of the server below (test_openenv_orphans.py waits it out)
SETTINGS = {"ENVFOUNDRY_OPENENV_GRACE": str(GRACE)}


@pytest.fixture(scope="package")
def memory_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    """One server on the memory store for tests/trainers; a test that restarts it appends the new one."""
    servers = [start_server(tmp_path_factory.mktemp("lifecycle"), extra_env=SETTINGS)]
    yield servers
    servers[-1].stop()


def port_of(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def restart(servers: list[Server], tmp: Path, wait: bool = True) -> None:
    """Stop the server and start it again on its port: ready when this returns, or (wait False) still starting."""
    servers[-1].stop()
    if wait:
        servers.append(start_server(tmp, port=port_of(servers[-1]), extra_env=SETTINGS))
        return
    args, env = server_command(port_of(servers[-1]), extra_env=SETTINGS)
    log = tmp / "restarted.log"
    with log.open("ab") as out:
        servers.append(Server(servers[-1].url, subprocess.Popen(args, env=env, cwd=ROOT, stdout=out,
                                                                stderr=subprocess.STDOUT), log))
