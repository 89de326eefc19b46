"""Assembling a class from the state code and the methods: imports hoisted and merged, indentation matched."""

from __future__ import annotations

import ast

from service.catalog.admission import build_environment
from synthesis.build.assembly import assemble, merge_imports
from synthesis.parsing.sources import MethodSource
from tests.synthesis.conftest import fixture_skeleton

STATE = '''from typing import Dict

# Module comment kept with the class below.
class Shelf:
  """Two-space indentation, as some models write."""

  def __init__(self):
    self.items: Dict[str, int] = {}
'''


def method(name: str, body: str, imports: list[str] | None = None) -> MethodSource:
    return MethodSource(name, imports or [], {name: f"def {name}(self) -> dict:\n{body}"})


def test_imports_are_hoisted_merged_and_deduplicated() -> None:
    assert merge_imports([
        "from typing import Dict", "import json", "from typing import Any, Dict", "from __future__ import annotations",
        "import datetime as dt", "import json", "from collections import Counter as C",
    ]) == [
        "from __future__ import annotations", "import datetime as dt", "import json",
        "from collections import Counter as C", "from typing import Any, Dict",
    ]  # fmt: skip


def test_methods_follow_the_class_body_indentation() -> None:
    out = assemble(STATE, "Shelf", [method("count", '  return {"success": True, "data": len(self.items)}',
                                           ["import json", "from typing import Any"])])  # fmt: skip
    tree = ast.parse(out.code)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    assert [f.name for f in cls.body if isinstance(f, ast.FunctionDef)] == ["__init__", "count"]
    assert out.code.startswith("import json\nfrom typing import Any, Dict\n")
    assert "# Module comment kept with the class below." in out.code


def test_a_name_already_defined_is_kept_once_and_reported() -> None:
    first = method("count", '  return {"success": True}')
    again = MethodSource("other", [], {"other": 'def other(self):\n  return {"success": True}',
                                       "count": 'def count(self):\n  return {"success": False}'})  # fmt: skip
    out = assemble(STATE, "Shelf", [first, again])
    assert out.code.count("def count") == 1 and out.skipped == ["other: count is already defined"]


def test_fixture_environment_assembles_into_working_tools() -> None:
    record = fixture_skeleton("clinic_appointments")
    env = build_environment(env_id="clinic_appointments", class_name=record["class_name"], code=record["code"])
    assert env.tool_names == {"get_owner_pets", "list_pet_appointments", "list_vets", "find_available_slots",
                              "book_appointment", "cancel_appointment"}  # fmt: skip
    assert record["code"].count("def _check_date") == 1  # two methods brought it; the first wins
    assert record["code"].splitlines()[:2] == ["import datetime", "from typing import Any, Dict, List, Literal, Optional, TypedDict"]


def test_a_method_is_replaced_or_removed_and_the_class_still_compiles() -> None:
    from synthesis.build.assembly import replace_method
    from synthesis.parsing.sources import parse_method
    from tests.synthesis.conftest import fixture_skeleton

    record = fixture_skeleton("clinic_appointments")
    fixed = parse_method('```python\nimport re\n\ndef cancel_appointment(self, appointment_id: str) -> dict:\n'
                         '    """Cancel.\n\n    Args:\n        appointment_id: the id.\n    """\n'
                         '    return {"success": False, "error": "closed"}\n```', "cancel_appointment")  # fmt: skip
    code = replace_method(record["code"], record["class_name"], "cancel_appointment", fixed)
    tree = ast.parse(code)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == record["class_name"])
    names = [n.name for n in cls.body if isinstance(n, ast.FunctionDef)]
    assert names.count("cancel_appointment") == 1 and "import re" in code and '"closed"' in code
    assert "book_appointment" in names  # the others stay
    before = [n.name for n in ast.parse(record["code"]).body[-1].body if isinstance(n, ast.FunctionDef)]  # type: ignore[attr-defined]
    assert names == before  # the repaired method stays where it stood
    removed = replace_method(code, record["class_name"], "cancel_appointment", None)
    assert "def cancel_appointment" not in removed and "def book_appointment" in removed


def test_a_rewrite_with_a_new_helper_keeps_the_method_in_place_and_puts_the_helper_after_it() -> None:
    from synthesis.build.assembly import replace_method
    from synthesis.parsing.sources import parse_method

    code = "class Shop:\n    def a(self) -> dict:\n        return {}\n\n    def b(self) -> dict:\n        return {}\n\n" \
           "    def c(self) -> dict:\n        return {}\n\n\nLIMIT = 3\n"  # fmt: skip
    fixed = parse_method('```python\ndef b(self) -> dict:\n    """B.\n    """\n    if self._check():\n        return {"success": True}\n'
                         '    return {"success": False, "error": "no"}\n\n\ndef _check(self) -> bool:\n    return True\n```', "b")  # fmt: skip
    out = replace_method(code, "Shop", "b", fixed)
    cls = next(n for n in ast.parse(out).body if isinstance(n, ast.ClassDef))
    assert [n.name for n in cls.body if isinstance(n, ast.FunctionDef)] == ["a", "b", "_check", "c"]
    assert out.rstrip().endswith("LIMIT = 3") and "self._check()" in out
