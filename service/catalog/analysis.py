"""Static analysis of submitted environment code, in a child process with time and memory bounds.

Extracting tool schemas parses the class and its docstrings; nothing is executed,
but a hostile submission (a 12,000-way ``Union``, a pathological docstring, an
enormous syntax tree) can still take seconds and gigabytes. The API process
hands the code to ``python -m service.catalog.analysis`` and waits without blocking its
event loop; the child is killed at the time limit and capped in memory, and only
a few run at once. Slots go to the waiting tenant that holds fewest (``FairGate``), so one
tenant's queue of submissions makes another's wait for at most one analysis.

The child reads ``{"class_name", "code"}`` as JSON on stdin and writes
``{"tools": [...], "imports": [...]}`` (imports beyond the standard library) or ``{"error": {"reason", "message"}}``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import resource
import sys
import time
from typing import TYPE_CHECKING, Any

from sandbox.fairness import FairGate, NoSlot
from service.catalog.admission import build_environment
from service.catalog.model import CatalogError, Environment

if TYPE_CHECKING:  # the child runs without site-packages (-S): the service's own imports stay out of it
    from service.observability import Metrics

# The bounds' defaults; settings reach each (ENVFOUNDRY_ANALYSIS_*, see service.server.settings).
TIMEOUT = 10.0
MEMORY_MB = 1024
CONCURRENT = 2
WAIT = 60.0
# The analysed schemas are stored with the environment and sent to every client listing its tools.
MAX_TOOLS = 256
MAX_TOOLS_BYTES = 1 << 20


class Analysis:
    def __init__(self, timeout: float = TIMEOUT, concurrent: int = CONCURRENT, wait: float = WAIT,
                 metrics: Metrics | None = None, *, memory_mb: int = MEMORY_MB, max_tools: int = MAX_TOOLS,
                 max_tools_bytes: int = MAX_TOOLS_BYTES) -> None:
        self.timeout = timeout
        self.wait = wait
        self.metrics = metrics
        self.memory_bytes = memory_mb << 20
        self.max_tools = max_tools
        self.max_tools_bytes = max_tools_bytes
        self._slots = FairGate(concurrent)

    async def environment(self, *, env_id: str, class_name: str, code: str, summary: str, introduction: str,
                          rules: list[str], tenant: str = "", requirements: list[str] | None = None) -> Environment:
        """Raises CatalogError naming the reason (syntax, missing class, a bound); Unavailable when no
        analysis slot came free within the wait."""
        started = time.perf_counter()
        try:
            async with self._slots.slot(tenant, self.wait):
                if self.metrics is not None:
                    self.metrics.analysis_wait.observe(time.perf_counter() - started)
                tools, imports = await self._tools(class_name, code)
        except NoSlot:
            from service.errors import Unavailable

            raise Unavailable(f"no code-analysis slot came free within {self.wait:g} s; retry") from None
        if len(tools) > self.max_tools:
            raise CatalogError(f"the class has {len(tools)} public methods; at most {self.max_tools} tools",
                               field="code", reason="max_tools")
        if len(json.dumps(tools)) > self.max_tools_bytes:
            raise CatalogError(f"the tool schemas exceed {self.max_tools_bytes} bytes", field="code",
                               reason="max_tools_bytes")
        return Environment(env_id=env_id, class_name=class_name, code=code, summary=summary,
                           introduction=introduction, rules=list(rules), tools=tools,
                           requirements=list(requirements or []), imports=imports)

    async def _tools(self, class_name: str, code: str) -> tuple[list[dict[str, Any]], list[str]]:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-S", "-m", "service.catalog.analysis", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, preexec_fn=functools.partial(_limit_memory, self.memory_bytes),
            cwd=_root(),
        )
        request = json.dumps({"class_name": class_name, "code": code}).encode()
        try:
            out, _ = await asyncio.wait_for(child.communicate(request), self.timeout)
        except TimeoutError:
            child.kill()
            await child.wait()
            raise CatalogError(f"analysing the code took longer than {self.timeout:g} s", field="code",
                               reason="analysis_timeout") from None
        try:
            answer = json.loads(out)
        except ValueError:
            raise CatalogError("the code could not be analysed within the memory bound", field="code",
                               reason="analysis_failed") from None
        if "error" in answer:
            raise CatalogError(answer["error"]["message"], field="code", reason=answer["error"]["reason"])
        tools: list[dict[str, Any]] = answer["tools"]
        return tools, [str(name) for name in answer.get("imports", [])]


def _limit_memory(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _root() -> str:
    import os

    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    try:
        env = build_environment(env_id="analysis", class_name=request["class_name"], code=request["code"])
        answer: dict[str, Any] = {"tools": env.tools, "imports": env.imports}
    except CatalogError as exc:
        answer = {"error": {"reason": exc.reason or "invalid", "message": exc.message}}
    except (MemoryError, RecursionError) as exc:
        answer = {"error": {"reason": "analysis_failed", "message": f"the code is too large to analyse "
                                                                    f"({type(exc).__name__})"}}
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
