"""The checking agent of the assessment: a label and a reason for one tool call.

Outcomes the sandbox already decides are labelled without asking the model:
an exception, a timeout or a resource limit is a Fail (a tool must never
raise), and so is a result that is not ``{"success": bool, ...}``. A call the
tester got wrong (unknown tool, arguments that do not bind) tests nothing and
is ``not_a_test``. Otherwise the checker reads the environment's code (record
types and class), the method, the rules, the arguments, the states and the
result, at its own temperature (``temperatures.checker``, 0 by default).
"""

from __future__ import annotations

import ast
from typing import Any

from sandbox.pool.calls import CallOutcome
from service.catalog.model import Environment
from synthesis.errors import AnswerRejected
from synthesis.llm.dialogue import ask
from synthesis.llm.prompts import render, shown
from synthesis.parsing.answers import parse_verdict
from synthesis.run.context import Context
from synthesis.stages import states

SANDBOX_FAILS = {"tool_exception", "timeout", "resource_limit"}
JUDGED = ("pass", "warning", "fail")


async def label(ctx: Context, env: Environment, item: str, call: dict[str, Any], before: str, outcome: CallOutcome,
                *, stage: str) -> tuple[str, str]:  # fmt: skip
    """The label and reason of ``call`` (tool, arguments, intent, expectation) that ran from ``before``."""
    if outcome.error is not None:
        kind, message = outcome.error["type"], outcome.error["message"]
        if kind in SANDBOX_FAILS:
            return "fail", f"the tool did not return normally: {kind}: {message}"
        return "not_a_test", f"{kind}: {message}"  # the tester's mistake (or the sandbox's), not the tool's
    if not isinstance(outcome.result, dict) or not isinstance(outcome.result.get("success"), bool):
        return "fail", 'the result is not {"success": bool, ...}'
    after = outcome.state if outcome.state is not None else before
    rules = "\n".join(f"- {rule}" for rule in env.rules)
    prompt = render("check_call", env=env.env_id, item=item, rules=rules, tool=call["tool"], code=shown(env.code, 16000),
                    method=method_source(env.code, env.class_name, call["tool"]), arguments=call["arguments"],
                    intent=call["intent"], expectation=call["expectation"], before=shown(states.view(before)),
                    after=shown(states.view(after)), diff=shown(outcome.diff), result=shown(outcome.result, 3000))  # fmt: skip
    try:
        verdict = await ask(ctx.client, "checker", prompt, parse_verdict, stage=stage)
    except AnswerRejected:
        return "skipped", "the checker gave no usable verdict"
    return verdict.label, verdict.reason


def method_source(code: str, class_name: str, name: str) -> str:
    """The source of one method of ``class_name`` (what the checker and the repairer read)."""
    tree = ast.parse(code)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == name:
                    return ast.get_source_segment(code, fn, padded=True) or ""
    return ""
