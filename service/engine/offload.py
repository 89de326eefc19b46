"""CPU-heavy work the API process must not do on its event loop, done in a small process pool.

Building the JSON view of a large state (millions of values, deep nesting) takes
seconds of pure Python; on the event loop it would stall every other client.
Small states are cheaper to view in place than to ship to another process, but a small state can
still have a large view (an object shared by many dict keys is shown in full under each): a state
is viewed in place only within a budget of ``INLINE_NODES`` (the view's own measure, keys' items
included, see ``sandbox/state/view.py``); one that would pass it is viewed in the pool.
The pool runs trusted service code on data only: nothing from an environment is
executed there (the view never unpickles).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from sandbox.state import view
from sandbox.worker.randomness import HIDDEN

INLINE_BYTES = 64 * 1024
INLINE_NODES = 20_000


class ViewError(Exception):
    """The state cannot be shown as JSON within the service's bounds."""


def state_view_json(encoded: str) -> str:
    """The client's JSON view of an encoded state, as JSON text. Runs in a pool process or inline."""
    try:
        return json.dumps(view.view_encoded(_shown(encoded)), ensure_ascii=False, separators=(",", ":"))
    except RecursionError as exc:
        raise ViewError("the state is nested too deeply to show as JSON") from exc


def _shown(encoded: str) -> Any:
    """A parsed state without the session's stored randomness, which is the sandbox's, not the state's."""
    parsed = json.loads(encoded)
    if isinstance(parsed, dict):
        parsed.pop(HIDDEN, None)
    return parsed


class Offload:
    def __init__(self, workers: int = 1, timeout: float = 30.0) -> None:
        self.workers = workers
        self.timeout = timeout
        self._executor: ProcessPoolExecutor | None = None

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            # spawn: a clean interpreter, not a copy of the API process with its sockets and threads
            self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._executor

    async def state_view(self, encoded: str) -> str:
        """Raises ViewError: the view fails or takes longer than the timeout."""
        if len(encoded) <= INLINE_BYTES:
            shown = view.view_encoded_within(_shown(encoded), INLINE_NODES)
            if shown is not view.OVER:
                return json.dumps(shown, ensure_ascii=False, separators=(",", ":"))
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._pool(), state_view_json, encoded), self.timeout)
        except TimeoutError as exc:
            self._restart()
            raise ViewError(f"building the state's JSON view took longer than {self.timeout:g} s") from exc
        except BrokenProcessPool as exc:
            self._restart()
            raise ViewError("building the state's JSON view ran out of resources") from exc

    def _restart(self) -> None:
        """Drop a pool whose process is stuck or dead; the next request starts a fresh one."""
        if self._executor is not None:
            for process in list(getattr(self._executor, "_processes", {}).values()):
                process.kill()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
