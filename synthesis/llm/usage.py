"""Token usage and estimated cost, per stage, written down as it is spent.

Every request, answer and cache hit is appended to ``_work/usage.jsonl`` (one
line each, flushed at once, tagged with the run's id) before the run goes on,
so a run killed at any point has booked every request it sent; the summary of
a later run reads the journal and adds the interrupted run's spending in.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from synthesis.run.config import Prices, Role


@dataclass
class Usage:
    requests: int = 0  # HTTP requests sent, retries included
    answers: int = 0  # responses obtained from the endpoint
    cached: int = 0  # responses served from the cache instead
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "cost": round(self.cost, 6)}

    @classmethod
    def from_json(cls, data: Any) -> Usage:
        """Read what ``to_json`` wrote; missing or malformed fields count as zero."""
        out = cls()
        for name in _FIELDS:
            value = data.get(name) if isinstance(data, dict) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                setattr(out, name, type(getattr(out, name))(value))
        return out

    def add(self, other: Usage) -> None:
        for name in _FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


_FIELDS = ("requests", "answers", "cached", "prompt_tokens", "completion_tokens", "cost")


@dataclass
class Ledger:
    """Every request of a run, booked under the stage that made it, and appended to ``journal`` if given."""

    prices: Prices
    stages: dict[str, Usage] = field(default_factory=dict)
    journal: Path | None = None
    run: str = ""  # the id the journal's lines carry
    _handle: IO[str] | None = field(default=None, repr=False)

    def of(self, stage: str) -> Usage:
        return self.stages.setdefault(stage, Usage())

    def request(self, stage: str) -> None:
        self.of(stage).requests += 1
        self._write(stage, {"requests": 1})

    def answer(self, stage: str, role: Role, prompt_tokens: int, completion_tokens: int) -> None:
        usage = self.of(stage)
        price = self.prices.of(role)
        cost = (prompt_tokens * price.prompt + completion_tokens * price.completion) / 1000.0
        usage.answers += 1
        usage.prompt_tokens += prompt_tokens
        usage.completion_tokens += completion_tokens
        usage.cost += cost
        self._write(stage, {"answers": 1, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "cost": cost})  # fmt: skip

    def cache_hit(self, stage: str) -> None:
        self.of(stage).cached += 1
        self._write(stage, {"cached": 1})

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def _write(self, stage: str, fields: dict[str, Any]) -> None:
        if self.journal is None:
            return
        if self._handle is None:
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.journal.open("a", encoding="utf-8")
            self._handle.write("\n")  # a line torn by a killed run must not swallow the first one of this run
        self._handle.write(json.dumps({"run": self.run, "stage": stage, **fields}) + "\n")
        self._handle.flush()  # in the kernel's hands: a kill -9 right after loses nothing

    def total(self) -> Usage:
        out = Usage()
        for usage in self.stages.values():
            out.add(usage)
        return out


def read_journal(path: Path) -> dict[str, dict[str, Usage]]:
    """Run id -> stage -> usage, summed from a journal; blank and torn lines are skipped."""
    runs: dict[str, dict[str, Usage]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return runs
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("run"), str) and isinstance(entry.get("stage"), str):
            runs.setdefault(entry["run"], {}).setdefault(entry["stage"], Usage()).add(Usage.from_json(entry))
    return runs
