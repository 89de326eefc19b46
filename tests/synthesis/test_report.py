"""The progress line and the summary table."""

from __future__ import annotations

import io

from synthesis.llm.usage import Ledger
from synthesis.run.config import Prices
from synthesis.run.progress import Progress
from synthesis.run.report import StageReport, render


def test_progress_prints_a_line_per_tenth_when_not_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress("themes", 20, out)
    for i in range(20):
        progress.update("kept" if i % 2 else "dropped")
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[-1] == "[themes    ] [########################] 20/20  dropped 10  kept 10"


def test_progress_redraws_in_place_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    progress = Progress("assess", 2, out, width=4)
    progress.update("kept")
    progress.update("failed")
    progress.close()
    assert out.getvalue() == "\r[assess    ] [##--] 1/2  kept 1\r[assess    ] [####] 2/2  failed 1  kept 1\n"


def test_summary_table_has_counts_reasons_failures_tokens_and_cost() -> None:
    ledger = Ledger(Prices.model_validate({"generator": {"prompt": 1.0, "completion": 2.0}}))
    ledger.request("themes")
    ledger.answer("themes", "generator", 1000, 500)
    ledger.cache_hit("themes")
    ledger.request("dedup")
    report = StageReport("themes")
    report.count({"key": "t1", "status": "kept"})
    report.count({"key": "t2", "status": "dropped", "reason": "open_qa"}, resumed=True)
    report.count({"key": "t3", "status": "failed", "error": "gave up after 3 attempts"})
    table = render([report], ledger).splitlines()
    assert table[0].split() == ["stage", "in", "resumed", "kept", "dropped", "failed", "requests", "cached", "tokens", "cost", "$"]
    assert table[2].split() == ["themes", "3", "1", "1", "1", "1", "1", "1", "1500", "2.0000"]
    assert table[3].split()[0] == "dedup" and table[4].split()[0] == "total"
    assert "themes: dropped 1 (open_qa)" in table
    assert "themes: FAILED t3: gave up after 3 attempts" in table
