"""Token usage and estimated cost, per stage."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from synthesis.config import Prices, Role


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
    """Every request of a run, booked under the stage that made it."""

    prices: Prices
    stages: dict[str, Usage] = field(default_factory=dict)

    def of(self, stage: str) -> Usage:
        return self.stages.setdefault(stage, Usage())

    def request(self, stage: str) -> None:
        self.of(stage).requests += 1

    def answer(self, stage: str, role: Role, prompt_tokens: int, completion_tokens: int) -> None:
        usage = self.of(stage)
        price = self.prices.of(role)
        usage.answers += 1
        usage.prompt_tokens += prompt_tokens
        usage.completion_tokens += completion_tokens
        usage.cost += (prompt_tokens * price.prompt + completion_tokens * price.completion) / 1000.0

    def cache_hit(self, stage: str) -> None:
        self.of(stage).cached += 1

    def total(self) -> Usage:
        out = Usage()
        for usage in self.stages.values():
            out.add(usage)
        return out
