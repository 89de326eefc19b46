"""Generated code that keeps state outside the instance is sent back to the model like a parse error."""

from __future__ import annotations

from typing import Any

import pytest

from service.catalog.collection import Catalog
from synthesis.stages import publish, scenarios, skeleton
from tests.scripted_openai import Running
from tests.synthesis.conftest import fixture_theme

pytestmark = pytest.mark.anyio

CLASS_COUNTER = 'type(self).adjustments_made = getattr(type(self), "adjustments_made", 0) + 1'


async def test_a_class_counter_is_sent_back_and_the_repaired_environment_is_published(contexts: Any,
                                                                                       llm: Running) -> None:
    ctx = contexts(run={"scenarios_per_env": 1})
    theme = {**fixture_theme("warehouse_inventory"), "env_id": "crate_depot"}
    ctx.workspace.write_json(ctx.workspace.environments, {"fingerprint": "", "environments": [theme], "dropped": []})
    await skeleton.run(ctx)
    record = ctx.workspace.skeletons.load()["crate_depot"]
    assert record["status"] == "kept" and "adjust_stock" in record["tools"], record
    assert "adjustments_made" not in record["code"] and "self._next_movement_id()" in record["code"]
    # the first answer kept its counter on the class: the refusal went back, naming it and the fix
    first, second = llm.script.conversations["crate_depot/operation_code/adjust_stock"]
    sent_back = second[-1]["content"]
    assert second[-2]["role"] == "assistant" and CLASS_COUNTER in second[-2]["content"]
    unparsed = CLASS_COUNTER.replace('"', "'")
    assert f"in adjust_stock, line 26: `{unparsed}` writes a class attribute; keep it on `self`" in sent_back

    # kept by its assessment, its scenario validated, it is published and the catalog validates
    ctx.workspace.assessments.append({"key": "crate_depot", "status": "kept", "ratio": 1.0, "counts": {"pass": 6},
                                      "rounds": 6, "assessment": {"rounds": 6, "counts": {"pass": 6}}})
    await scenarios.run(ctx)
    assert ctx.workspace.scenarios.load()["crate_depot-s01"]["status"] == "kept"
    published = await publish.run(ctx)
    assert (published.kept, published.failed) == (1, [])
    catalog = Catalog()
    catalog.load_dir(ctx.workspace.out)
    assert catalog.problems == [] and "self._next_movement_id()" in catalog.environments["crate_depot"].code


async def test_a_state_class_that_keeps_state_on_the_class_is_refused_with_the_line() -> None:
    from synthesis.errors import ParseError
    from synthesis.parsing.sources import parse_class_code

    answer = ("```python\nclass Desk:\n    registry = {}\n\n    def __init__(self, init_config=None):\n"
              "        self.orders = {}\n\n    def _remember(self, key):\n        self.registry[key] = True\n```")
    with pytest.raises(ParseError, match=r"line 8: `self.registry\[key\] = True` changes the class-level `registry`"):
        parse_class_code(answer, "Desk", ["orders"])
