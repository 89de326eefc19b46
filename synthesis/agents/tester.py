"""The testing agent of the assessment: one conversation per environment, one call per round.

Each round the tester proposes a call, the sandbox runs it, the checker labels
it, and the tester's next turn starts with what the call returned and how it
changed the state, so it can aim its next test at what it saw. The
conversation keeps the last ``HISTORY`` exchanges; its first message shows the
state as it was before the oldest exchange kept, so what the tester reads is
always consistent.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from service.catalog.model import Environment
from service.catalog.registry import env_code
from synthesis.agents import checker
from synthesis.errors import AnswerRejected
from synthesis.llm.client import Message
from synthesis.llm.dialogue import converse
from synthesis.llm.prompts import render, shown, turn
from synthesis.parsing.answers import parse_probe_call
from synthesis.run.context import Context
from synthesis.stages import states

HISTORY = 6  # exchanges the tester sees in full


@dataclass
class Probing:
    """The rounds' log, and the encoded state each logged call started from (kept in memory for repairs)."""

    log: list[dict[str, Any]] = field(default_factory=list)
    before: dict[int, str] = field(default_factory=dict)  # round -> encoded state before its call


async def probe(ctx: Context, env: Environment, state: str, *, stage: str) -> Probing:
    rounds = ctx.config.thresholds.rounds
    pool = await ctx.pool()
    tools = sorted(env.tool_names)
    tally = {name: {"positive": 0, "negative": 0} for name in tools}
    rules = "\n".join(f"- {rule}" for rule in env.rules)
    out = Probing()
    exchanges: list[tuple[int, str, str]] = []  # (round, the tester's answer, what the call did)
    counts: Counter[str] = Counter()
    for n in range(1, rounds + 1):
        window = exchanges[-HISTORY:]
        start = out.before[window[0][0]] if window else state
        first = render("test_call", env=env.env_id, introduction=env.introduction, rules=rules,
                       tools=shown(env.tools, 12000), state=shown(states.view(start)), rounds=str(rounds))  # fmt: skip
        messages: list[Message] = first.messages()
        for _, answer, feedback in window:
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": feedback}]
        closing = turn("test_next", tally=tally, round=str(n), rounds=str(rounds))
        messages[-1] = {"role": "user", "content": messages[-1]["content"] + "\n\n" + closing}
        try:
            call, answer = await converse(ctx.client, "tester", messages, lambda a: parse_probe_call(a, set(tools)),
                                          stage=stage, label=f"template=test_call env={env.env_id} item=r{n:02d}",
                                          template="test_call")  # fmt: skip
        except AnswerRejected as exc:
            out.log.append({"round": n, "skipped": f"tester: {exc.last}"})
            ctx.note(stage, f"{env.env_id}: round {n}/{rounds}: no usable call")
            continue
        tally[call.tool][call.intent] += 1
        outcome = await pool.call(env_code(env), state, call.tool, call.arguments)
        entry: dict[str, Any] = {"round": n, "tool": call.tool, "arguments": call.arguments, "intent": call.intent,
                                 "expectation": call.expectation, "ok": outcome.ok, "result": outcome.result,
                                 "error": outcome.error, "diff": outcome.diff}  # fmt: skip
        entry["verdict"], entry["reason"] = await checker.label(ctx, env, f"r{n:02d}", entry, state, outcome, stage=stage)
        counts[entry["verdict"]] += 1
        out.log.append(entry)
        out.before[n] = state
        status = "ok" if outcome.ok else f"error {outcome.error['type'] if outcome.error else ''}"
        returned = outcome.result if outcome.ok else outcome.error
        exchanges.append((n, answer, turn("test_feedback", round=str(n), tool=call.tool, status=status,
                                          result=shown(returned, 3000), diff=shown(outcome.diff, 3000))))  # fmt: skip
        if outcome.state is not None:
            state = outcome.state
        seen = ", ".join(f"{k} {counts[k]}" for k in (*checker.JUDGED, "not_a_test", "skipped") if counts[k])
        ctx.note(stage, f"{env.env_id}: round {n}/{rounds}: {call.tool} {entry['verdict']} ({seen})")
    return out
