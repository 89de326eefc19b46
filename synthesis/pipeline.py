"""Running stages in order and writing the run summary.

    themes     judge corpus tasks, then deduplicate (stage 1)
    skeletons  plan and write each environment class (stage 2)
    assess     dual-agent assessment in the sandbox (stage 3)
    scenarios  generate and validate scenarios (stages 4 and 5), then publish the catalog

Each stage reads the previous stage's records and writes its own, so any
stage can be rerun alone, and ``all`` after an interruption resumes.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from synthesis import assess, dedup, publish, scenarios, skeleton, themes
from synthesis.config import SynthConfig
from synthesis.context import Context
from synthesis.report import StageReport, render

STAGES = ("themes", "skeletons", "assess", "scenarios")
_STEPS: dict[str, list[Callable[[Context], Awaitable[StageReport]]]] = {
    "themes": [themes.run, dedup.run],
    "skeletons": [skeleton.run],
    "assess": [assess.run],
    "scenarios": [scenarios.run, publish.run],
}


@dataclass
class RunResult:
    reports: list[StageReport]
    summary: dict[str, Any]
    table: str

    @property
    def catalog_ok(self) -> bool:
        """False when the published catalog failed validation."""
        return not any(r.failed for r in self.reports if r.stage == publish.STAGE)


async def run(
    config: SynthConfig,
    out: Path,
    stages: tuple[str, ...] = STAGES,
    *,
    api_key: str | None = None,
    stream: TextIO | None = None,
    use_cache: bool = True,
) -> RunResult:
    """Run ``stages`` (in pipeline order) into ``out``; write ``_work/summary.json``.

    Raises:
        ConfigError: a stage's input is missing (e.g. no corpus, no earlier stage output).
    """
    ctx = Context(config, out, api_key=api_key, stream=stream if stream is not None else sys.stderr, use_cache=use_cache)
    reports: list[StageReport] = []
    try:
        for stage in STAGES:
            if stage in stages:
                for step in _STEPS[stage]:
                    reports.append(await step(ctx))
    finally:
        await ctx.close()
    summary = {
        "stages": [r.to_json(ctx.ledger.of(r.stage)) for r in reports],
        "usage": {stage: usage.to_json() for stage, usage in ctx.ledger.stages.items()},
        "total": ctx.ledger.total().to_json(),
    }
    ctx.workspace.write_json(ctx.workspace.summary, summary)
    return RunResult(reports, summary, render(reports, ctx.ledger))
