"""The rollout's live progress line and closing table, computed from the JSONL records alone."""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from math import comb
from typing import TextIO

from envfoundry_client.models import JSON


@dataclass(frozen=True)
class Row:
    env_id: str
    episodes: int
    failed: int  # episodes ended by the LLM endpoint or the service failing, not by the agent
    mean_reward: float
    success_rate: float  # episodes with reward 1.0
    pass_at_k: float  # scenarios with at least one successful sample among their k
    k: int
    mean_steps: float
    tokens: int


FAILURES = ("llm_error", "service_error")


def _success(record: JSON) -> bool:
    return record.get("reward") == 1.0


def failed_outside_agent(record: JSON) -> bool:
    """The episode ended because the LLM endpoint or the service failed: its reward says nothing
    about the agent."""
    return record.get("finish_reason") in FAILURES


def _row(env_id: str, records: list[JSON]) -> Row:
    by_scenario: dict[str, list[JSON]] = defaultdict(list)
    for r in records:
        by_scenario[str(r["scenario_id"])].append(r)
    n = len(records)
    return Row(
        env_id=env_id, episodes=n, failed=sum(failed_outside_agent(r) for r in records),
        mean_reward=sum(float(r.get("reward") or 0.0) for r in records) / n,
        success_rate=sum(_success(r) for r in records) / n,
        pass_at_k=sum(any(_success(r) for r in group) for group in by_scenario.values()) / len(by_scenario),
        k=max(len(group) for group in by_scenario.values()),
        mean_steps=sum(int(r.get("steps") or 0) for r in records) / n,
        tokens=sum(int((r.get("usage") or {}).get("total_tokens") or 0) for r in records),
    )


def summarize(records: list[JSON]) -> list[Row]:
    """One row per environment (sorted), then ``all`` when there is more than one environment."""
    by_env: dict[str, list[JSON]] = defaultdict(list)
    for r in records:
        by_env[str(r["env_id"])].append(r)
    rows = [_row(env_id, by_env[env_id]) for env_id in sorted(by_env)]
    if len(rows) > 1:
        rows.append(_row("all", records))
    return rows


HEADER = ("environment", "episodes", "failed", "mean reward", "success", "pass@k", "mean steps", "tokens")


def table(rows: list[Row]) -> str:
    cells = [HEADER] + [(r.env_id, str(r.episodes), str(r.failed), f"{r.mean_reward:.3f}", f"{r.success_rate:.1%}",
                         f"{r.pass_at_k:.1%} (k={r.k})", f"{r.mean_steps:.1f}", str(r.tokens)) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i]) for i in range(len(c)))
             for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def failures(records: list[JSON]) -> str | None:
    """What to tell the terminal about episodes that failed for a reason outside the agent: their
    count by reason and the first cause, or None when there are none."""
    bad = [r for r in records if failed_outside_agent(r)]
    if not bad:
        return None
    counts = ", ".join(f"{reason} {sum(r['finish_reason'] == reason for r in bad)}"
                       for reason in FAILURES if any(r["finish_reason"] == reason for r in bad))
    scope = ("the only episode" if len(records) == 1 else f"all {len(bad)} episodes" if len(bad) == len(records)
             else f"{len(bad)} of {len(records)} episodes")
    return (f"{scope} failed outside the agent ({counts}); their rewards are not the agent's. "
            f"First cause: {bad[0]['finish_reason']}: {bad[0].get('error')}")


class Progress:
    """``done/total episodes, mean reward, failed (when any), running, tokens`` on one line of ``stream``, redrawn in
    place on a terminal and written as plain lines elsewhere (logs)."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.done = 0
        self.running = 0
        self.reward = 0.0
        self.tokens = 0
        self.failed = 0

    def started(self) -> None:
        self.running += 1
        if self.live:
            self._write("\r\x1b[2K" + self.line())

    def finished(self, record: JSON) -> None:
        self.running -= 1
        self.done += 1
        self.reward += float(record.get("reward") or 0.0)
        self.failed += failed_outside_agent(record)
        self.tokens += int((record.get("usage") or {}).get("total_tokens") or 0)
        self._write("\r\x1b[2K" + self.line() if self.live else self.line() + "\n")

    def line(self) -> str:
        mean = f"{self.reward / self.done:.3f}" if self.done else "-"
        failed = f" | failed {self.failed}" if self.failed else ""  # seen early in a long run, not at its end
        return (f"rollout {self.done}/{self.total} episodes | mean reward {mean}{failed} | running {self.running} | "
                f"tokens {self.tokens}")

    def close(self) -> None:
        if self.live:
            self._write("\n")
        elif not self.done:
            self._write(self.line() + "\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


# Environments written by ``envfoundry catalog import-taubench`` and ``import-bfcl`` carry these prefixes.
TAU_BENCH_PREFIX = "taubench_"
BFCL_PREFIX = "bfcl_"


def pass_hat_k(records: list[JSON]) -> list[float]:
    """tau-bench's pass^k for k = 1 .. the fewest samples any scenario has: over scenarios, the chance
    that k samples drawn from its n all succeed, C(c, k) / C(n, k) with c the successes."""
    by_scenario: dict[str, list[JSON]] = defaultdict(list)
    for r in records:
        by_scenario[str(r["scenario_id"])].append(r)
    if not by_scenario:
        return []
    fewest = min(len(group) for group in by_scenario.values())
    counts = [(len(group), sum(_success(r) for r in group)) for group in by_scenario.values()]
    return [sum(comb(c, k) / comb(n, k) for n, c in counts) / len(counts) for k in range(1, fewest + 1)]


def benchmark_lines(records: list[JSON]) -> list[str]:
    """Each imported benchmark's own metric: pass^k for tau-bench, BFCL's accuracy per category for BFCL
    (see ``bfcl_lines``)."""
    lines = []
    tau = [r for r in records if str(r["env_id"]).startswith(TAU_BENCH_PREFIX)]
    if tau:
        scores = "  ".join(f"pass^{k} {value:.3f}" for k, value in enumerate(pass_hat_k(tau), start=1))
        tasks = len({r["scenario_id"] for r in tau})
        lines.append(f"tau-bench: {scores} ({tasks} tasks, {len(tau)} episodes)")
    bfcl = [r for r in records if str(r["env_id"]).startswith(BFCL_PREFIX)]
    if bfcl:
        lines += bfcl_lines(bfcl)
    return lines


# ``import-bfcl`` names a scenario after its entry: ``bfcl-multi-turn-{category}-{n}``, with
# ``-all-at-once`` for the form that gives every turn in the task.
BFCL_CATEGORIES = ("base", "long_context", "miss_func", "miss_param")
_BFCL_ID = re.compile(r"^bfcl-multi-turn-(base|long-context|miss-func|miss-param)-\d+(-all-at-once)?$")


def bfcl_category(scenario_id: str) -> str:
    """The BFCL category of an imported scenario: one of ``BFCL_CATEGORIES``, that name with
    ``_all_at_once`` for the all-at-once form, or ``other``."""
    match = _BFCL_ID.match(scenario_id)
    if match is None:
        return "other"
    return match.group(1).replace("-", "_") + ("_all_at_once" if match.group(2) else "")


def bfcl_lines(records: list[JSON]) -> list[str]:
    """BFCL's accuracy as BFCL computes it: an entry is correct when every one of its turns passed (a
    turn-based episode's reward is 1.0 only then), accuracy is the share of correct episodes in each
    category, and the overall multi-turn accuracy is the unweighted mean of the categories' accuracies,
    so a category with more entries weighs no more. The all-at-once forms and any other scenario are
    shown apart and left out of the overall figure: they are not BFCL's protocol."""
    by_category: dict[str, list[JSON]] = defaultdict(list)
    for r in records:
        by_category[bfcl_category(str(r["scenario_id"]))].append(r)
    order = [*BFCL_CATEGORIES, *(f"{c}_all_at_once" for c in BFCL_CATEGORIES), "other"]
    lines = []
    accuracies = []
    for category in (c for c in order if c in by_category):
        group = by_category[category]
        correct = sum(_success(r) for r in group)
        accuracy = correct / len(group)
        if category in BFCL_CATEGORIES:
            accuracies.append(accuracy)
        lines.append(f"BFCL multi-turn {category}: accuracy {accuracy:.3f} ({correct}/{len(group)} episodes)")
    if accuracies:
        lines.append(f"BFCL multi-turn overall: accuracy {sum(accuracies) / len(accuracies):.3f} "
                     f"(mean of {len(accuracies)} categor{'y' if len(accuracies) == 1 else 'ies'})")
    return lines
