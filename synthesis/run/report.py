"""What each stage did, and the run summary table: items in, kept, dropped by reason, failures, tokens, cost."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from synthesis.llm.usage import Ledger, Usage

KEPT, DROPPED, FAILED = "kept", "dropped", "failed"


@dataclass
class StageReport:
    """Counts cover every item of the stage, including those finished by an earlier run (``resumed``)."""

    stage: str
    items: int = 0
    resumed: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    failed: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what repairs did, one line per item they touched

    def count(self, record: dict[str, Any], *, resumed: bool = False) -> None:
        self.items += 1
        self.resumed += resumed
        status = record.get("status")
        if status == KEPT:
            self.kept += 1
        elif status == DROPPED:
            self.dropped[str(record.get("reason") or "unspecified")] += 1
        else:
            self.failed.append((str(record.get("key")), str(record.get("error") or "unknown error")))

    @property
    def barren(self) -> bool:
        """Items came in and none was kept: every one failed or was dropped."""
        return self.items > 0 and self.kept == 0

    def to_json(self, usage: Usage) -> dict[str, Any]:
        return {
            "stage": self.stage, "items": self.items, "resumed": self.resumed, "kept": self.kept,
            "dropped": dict(self.dropped), "failed": [{"key": k, "error": e} for k, e in self.failed],
            "notes": list(self.notes), "usage": usage.to_json(),
        }  # fmt: skip


def render(reports: list[StageReport], ledger: Ledger) -> str:
    header = ("stage", "in", "resumed", "kept", "dropped", "failed", "requests", "cached", "tokens", "cost $")
    rows = [header]
    for r in reports:
        u = ledger.of(r.stage)
        rows.append((r.stage, str(r.items), str(r.resumed), str(r.kept), str(sum(r.dropped.values())),
                     str(len(r.failed)), str(u.requests), str(u.cached), str(u.tokens), f"{u.cost:.4f}"))  # fmt: skip
    extra = sorted(set(ledger.stages) - {r.stage for r in reports})
    for stage in extra:  # LLM use outside the item stages (deduplication embeddings)
        u = ledger.of(stage)
        rows.append((stage, "", "", "", "", "", str(u.requests), str(u.cached), str(u.tokens), f"{u.cost:.4f}"))
    total = ledger.total()
    rows.append(("total", "", "", "", "", "", str(total.requests), str(total.cached), str(total.tokens), f"{total.cost:.4f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in reports:
        for reason, n in sorted(r.dropped.items()):
            lines.append(f"{r.stage}: dropped {n} ({reason})")
        for key, error in r.failed:
            lines.append(f"{r.stage}: FAILED {key}: {error}")
        lines.extend(f"{r.stage}: {note}" for note in r.notes)
    return "\n".join(lines)
