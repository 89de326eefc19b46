"""Running stages in order and writing the run summary.

    themes     judge corpus tasks, then deduplicate (stage 1)
    skeletons  plan and write each environment class (stage 2)
    assess     dual-agent assessment in the sandbox (stage 3)
    scenarios  generate and validate scenarios (stages 4 and 5), then publish the catalog

Each stage reads the previous stage's records and writes its own, so any
stage can be rerun alone, and ``all`` after an interruption resumes. A stage
that had items and kept none stops the run: the next one would have no input.

``_work/summary.json`` holds every run made into the folder (``runs``) and
their sum (``cumulative``), so the cost of a resumed run adds up; its
``stages``, ``usage`` and ``total`` describe the latest run. A run killed
before writing it is still counted: ``_work/usage.jsonl`` booked each of its
requests as it was sent.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from synthesis.errors import EndpointUnusable
from synthesis.llm.usage import Usage, read_journal
from synthesis.run.config import SynthConfig
from synthesis.run.context import Context
from synthesis.run.report import StageReport, render
from synthesis.stages import assess, dedup, publish, scenarios, skeleton, themes

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
    stopped: EndpointUnusable | None = None  # the endpoint could serve no request: the run stopped at once

    @property
    def catalog_ok(self) -> bool:
        """False when the published catalog failed validation."""
        return not any(r.failed for r in self.reports if r.stage == publish.STAGE)

    @property
    def barren(self) -> StageReport | None:
        """The stage that had items and kept none (the run stopped there), if any."""
        return next((r for r in self.reports if r.barren), None)


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

    The summary is written however the run ends: finished, stopped by an unusable
    endpoint, interrupted (Ctrl-C), or by a bug; a run killed outright leaves its
    spending in ``_work/usage.jsonl``, which the next run's summary adds in.

    Raises:
        ConfigError: a stage's input is missing (e.g. no corpus, no earlier stage output).
    """
    ctx = Context(config, out, api_key=api_key, stream=stream if stream is not None else sys.stderr, use_cache=use_cache)
    reports: list[StageReport] = []
    started = time.time()
    stopped: EndpointUnusable | None = None
    ending = "finished"
    try:
        for step in (step for stage in STAGES if stage in stages for step in _STEPS[stage]):
            reports.append(await step(ctx))
            if reports[-1].barren:
                break
    except EndpointUnusable as exc:
        stopped, ending = exc, "endpoint_unusable"
    except (asyncio.CancelledError, KeyboardInterrupt):
        ending = "interrupted"
        raise
    except BaseException:
        ending = "crashed"  # a bug: the traceback follows, and what was spent is still summed up
        raise
    finally:
        await ctx.close()
        this_run = {
            "run": ctx.run_id, "started": round(started, 3), "stages_run": list(stages), "ending": ending,
            "stages": [r.to_json(ctx.ledger.of(r.stage)) for r in reports],
            "usage": {stage: usage.to_json() for stage, usage in ctx.ledger.stages.items()},
            "total": ctx.ledger.total().to_json(),
        }  # fmt: skip
        summary = accumulate(ctx.workspace.read_json(ctx.workspace.summary), read_journal(ctx.workspace.usage), this_run)
        ctx.workspace.write_json(ctx.workspace.summary, summary)
    table = render(reports, ctx.ledger)
    total = summary["cumulative"]["total"]
    if len(summary["runs"]) > 1:
        table += (f"\nall {len(summary['runs'])} runs into this folder: {total['requests']} requests, "
                  f"{total['prompt_tokens'] + total['completion_tokens']} tokens, ${total['cost']:.4f}")  # fmt: skip
    return RunResult(reports, summary, table, stopped)


def accumulate(previous: Any, journal: dict[str, dict[str, Usage]], this_run: dict[str, Any]) -> dict[str, Any]:
    """The summary with ``this_run`` added to the runs before it, and their sum.

    The runs before it are those an earlier summary recorded (an unreadable one counts as none) plus those
    only the usage journal knows: runs killed before they could write a summary (``ending: killed``).
    """
    runs: list[dict[str, Any]] = []
    if isinstance(previous, dict) and isinstance(previous.get("runs"), list):
        runs = [r for r in previous["runs"] if isinstance(r, dict)]
    elif isinstance(previous, dict) and isinstance(previous.get("usage"), dict):
        runs = [previous]  # a summary written before runs were kept: one run
    known = {r.get("run") for r in runs} | {this_run["run"]}
    for run_id, stages in journal.items():
        if run_id not in known:
            total = Usage()
            for usage in stages.values():
                total.add(usage)
            runs.append({"run": run_id, "ending": "killed", "usage": {k: v.to_json() for k, v in stages.items()},
                         "total": total.to_json()})  # fmt: skip
    runs.append(this_run)
    per_stage: dict[str, Usage] = {}
    for run_ in runs:
        for stage, usage in (run_.get("usage") or {}).items():
            per_stage.setdefault(stage, Usage()).add(Usage.from_json(usage))
    total = Usage()
    for usage in per_stage.values():
        total.add(usage)
    cumulative = {"usage": {k: v.to_json() for k, v in per_stage.items()}, "total": total.to_json()}
    return {**{k: this_run[k] for k in ("run", "ending", "stages", "usage", "total")}, "runs": runs,
            "cumulative": cumulative}  # fmt: skip
