"""``synth variants`` (synthesis/stages/variants.py): two-turn variants of the bundled library's scenarios, a tool that
arrives in turn 2 or a card number the user gives only when asked, each validated turn by turn in the sandbox
and written as a package the catalog loads (and ``catalog validate`` passes) unchanged."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from sandbox.backends.process import ProcessBackend
from sandbox.pool.requests import WorkerPool
from sandbox.wire.limits import Limits
from service.catalog.collection import Catalog
from service.catalog.folders import bundled_catalog_dir
from service.catalog.model import Scenario
from service.engine.validate import Report, validate_catalog
from synthesis import cli
from synthesis.errors import ParseError
from synthesis.stages.variants import UNCHANGED, Held, held_parameter, mentions, parse_rewrite
from tests.scripted_openai import Running
from tests.synthesis.conftest import write_config

LIBRARY = bundled_catalog_dir() / "library_circulation"


def bundled() -> Catalog:
    catalog = Catalog()
    catalog.load_dir(bundled_catalog_dir())
    return catalog


def variants(tmp_path: Path, llm: Running, kind: str, *scenarios: str, catalog: Path | None = None) -> int:
    config = write_config(tmp_path, llm.url)
    chosen = [arg for s in scenarios for arg in ("--scenario", s)]
    source = ["--catalog", str(catalog)] if catalog is not None else []
    return cli.main(["synth", "variants", "--kind", kind, "--config", str(config), "--out", str(tmp_path / "out"),
                     *source, *chosen])


def written(tmp_path: Path) -> Catalog:
    catalog = Catalog()
    catalog.load_dir(tmp_path / "out")
    assert catalog.problems == []
    return catalog


def test_missing_param_holds_the_card_number_back_to_the_second_turn(
        tmp_path: Path, llm: Running, capsys: pytest.CaptureFixture[str]) -> None:
    assert variants(tmp_path, llm, "missing-param", "lib-001") == 0
    source = bundled().scenarios["lib-001"]
    variant = written(tmp_path).scenarios["lib-001-missing-param"]

    first, second = variant.turns
    assert "M002" not in first.message and first.message.startswith("Hi, this is Priya Natarajan. I'm returning")
    assert variant.task == first.message
    assert second.message == "Sorry, my library card is M002."
    assert (first.tools, second.tools) == ((), ())
    assert first.reference_solution == () and [c.check for c in first.checklist] == [UNCHANGED]
    assert first.checklist[0].kind == "keep"
    assert list(second.checklist) == source.checklist
    assert list(second.reference_solution or ()) == source.reference_solution
    assert variant.reference_solution == source.reference_solution
    assert "missing-param" in variant.tags
    # the model was told which value to leave out
    [conversation] = llm.script.conversations["library_circulation/variant_param/lib-001"]
    assert '`member_id` = "M002"' in conversation[-1]["content"]
    assert "kept     lib-001-missing-param" in capsys.readouterr().out


def test_missing_tool_offers_the_last_calls_tool_only_from_the_second_turn(tmp_path: Path, llm: Running) -> None:
    assert variants(tmp_path, llm, "missing-tool", "lib-001") == 0
    source = bundled().scenarios["lib-001"]
    variant = written(tmp_path).scenarios["lib-001-missing-tool"]

    first, second = variant.turns
    assert first.message == source.task  # the request as it was: the agent should say it cannot finish it yet
    assert second.tools == ("renew_loan",)
    assert second.message.startswith("Good news: the renewal desk is open again")
    assert [c.item for c in first.checklist] == ["Nothing was changed before 'renew_loan' was available"]
    assert list(second.checklist) == source.checklist
    assert "renew_loan" in llm.script.conversations["library_circulation/variant_tool/lib-001"][0][-1]["content"]


async def _validate(folder: Path) -> Report:
    workers = WorkerPool(ProcessBackend(), 2, Limits(call_timeout=3.0, check_timeout=2.0, memory_mb=256))
    await workers.start()
    try:
        return await validate_catalog([folder], workers)
    finally:
        await workers.close()


def test_written_variants_pass_catalog_validate(tmp_path: Path, llm: Running) -> None:
    """What the command wrote is served unchanged: ``catalog validate`` replays it turn by turn without a problem,
    and an agent that only ends turns does not pass (the second turn's checks need the solution)."""
    config = write_config(tmp_path, llm.url)
    for kind in ("missing-tool", "missing-param"):
        code = cli.main(["synth", "variants", "--kind", kind, "--config", str(config), "--out", str(tmp_path / "out"),
                         "--scenario", "lib-001"])
        assert code == 0
    assert sorted(written(tmp_path).scenarios) == ["lib-001-missing-param", "lib-001-missing-tool"]  # both kept

    report = asyncio.run(_validate(tmp_path / "out"))

    assert (report.problems, report.scenarios) == ([], 2)


def test_a_rewrite_that_still_states_the_value_is_sent_back_with_the_reason(tmp_path: Path, llm: Running) -> None:
    assert variants(tmp_path, llm, "missing-param", "lib-002") == 0

    first, second = written(tmp_path).scenarios["lib-002-missing-param"].turns
    assert first.message.startswith("Sofia Rossi would like to read Circe") and "M005" not in first.message
    assert second.message == "Sofia's card number is M005."
    asked = llm.script.conversations["library_circulation/variant_param/lib-002"]
    assert len(asked) == 2
    assert 'the rewritten task still states "M005"' in asked[1][-1]["content"]


def test_a_variant_whose_solution_does_not_validate_is_not_written(
        tmp_path: Path, llm: Running, capsys: pytest.CaptureFixture[str]) -> None:
    """A source whose solution no longer satisfies its checks (the Dune renewal left out) gives a variant whose
    second turn fails when replayed: it is reported and nothing is written."""
    broken = tmp_path / "source" / "library_circulation"
    shutil.copytree(LIBRARY, broken)
    lines = []
    for line in (broken / "scenarios.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["scenario_id"] == "lib-001":
            record["reference_solution"] = [c for c in record["reference_solution"] if c["name"] != "renew_loan"]
        lines.append(json.dumps(record))
    (broken / "scenarios.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")

    assert variants(tmp_path, llm, "missing-param", "lib-001", catalog=tmp_path / "source") == 3

    said = capsys.readouterr().out
    assert "dropped  lib-001: library_circulation/lib-001-missing-param: turns[1]: check not passed" in said
    assert "Dune loan (L0001)" in said
    assert not (tmp_path / "out" / "library_circulation").exists()


def test_an_unknown_scenario_exits_2(tmp_path: Path, llm: Running, capsys: pytest.CaptureFixture[str]) -> None:
    assert variants(tmp_path, llm, "missing-tool", "lib-999") == 2
    assert "no scenario 'lib-999'" in capsys.readouterr().err
    assert llm.script.conversations == {}


def test_the_held_parameter_is_the_first_required_argument_the_task_states() -> None:
    catalog = bundled()
    env = catalog.environments["library_circulation"]
    # lib-001 starts with return_book(loan_id L0003), which the task does not state; checkout_book's member_id is.
    assert held_parameter(env, catalog.scenarios["lib-001"]) == Held("checkout_book", "member_id", "M002")
    unstated = catalog.scenarios["lib-001"].task.replace("library card M002", "a library card")
    assert held_parameter(env, Scenario(**{**vars(catalog.scenarios["lib-001"]), "task": unstated})) is None


def test_a_value_is_mentioned_only_as_a_whole_word() -> None:
    assert mentions("my card is m002.", "M002")
    assert not mentions("my card is M0021", "M002")
    assert mentions("book 5 copies", 5) and not mentions("book 15 copies", 5) and not mentions("book 5.5", 5)
    assert not mentions("it is true", True)


def test_a_reply_that_does_not_give_the_value_is_refused() -> None:
    held = Held("checkout_book", "member_id", "M002")
    answer = '```json\n{"task": "Hi, I would like to borrow a book.", "reply": "Here you go."}\n```'
    with pytest.raises(ParseError, match='the reply does not give "M002"'):
        parse_rewrite(answer, held)


def test_an_unreachable_endpoint_exits_3_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import free_port

    config = write_config(tmp_path, f"http://127.0.0.1:{free_port()}/v1")
    code = cli.main(["synth", "variants", "--kind", "missing-param", "--config", str(config),
                     "--out", str(tmp_path / "out"), "--scenario", "lib-001", "--scenario", "lib-002"])

    assert code == 3
    assert "error: the endpoint cannot serve this run" in capsys.readouterr().err
    assert not (tmp_path / "out" / "library_circulation").exists()
