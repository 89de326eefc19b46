"""Stage 1b: keep the themes scoring above the threshold, deduplicate them (embeddings, or a lexical
measure when there are none), and cap their number.

The lexical measure is the cosine of character 4-gram counts over the stemmed
content words of the theme's name, summary and introduction. Paraphrased themes
rarely share whole words ("room-service orders" and "in-room dining requests"
had a token Jaccard of 0.23), but they share word pieces and repeat their domain
words; 4-grams of stems catch both (0.65 for that pair, against at most 0.30
between it and the fixture corpus's other domains), and counts rather than sets
keep a long introduction from diluting the score as Jaccard does. It needs no
model and stays deterministic.

The result, ``_work/environments.json``, carries a fingerprint of its inputs;
while they are unchanged a rerun reuses it without a request.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from typing import Any

from synthesis.errors import LLMError
from synthesis.run.context import Context
from synthesis.run.report import DROPPED, KEPT, StageReport

STAGE = "dedup"
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset("a an and are as at be by for from in into is it its of on or that the their this to with".split())
_SUFFIXES = ("ations", "ation", "ments", "ment", "ings", "ing", "ies", "ied", "es", "ed", "s")
GRAM = 4


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def stem(word: str) -> str:
    """A light suffix stripper: enough to make "orders", "ordered" and "ordering" one word."""
    for suffix in _SUFFIXES:
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix in ("ies", "ied") else "")
    return word


def _grams(text: str) -> Counter[str]:
    grams: Counter[str] = Counter()
    for word in _WORD.findall(text.lower()):
        if word not in _STOP:
            padded = f" {stem(word)} "
            grams.update(padded[i : i + GRAM] for i in range(max(1, len(padded) - GRAM + 1)))
    return grams


def lexical(a: str, b: str) -> float:
    """Cosine of character 4-gram counts over stemmed content words (see the module docstring)."""
    left, right = _grams(a), _grams(b)
    dot = sum(n * right[g] for g, n in left.items())
    norm = math.sqrt(sum(n * n for n in left.values())) * math.sqrt(sum(n * n for n in right.values()))
    return dot / norm if norm else 0.0


async def run(ctx: Context) -> StageReport:
    config = ctx.config
    judged = [r for r in ctx.workspace.themes.load().values() if r.get("status") == KEPT]
    keep = config.thresholds.keep_score
    kept = [r for r in judged if min(r["theme"]["usefulness"], r["theme"]["modelability"]) >= keep]
    low = [r for r in judged if r not in kept]
    # Best first: a duplicate is dropped in favour of the better-scored theme seen before it.
    kept.sort(key=lambda r: (-(r["theme"]["usefulness"] + r["theme"]["modelability"]), r["key"]))
    fingerprint = hashlib.sha256(json.dumps(
        [[r["key"], r["theme"]] for r in kept]
        + [[r["key"], r["theme"]] for r in low]
        + [keep, config.thresholds.embedding_similarity, config.thresholds.lexical_similarity, config.run.max_envs,
           config.llm.embedding_model],
        sort_keys=True).encode()).hexdigest()  # fmt: skip
    previous = ctx.workspace.read_json(ctx.workspace.environments)
    if isinstance(previous, dict) and previous.get("fingerprint") == fingerprint:
        return _report(previous, resumed=True)
    texts = [f"{r['theme']['env_id'].replace('_', ' ')}\n{r['theme']['summary']}\n{r['theme']['introduction']}"
             for r in kept]  # fmt: skip
    method, fallback, vectors = "lexical", "", None
    if config.llm.embedding_model and kept:
        try:
            vectors = await ctx.client.embed(texts, stage=STAGE)
            method = "embeddings"
        except LLMError as exc:
            fallback = exc.message
    chosen: list[int] = []
    outcome: dict[str, Any] = {"fingerprint": fingerprint, "method": method, "fallback_reason": fallback,
                               "environments": [], "dropped": []}  # fmt: skip
    for record in sorted(low, key=lambda r: r["key"]):
        theme = record["theme"]
        outcome["dropped"].append({"key": record["key"], "env_id": theme["env_id"], "reason": "low_score",
                                   "detail": f"usefulness {theme['usefulness']}, modelability {theme['modelability']}; "
                                             f"both must reach {keep}"})  # fmt: skip
    ids: set[str] = set()
    for i, record in enumerate(kept):
        best, similarity = _closest(i, chosen, texts, vectors)
        threshold = config.thresholds.embedding_similarity if vectors else config.thresholds.lexical_similarity
        theme = record["theme"]
        if best is not None and similarity >= threshold:
            outcome["dropped"].append({"key": record["key"], "env_id": theme["env_id"], "reason": "duplicate",
                                       "detail": f"{similarity:.3f} similar to {kept[best]['theme']['env_id']}"})
            continue
        if config.run.max_envs is not None and len(chosen) >= config.run.max_envs:
            outcome["dropped"].append({"key": record["key"], "env_id": theme["env_id"], "reason": "over_max_envs",
                                       "detail": f"--max-envs {config.run.max_envs}"})
            continue
        env_id = _unique(theme["env_id"], ids)
        chosen.append(i)
        outcome["environments"].append({
            "env_id": env_id, "summary": theme["summary"], "introduction": theme["introduction"],
            "usefulness": theme["usefulness"], "modelability": theme["modelability"], "source_task": record["key"],
        })  # fmt: skip
    ctx.workspace.write_json(ctx.workspace.environments, outcome)
    return _report(outcome, resumed=False)


def environments(ctx: Context) -> list[dict[str, Any]]:
    """The environments in scope: later stages work on these only (a lower --max-envs narrows them)."""
    data = ctx.workspace.read_json(ctx.workspace.environments)
    return list(data["environments"]) if isinstance(data, dict) else []


def in_scope(ctx: Context) -> set[str]:
    return {env["env_id"] for env in environments(ctx)}


def _closest(i: int, chosen: list[int], texts: list[str], vectors: list[list[float]] | None) -> tuple[int | None, float]:
    best, score = None, -1.0
    for j in chosen:
        s = cosine(vectors[i], vectors[j]) if vectors else lexical(texts[i], texts[j])
        if s > score:
            best, score = j, s
    return best, score


def _unique(env_id: str, taken: set[str]) -> str:
    """Distinct themes can still get the same name; the later one gets a suffix."""
    candidate, n = env_id, 2
    while candidate in taken:
        candidate, n = f"{env_id}_{n}", n + 1
    taken.add(candidate)
    return candidate


def _report(outcome: dict[str, Any], *, resumed: bool) -> StageReport:
    report = StageReport(STAGE)
    for env in outcome["environments"]:
        report.count({"key": env["env_id"], "status": KEPT}, resumed=resumed)
    for entry in outcome["dropped"]:
        report.count({"key": entry["key"], "status": DROPPED, "reason": entry["reason"]}, resumed=resumed)
    return report
