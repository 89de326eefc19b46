"""Publishing: write the kept environments and scenarios as packages, then validate the catalog as the service would.

Packages are rewritten from the stage records on every run, so the catalog
always reflects them; a package this pipeline published earlier and no longer
keeps is removed (nothing else in the folder is touched).

Each package records where it came from under a ``provenance`` key, which the
catalog loader ignores: ``env.json`` the assessment summary (rounds, verdict
counts before and after repair, repaired and removed tools), the run and the
models, each line of ``scenarios.jsonl`` its validation history (drafts,
validations, diagnoses); both list the answers that were sent back to the model
(``reasks``: template, item, turn, the parse problem). A validated catalog is
then locked (``envfoundry.lock.json``), and ``_work/versions.jsonl`` gains a line
per published version: its digest, the run and models that made it and its
repairs, so a version served anywhere is traced back to what produced it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from sandbox.errors import SandboxError
from service.catalog.folders import write_package
from service.catalog.manifest import lock
from service.catalog.model import CatalogError, Scenario
from service.engine.validate import validate_catalog
from synthesis.run.context import Context
from synthesis.run.report import KEPT, StageReport
from synthesis.stages import dedup
from synthesis.stages.skeleton import environment

STAGE = "publish"


async def run(ctx: Context) -> StageReport:
    ws = ctx.workspace
    skeletons = ws.skeletons.load()
    scenarios = [r for r in ws.scenarios.load().values() if r.get("status") == KEPT]
    scope = dedup.in_scope(ctx)
    assessments = ws.assessments.load()
    kept = sorted(k for k, r in assessments.items()
                  if r.get("status") == KEPT and k in scope and skeletons.get(k, {}).get("status") == KEPT)  # fmt: skip
    report = StageReport(STAGE)
    for env_id in kept:
        env = environment(skeletons[env_id], assessments[env_id])
        own = sorted((r for r in scenarios if r["scenario"]["env_id"] == env_id), key=lambda r: str(r["key"]))
        folder = write_package(env, [Scenario.from_json(r["scenario"]) for r in own], ws.out)
        made_by = {"run": ctx.run_id, "models": ctx.config.models.model_dump()}
        _record_provenance(folder, skeletons[env_id], assessments[env_id], own, made_by)
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
        if not validation.problems:
            _lock(ctx, report)
    return report


def _lock(ctx: Context, report: StageReport) -> None:
    """Pin the published catalog, and trace each version it holds to the run that made it."""
    ws = ctx.workspace
    try:
        locked = lock(ws.out)
    except CatalogError as exc:
        report.failed.append(("catalog", f"not locked: {exc.message}"))
        return
    published = set(ws.read_json(ws.published) or [])
    traced = ws.work / "versions.jsonl"
    known = {json.loads(line)["version"] for line in traced.read_text().splitlines()} if traced.is_file() else set()
    with traced.open("a", encoding="utf-8") as out:
        for env_id, version in locked["environments"].items():
            if env_id in published and version not in known:
                provenance = json.loads((ws.out / env_id / "env.json").read_text(encoding="utf-8"))["provenance"]
                out.write(json.dumps({"env_id": env_id, "version": version, "run": ctx.run_id,
                                      "models": ctx.config.models.model_dump(), "catalog_digest": locked["digest"],
                                      "assessment": provenance.get("assessment")}, ensure_ascii=False) + "\n")


def scenario_provenance(record: dict[str, Any]) -> dict[str, Any]:
    """A scenario's validation history without the bulky evidence (that stays in ``_work/scenarios.jsonl``)."""
    history = [{k: v for k, v in entry.items() if k != "evidence"} for entry in record.get("history") or []]
    return {"drafts": max((e.get("draft", 1) for e in history), default=1), "validations": len(history),
            "history": history, "reasks": record.get("reasks") or []}  # fmt: skip


def _record_provenance(folder: Path, skeleton: dict[str, Any], assessment: dict[str, Any],
                       scenarios: list[dict[str, Any]], made_by: dict[str, Any]) -> None:  # fmt: skip
    manifest_path = folder / "env.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    summary = assessment.get("assessment") or {"rounds": assessment.get("rounds"), "counts": assessment.get("counts")}
    reasks = [{"stage": stage, **r} for stage, record in (("skeletons", skeleton), ("assess", assessment))
              for r in record.get("reasks") or []]  # fmt: skip
    manifest["provenance"] = {"assessment": {**summary, "ratio": assessment.get("ratio")}, "reasks": reasks,
                              **made_by}
    manifest_path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    lines = [json.dumps({**Scenario.from_json(r["scenario"]).to_json(), "provenance": scenario_provenance(r)},
                        ensure_ascii=False) for r in scenarios]  # fmt: skip
    (folder / "scenarios.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
