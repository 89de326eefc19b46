"""``envfoundry catalog validate`` replays each reference solution live and with a rebuild before every
call: a class that passes the static check but keeps state where a rebuild loses it is reported,
naming the scenario, the step and what differed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.catalog.admission import build_environment
from tests.service.test_cli import run

# The instance's stock is the module-level dict itself: the static check accepts the alias (the
# instance's attributes hold it, and are stored), but a later read of DEFAULT_STOCK by name sees
# what the live process changed through the alias, and a rebuilt process does not.
ALIASED = '''
DEFAULT_STOCK = {"mug": 5}


class Shop:
    def __init__(self, init_config=None):
        self.stock = DEFAULT_STOCK
        self.sold = 0

    def sell(self, item: str) -> dict:
        """Sell one.

        Args:
            item: What to sell.
        """
        if self.stock.get(item, 0) <= 0:
            return {"success": False, "error": "sold out"}
        self.stock[item] -= 1
        self.sold += 1
        return {"success": True, "left": self.stock[item]}

    def shortfall(self) -> dict:
        """How far the stock is below the shop's standard stock."""
        return {"success": True, "below_standard": DEFAULT_STOCK["mug"] - self.stock["mug"]}
'''

# Ids come from a closure made at import: each rebuilt process starts counting again.
CLOSURE = '''
def _counter():
    issued = [0]

    def next_id():
        issued[0] += 1
        return issued[0]

    return next_id


_next_id = _counter()


class Shop:
    def __init__(self, init_config=None):
        self.orders = {}
        self.sold = 0

    def sell(self, item: str) -> dict:
        """Sell one.

        Args:
            item: What to sell.
        """
        order_id = _next_id()
        self.orders[str(order_id)] = item
        self.sold += 1
        return {"success": True, "order_id": order_id}

    def shortfall(self) -> dict:
        """How many orders there are."""
        return {"success": True, "below_standard": len(self.orders)}
'''

SCENARIO = {"scenario_id": "shop-two-sales", "env_id": "shop", "task": "Sell two mugs, then report.",
            "init_config": {},
            "checklist": [{"item": "Two sold.", "kind": "change",
                           "check": "def check_func(final_state):\n    return final_state['sold'] == 2"}],
            "reference_solution": [{"name": "sell", "arguments": {"item": "mug"}},
                                   {"name": "sell", "arguments": {"item": "mug"}},
                                   {"name": "shortfall", "arguments": {}}]}


def _catalog(tmp_path: Path, code: str) -> Path:
    package = tmp_path / "catalog" / "shop"
    package.mkdir(parents=True)
    (package / "env.json").write_text(json.dumps({"env_id": "shop", "class_name": "Shop", "summary": "A shop."}))
    (package / "env.py").write_text(code)
    (package / "scenarios.jsonl").write_text(json.dumps(SCENARIO) + "\n")
    return package.parent


@pytest.mark.parametrize(("code", "step", "live", "rebuilt"), [
    (ALIASED, "reference_solution[2] shortfall", '{"below_standard": 0, "success": true}',
     '{"below_standard": 2, "success": true}'),
    (CLOSURE, "reference_solution[1] sell", '{"order_id": 2, "success": true}', '{"order_id": 1, "success": true}'),
], ids=["module_object_through_an_alias", "closure"])
def test_validate_reports_a_class_whose_results_change_when_rebuilt(tmp_path: Path, code: str, step: str, live: str,
                                                                    rebuilt: str) -> None:
    build_environment(env_id="shop", class_name="Shop", code=code)  # the static check lets it through
    result = run("catalog", "validate", str(_catalog(tmp_path, code)))
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "rebuild changes the results" in line]
    assert line.startswith("PROBLEM shop/shop-two-sales: "), line
    assert f"{step} answered {live} in a live session but {rebuilt} when rebuilt from the stored state" in line, line


def test_a_class_that_keeps_everything_on_the_instance_validates(tmp_path: Path) -> None:
    code = ALIASED.replace("self.stock = DEFAULT_STOCK", "self.stock = dict(DEFAULT_STOCK)")
    result = run("catalog", "validate", str(_catalog(tmp_path, code)))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_timestamp_in_the_state_does_not_hide_what_a_rebuild_loses(tmp_path: Path) -> None:
    """Two live runs differ at the timestamp; the rebuilt run also differs in an answer that both
    live runs agree on: that is reported, and the timestamp is not."""
    code = "import time\n" + CLOSURE.replace("        self.sold += 1\n", "        self.sold += 1\n"
                                               "        self.stamp = time.time()\n")
    result = run("catalog", "validate", str(_catalog(tmp_path, code)))
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "rebuild changes the results" in line]
    assert "reference_solution[1] sell answered" in line and "stamp" not in line, line


def test_a_class_whose_only_difference_is_a_timestamp_validates_with_a_note(tmp_path: Path) -> None:
    code = "import time\n" + ALIASED.replace("self.stock = DEFAULT_STOCK", "self.stock = dict(DEFAULT_STOCK)") \
        .replace("        self.sold += 1\n", "        self.sold += 1\n        self.stamp = time.time()\n")
    result = run("catalog", "validate", str(_catalog(tmp_path, code)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "differ between two live runs too (the final state at /stamp); everything else is the same" \
        in result.stdout, result.stdout
