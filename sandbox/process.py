"""The process backend: each worker is a local OS process that confines itself.

The service runs as root in production images and on CI here, so each worker
gets a uid of its own (``uid_base + slot``), which also makes the kernel's
per-uid process limit a per-worker one.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from sandbox.pool import Channel, Limits
from sandbox.protocol import HEADER, frame_length

WORKER = Path(__file__).with_name("worker.py")
# Nothing of the service's environment (REDIS_URL, API keys) reaches a worker.
WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": "/tmp", "HOME": "/tmp"}


class ProcessChannel:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self._writer = process.stdin
        self._reader = process.stdout

    async def send(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def receive(self) -> bytes:
        header = await self._reader.readexactly(HEADER.size)
        return await self._reader.readexactly(frame_length(header))

    async def kill(self) -> None:
        if self.process.returncode is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass
        await self.process.wait()


class ProcessBackend:
    name = "process"

    def __init__(self, python: str | None = None, uid_base: int = 61000) -> None:
        self.python = python or sys.executable
        self.uid_base = uid_base

    async def spawn(self, slot: int, limits: Limits) -> Channel:
        uid = self.uid_base + slot
        process = await asyncio.create_subprocess_exec(
            self.python, "-S", "-E", "-s", "-B", str(WORKER),
            "--uid", str(uid), "--gid", str(uid),
            "--memory-mb", str(limits.memory_mb),
            "--open-files", str(limits.open_files),
            "--processes", str(limits.processes),
            "--tmp-mb", str(limits.tmp_mb),
            "--output-bytes", str(limits.output_bytes),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=WORKER_ENV,
            cwd="/",
            limit=1 << 20,
        )
        return ProcessChannel(process)

    async def close(self) -> None:
        return None


def available() -> bool:
    return os.name == "posix"
