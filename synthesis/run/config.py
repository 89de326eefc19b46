"""The run configuration: a TOML or JSON file, validated strictly.

Unknown keys are errors, and so are values of the wrong type: ``rounds = "16"``
is refused (naming ``thresholds.rounds``) rather than quietly read as 16.

The API key never goes in the file: ``llm.api_key_env`` names the environment
variable that holds it, and ``api_key`` is the one place that reads it.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from synthesis.errors import ConfigError

Role = Literal["generator", "tester", "checker", "embedding"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class LLMConfig(_Strict):
    base_url: str = Field(description="OpenAI-compatible API root, e.g. http://localhost:8000/v1")
    api_key_env: str | None = Field(default="OPENAI_API_KEY", description="variable holding the key; null for none")
    timeout: float = Field(default=120.0, gt=0, description="seconds per request")
    max_attempts: int = Field(default=5, ge=1, le=20, description="tries per request on 429, 5xx and timeouts")
    backoff_initial: float = Field(default=1.0, ge=0)
    backoff_max: float = Field(default=30.0, ge=0)
    max_reasks: int = Field(default=2, ge=0, le=10, description="re-asks after an answer that does not parse")
    temperature: float = Field(default=0.7, ge=0, le=2, description="of every role [temperatures] does not set")
    max_tokens: int = Field(default=4096, ge=16)
    embedding_model: str | None = Field(default=None, description="null: deduplicate lexically only")
    label_header: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9-]+$",
        description="send each request's label (template, env, item, turn) in this HTTP header; never in the prompt",
    )


class Temperatures(_Strict):
    """Sampling temperature per role; unset roles use ``llm.temperature``. The checker judges: 0 by default."""

    generator: float | None = Field(default=None, ge=0, le=2)
    tester: float | None = Field(default=None, ge=0, le=2)
    checker: float | None = Field(default=0.0, ge=0, le=2)


class Models(_Strict):
    generator: str
    tester: str
    checker: str


class Price(_Strict):
    """US dollars per 1,000 tokens."""

    prompt: float = Field(default=0.0, ge=0)
    completion: float = Field(default=0.0, ge=0)


class Prices(_Strict):
    generator: Price = Price()
    tester: Price = Price()
    checker: Price = Price()
    embedding: Price = Price()

    def of(self, role: Role) -> Price:
        price: Price = getattr(self, role)
        return price


class Thresholds(_Strict):
    keep_score: int = Field(default=6, ge=1, le=10, description="minimum usefulness and modelability")
    embedding_similarity: float = Field(default=0.92, gt=0, le=1, description="cosine at which themes are duplicates")
    lexical_similarity: float = Field(
        default=0.45, gt=0, le=1, description="character 4-gram cosine of stemmed words at which themes are duplicates"
    )
    pass_ratio: float = Field(default=0.85, ge=0, le=1, description="(pass + warning) / judged rounds to keep an env")
    rounds: int = Field(default=30, ge=1, le=500, description="assessment rounds per environment")
    min_judged: float = Field(default=0.5, ge=0, le=1, description="share of rounds that must get a verdict")


class Repair(_Strict):
    """Bounds of the repair loops."""

    tool_attempts: int = Field(default=2, ge=0, le=10, description="rewrites of a tool the checker labelled fail")
    remove_unrepaired: bool = Field(
        default=True, description="remove a tool still failing after its rewrites (false: drop the environment)"
    )
    scenario_attempts: int = Field(default=2, ge=0, le=10, description="repairs of a draft whose validation fails")
    drafts_per_scenario: int = Field(default=2, ge=1, le=10, description="fresh drafts per scenario before giving up")


class RunOptions(_Strict):
    concurrency: int = Field(default=8, ge=1, le=256, description="items worked on at once, and LLM requests in flight")
    sandbox_workers: int = Field(default=4, ge=1, le=64)
    max_envs: int | None = Field(default=None, ge=1, description="environments taken past theme mining")
    scenarios_per_env: int = Field(default=3, ge=1, le=50)
    states_per_env: int | None = Field(
        default=None, ge=1, le=50, description="initial states per environment, one per request (default: one per scenario)"
    )


class SynthConfig(_Strict):
    corpus: Path | None = Field(default=None, strict=False, description="JSONL of tasks; relative to the config file")
    llm: LLMConfig
    models: Models
    temperatures: Temperatures = Temperatures()
    prices: Prices = Prices()
    thresholds: Thresholds = Thresholds()
    repair: Repair = Repair()
    run: RunOptions = RunOptions()

    def model_for(self, role: Role) -> str:
        if role == "embedding":
            return self.llm.embedding_model or ""
        model: str = getattr(self.models, role)
        return model

    def temperature_for(self, role: Role) -> float:
        chosen: float | None = getattr(self.temperatures, role, None)
        return self.llm.temperature if chosen is None else chosen

    def states_per_env(self) -> int:
        return self.run.states_per_env or self.run.scenarios_per_env

    def with_run(self, **changes: Any) -> SynthConfig:
        """A copy with run options replaced (CLI flags win over the file); ``None`` values are ignored."""
        updates = {k: v for k, v in changes.items() if v is not None}
        return self.model_copy(update={"run": self.run.model_copy(update=updates)})


def load_config(path: Path) -> SynthConfig:
    """Read ``path`` (``.toml`` or ``.json``).

    Raises:
        ConfigError: unreadable, malformed, or failing validation (``field`` names the first bad key).
    """
    try:
        text = path.read_text(encoding="utf-8")
        data: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise ConfigError(f"cannot read the config: {exc}", path=str(path)) from exc
    try:
        config = SynthConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        got = f" (got {json.dumps(first['input'])})" if first["type"].endswith("_type") else ""
        raise ConfigError(f"{where}: {first['msg']}{got}", path=str(path), field=where) from exc
    if config.corpus is not None and not config.corpus.is_absolute():
        config = config.model_copy(update={"corpus": (path.parent / config.corpus).resolve()})
    return config


def api_key(config: SynthConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The key from the variable the config names; None when it names none.

    Raises:
        ConfigError: the config names a variable that is not set.
    """
    name = config.llm.api_key_env
    if not name:
        return None
    value = (os.environ if environ is None else environ).get(name)
    if not value:
        raise ConfigError(f"the environment variable {name} (llm.api_key_env) is not set", field="llm.api_key_env")
    return value
