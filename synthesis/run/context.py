"""What every stage works with: config, workspace, LLM client, the sandbox pool, and the item runner."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

from sandbox.errors import SandboxError
from sandbox.pool.requests import WorkerPool
from synthesis.errors import ConfigError, Dropped, EndpointUnusable, SynthesisError
from synthesis.llm.cache import ResponseCache
from synthesis.llm.client import LLMClient
from synthesis.llm.dialogue import REASKS
from synthesis.llm.usage import Ledger
from synthesis.run.config import SynthConfig
from synthesis.run.progress import Progress
from synthesis.run.report import DROPPED, FAILED, KEPT, StageReport
from synthesis.run.workspace import RecordFile, Workspace

Work = Callable[[str], Awaitable[dict[str, Any]]]


class Context:
    def __init__(self, config: SynthConfig, out: Path, *, api_key: str | None, stream: TextIO, use_cache: bool = True) -> None:
        self.config = config
        self.workspace = Workspace(out)
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
        self.ledger = Ledger(config.prices, journal=self.workspace.usage, run=self.run_id)
        cache = ResponseCache(self.workspace.cache) if use_cache else None
        self.client = LLMClient(config, self.ledger, api_key=api_key, cache=cache)
        self.stream = stream
        self._pool: WorkerPool | None = None
        self._pool_lock = asyncio.Lock()  # items ask for the pool concurrently; start it once

    async def pool(self) -> WorkerPool:
        """The sandbox pool, started on first use with the service's own limits."""
        async with self._pool_lock:
            if self._pool is None:
                from service.server.app import make_pool
                from service.server.settings import Settings

                pool = make_pool(Settings(workers=self.config.run.sandbox_workers))
                await pool.start()
                self._pool = pool
            return self._pool

    async def close(self) -> None:
        await self.client.aclose()
        self.ledger.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    def note(self, stage: str, text: str) -> None:
        """A progress line inside an item (an assessment round, a scenario validation): long items are not silent."""
        clear = "\r\x1b[K" if getattr(self.stream, "isatty", lambda: False)() else ""  # over a drawn progress bar
        self.stream.write(f"{clear}[{stage:<10}] {text}\n")
        self.stream.flush()

    def required(self, records: RecordFile, earlier: str, keys: set[str]) -> None:
        """Refuse to run a stage whose input is missing: the earlier stage never ran, or kept nothing in scope.

        Raises:
            ConfigError: naming the stage to run first.
        """
        if not records.path.is_file():
            first = self._first_missing(earlier)
            raise ConfigError(f"no {first} output in {self.workspace.work}: run `synth {first}` first")
        if not keys:
            raise ConfigError(f"`synth {earlier}` kept nothing (in scope) to work on; see its records in {records.path}")

    def _first_missing(self, earlier: str) -> str:
        """The first stage up to ``earlier`` whose output is missing: on an empty folder, ``themes``."""
        ws = self.workspace
        outputs = {"themes": ws.environments, "skeletons": ws.skeletons.path, "assess": ws.assessments.path}
        return next((stage for stage, path in outputs.items() if not path.is_file()), earlier)

    async def run_items(self, stage: str, keys: list[str], records: RecordFile, work: Work) -> StageReport:
        """Run ``work(key)`` for every key without a finished record, ``run.concurrency`` at a time.

        Kept and dropped items are finished: a rerun skips them. Failed items are
        tried again. ``work`` returns the record's fields (``status`` included) or
        raises ``Dropped``; any other ``SynthesisError`` or a sandbox error fails
        that item only. ``EndpointUnusable`` and bugs (any other exception) stop
        the run: the items in progress are cancelled and get no record.

        Raises:
            EndpointUnusable: from the first item that met it.
        """
        existing = records.load()
        report = StageReport(stage)
        progress = Progress(stage, len(keys), self.stream)
        todo = []
        for key in keys:
            record = existing.get(key)
            if record is not None and record.get("status") in (KEPT, DROPPED):
                report.count(record, resumed=True)
                progress.update("resumed")
            else:
                todo.append(key)
        slots = asyncio.Semaphore(self.config.run.concurrency)

        async def one(key: str) -> None:
            async with slots:
                record = await _attempt(key, work)
            records.append(record)
            report.count(record)
            progress.update(str(record["status"]))

        try:
            async with asyncio.TaskGroup() as group:
                for key in todo:
                    group.create_task(one(key))
        except BaseExceptionGroup as group:
            stop = group.subgroup(EndpointUnusable)
            if stop is not None:
                raise _first_leaf(stop) from None
            raise
        finally:
            progress.close()
        return report


def _first_leaf(group: BaseExceptionGroup[EndpointUnusable]) -> EndpointUnusable:
    leaf = group.exceptions[0]
    return _first_leaf(leaf) if isinstance(leaf, BaseExceptionGroup) else leaf


async def _attempt(key: str, work: Work) -> dict[str, Any]:
    started = time.monotonic()
    reasks: list[dict[str, Any]] = []
    REASKS.set(reasks)  # this item's task (and the tasks it starts) only
    try:
        fields = await work(key)
    except EndpointUnusable:
        raise
    except Dropped as exc:
        fields = {"status": DROPPED, "reason": exc.reason, "detail": exc.detail}
    except SynthesisError as exc:
        fields = {"status": FAILED, "error": exc.message}
    except SandboxError as exc:
        fields = {"status": FAILED, "error": f"sandbox: {exc.message}"}
    if reasks:
        fields = {**fields, "reasks": reasks}
    return {"key": key, **fields, "seconds": round(time.monotonic() - started, 3)}
