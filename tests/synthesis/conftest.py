"""Fixtures of the synthesis tests: the scripted LLM endpoint, configs, a sandbox pool."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.backends.process import ProcessBackend
from sandbox.pool.requests import WorkerPool
from sandbox.wire.limits import Limits
from synthesis.run.config import SynthConfig
from tests.conftest import ROOT
from tests.scripted_openai import Running
from tests.scripted_openai.fixtures import EMBED_MODEL, LABEL_HEADER, ScriptedLLM

FIXTURES = ROOT / "tests" / "fixtures" / "synthesis"
ANSWERS = FIXTURES / "llm"
CORPUS = FIXTURES / "corpus.jsonl"
CLIENT_TIMEOUT = 1.0  # the "timeout" fault answers after 1.6 s


def config_data(url: str, *, corpus: Path | str = CORPUS, **sections: dict[str, Any]) -> dict[str, Any]:
    """A run configuration for the scripted endpoint; ``sections`` update the defaults per section."""
    data: dict[str, Any] = {
        "corpus": str(corpus),
        "llm": {"base_url": url, "api_key_env": "", "timeout": CLIENT_TIMEOUT, "max_attempts": 3,
                "backoff_initial": 0.01, "backoff_max": 0.05, "max_reasks": 2, "embedding_model": EMBED_MODEL,
                "label_header": LABEL_HEADER},
        "models": {"generator": "gen-large", "tester": "gen-small", "checker": "gen-large"},
        "prices": {"generator": {"prompt": 0.002, "completion": 0.008}, "tester": {"prompt": 0.0004, "completion": 0.0016},
                   "checker": {"prompt": 0.002, "completion": 0.008}, "embedding": {"prompt": 0.00002}},
        "thresholds": {"keep_score": 5, "embedding_similarity": 0.85, "lexical_similarity": 0.5, "pass_ratio": 0.8,
                       "rounds": 6, "min_judged": 0.5},
        "run": {"concurrency": 4, "sandbox_workers": 2, "scenarios_per_env": 2},
    }  # fmt: skip
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return data


def make_config(url: str, **sections: dict[str, Any]) -> SynthConfig:
    return SynthConfig.model_validate(config_data(url, corpus=CORPUS, **sections))


def write_config(folder: Path, url: str, *, corpus: Path | str = CORPUS, **sections: dict[str, Any]) -> Path:
    """The same configuration as a TOML file (what users write)."""
    data = config_data(url, corpus=corpus, **sections)
    lines = [f"corpus = {json.dumps(data.pop('corpus'))}"]
    for section, values in data.items():
        flat = {k: v for k, v in values.items() if not isinstance(v, dict)}
        lines.append(f"\n[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in flat.items() if v is not None]
        for name, table in ((k, v) for k, v in values.items() if isinstance(v, dict)):
            lines.append(f"\n[{section}.{name}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path = folder / "synth.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def llm_server() -> Iterator[Running]:
    with Running(ScriptedLLM(ANSWERS)) as running:
        yield running


@pytest.fixture
def llm(llm_server: Running) -> Running:
    """The scripted endpoint with an empty request log and fault plans from the start."""
    llm_server.script.reset()
    return llm_server


@pytest.fixture
async def pool() -> AsyncIterator[WorkerPool]:
    workers = WorkerPool(ProcessBackend(), 2, Limits(call_timeout=3.0, check_timeout=2.0, memory_mb=256))
    await workers.start()
    try:
        yield workers
    finally:
        await workers.close()


# -- records built straight from the fixture answers (no LLM), to start a stage mid-pipeline ---------

THEME_OF = {"clinic_appointments": "t01", "warehouse_inventory": "t04", "parking_permits": "t10"}


def latest(folder: Path, item: str = "main") -> str:
    """The answer a conversation ends with: ``item.md``, else the highest-numbered ``item.N.md``."""
    plain = folder / f"{item}.md"
    if plain.is_file():
        return plain.read_text(encoding="utf-8")
    turns = sorted(folder.glob(f"{item}.*.md"), key=lambda p: int(p.name.split(".")[-2]))
    return turns[-1].read_text(encoding="utf-8")


def fixture_theme(env_id: str) -> dict[str, Any]:
    from synthesis.parsing.answers import parse_theme

    theme = parse_theme(latest(ANSWERS / "corpus" / "theme_judge", THEME_OF[env_id]))
    return {"env_id": env_id, "summary": theme.summary, "introduction": theme.introduction,
            "usefulness": theme.usefulness, "modelability": theme.modelability, "source_task": THEME_OF[env_id]}


def fixture_skeleton(env_id: str) -> dict[str, Any]:
    """The kept skeleton record the skeleton stage writes for ``env_id``, assembled from its fixture answers."""
    from synthesis.build.assembly import assemble
    from synthesis.parsing.answers import parse_operation_plan, parse_state_plan
    from synthesis.parsing.sources import parse_class_code, parse_method

    folder = ANSWERS / env_id
    plan = parse_state_plan(latest(folder / "state_plan"))
    attributes = [e.container for e in plan.entities] + [s.name for s in plan.settings]
    state_code = parse_class_code(latest(folder / "state_code"), plan.class_name, attributes)
    operations = parse_operation_plan(latest(folder / "operation_plan"), set(attributes))
    methods = [parse_method(latest(folder / "operation_code", op.name), op.name) for op in operations]
    theme = fixture_theme(env_id)
    return {"key": env_id, "status": "kept", "class_name": plan.class_name,
            "code": assemble(state_code, plan.class_name, methods).code, "summary": theme["summary"],
            "introduction": theme["introduction"], "rules": plan.rules}  # fmt: skip


def seed_scope(ctx: Any, *env_ids: str) -> None:
    """The environment list the theme stage would leave, holding ``env_ids``."""
    envs = [fixture_theme(e) for e in env_ids]
    ctx.workspace.write_json(ctx.workspace.environments, {"fingerprint": "", "environments": envs, "dropped": []})


@pytest.fixture
async def contexts(tmp_path: Path, llm: Running) -> AsyncIterator[Any]:
    """A factory of pipeline contexts on ``tmp_path/out`` talking to the scripted endpoint; closed afterwards."""
    import io

    from synthesis.run.context import Context

    made: list[Context] = []

    def make(**sections: dict[str, Any]) -> Context:
        ctx = Context(make_config(llm.url, **sections), tmp_path / "out", api_key=None, stream=io.StringIO())
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        await ctx.close()
