"""A real Redis Cluster of Debian's redis-server on loopback: three masters, one replica each, in a temp dir."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.crc import key_slot

from tests.conftest import free_port

# Short enough that a failover in a test takes seconds, long enough not to flap on a busy machine.
NODE_TIMEOUT_MS = 3000


def _wait(what: str, ready: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis cluster: {what} within {timeout:g} s")
        time.sleep(0.1)


@dataclass
class Cluster:
    folder: Path
    ports: list[int] = field(default_factory=list)
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def nodes(self) -> str:
        """The ENVFOUNDRY_REDIS_CLUSTER_NODES form."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    @property
    def url(self) -> str:
        """The single-URL form: one entry node; the client discovers the rest."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_connect_timeout=1, socket_timeout=2, decode_responses=True)

    def start(self, masters: int = 3) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.ports = [free_port() for _ in range(masters * 2)]
        for port in self.ports:
            home = self.folder / str(port)
            home.mkdir(parents=True)
            with (home / "redis.log").open("wb") as log:
                self.processes[port] = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(home),
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-port", str(free_port()),  # the default port+10000 can overflow
                 "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                 # a replica may take over however long its master has been gone (the test kills masters)
                 "--cluster-replica-validity-factor", "0", "--save", "", "--appendonly", "no"],
                stdout=log, stderr=subprocess.STDOUT)
        for port in self.ports:
            _wait(f"node {port} did not answer", self.node(port).ping, 15)
        created = subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", "1", "--cluster-yes"], capture_output=True, text=True, timeout=60)
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout}{created.stderr}")
        _wait("the cluster did not become ok", self.healthy, 30)

    def healthy(self) -> bool:
        alive = [p for p in self.ports if self.processes[p].poll() is None]
        if not all("cluster_state:ok" in self._command(p, "CLUSTER", "INFO") for p in alive):
            return False
        if not all(len(self.replicas_of(p)) >= 1 for p in self.masters()):
            return False
        # every replica has finished its first sync, so it holds what its master acknowledged
        replicas = [p for m in self.masters() for p in self.replicas_of(m)]
        return all(self.node(p).info("replication").get("master_link_status") == "up" for p in replicas)

    def _command(self, port: int, *args: str) -> str:
        return str(self.node(port).execute_command(*args))  # type: ignore[no-untyped-call]

    def master_of(self, key: str) -> int:
        """The port of the master serving ``key``'s slot now."""
        slot = key_slot(key.encode())
        for f in self._view():
            if "master" in f[2] and "fail" not in f[2]:
                for span in f[8:]:
                    low, _, high = span.partition("-")
                    if int(low) <= slot <= int(high or low):
                        return int(f[1].split(":")[1].split("@")[0])
        raise RuntimeError(f"redis cluster: no master serves slot {slot}")

    def _view(self) -> list[list[str]]:
        port = next(p for p in self.ports if self.processes[p].poll() is None)
        text = self._command(port, "CLUSTER", "NODES")
        return [line.split() for line in str(text).splitlines() if line.strip()]

    def masters(self) -> list[int]:
        return [int(f[1].split(":")[1].split("@")[0]) for f in self._view()
                if "master" in f[2] and "fail" not in f[2]]

    def replicas_of(self, port: int) -> list[int]:
        view = self._view()
        ident = next(f[0] for f in view if int(f[1].split(":")[1].split("@")[0]) == port)
        return [int(f[1].split(":")[1].split("@")[0]) for f in view if f[3] == ident and "fail" not in f[2]]

    def kill(self, port: int) -> None:
        """kill -9: no chance to hand anything over."""
        os.kill(self.processes[port].pid, signal.SIGKILL)
        self.processes[port].wait(10)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
