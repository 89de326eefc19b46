"""Publishing: write the kept environments and scenarios as packages, then validate the catalog as the service would.

Packages are rewritten from the stage records on every run, so the catalog
always reflects them; a package this pipeline published earlier and no longer
keeps is removed (nothing else in the folder is touched).
"""

from __future__ import annotations

import shutil

from sandbox.errors import SandboxError
from service.catalog import Scenario, write_package
from service.validate import validate_catalog
from synthesis import dedup
from synthesis.context import Context
from synthesis.report import KEPT, StageReport
from synthesis.skeleton import environment

STAGE = "publish"


async def run(ctx: Context) -> StageReport:
    ws = ctx.workspace
    skeletons = ws.skeletons.load()
    scenarios = [r for r in ws.scenarios.load().values() if r.get("status") == KEPT]
    scope = dedup.in_scope(ctx)
    kept = sorted(k for k, r in ws.assessments.load().items()
                  if r.get("status") == KEPT and k in scope and skeletons.get(k, {}).get("status") == KEPT)  # fmt: skip
    report = StageReport(STAGE)
    for env_id in kept:
        env = environment(skeletons[env_id])
        own = sorted((Scenario.from_json(r["scenario"]) for r in scenarios if r["scenario"]["env_id"] == env_id),
                     key=lambda s: s.scenario_id)  # fmt: skip
        write_package(env, own, ws.out)
        report.count({"key": env_id, "status": KEPT})
    previous = ws.read_json(ws.published)
    for env_id in previous if isinstance(previous, list) else []:
        folder = ws.out / str(env_id)
        if env_id not in kept and (folder / "env.json").is_file():
            shutil.rmtree(folder)
    ws.write_json(ws.published, kept)
    if kept:
        try:
            validation = await validate_catalog([ws.out], await ctx.pool())
        except SandboxError as exc:
            report.failed.append(("catalog", f"not validated: the sandbox failed: {exc.message}"))
            return report
        for problem in validation.problems:
            report.failed.append(("catalog", problem))
    return report
