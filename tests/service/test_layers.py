"""Package layers: the allow-list, and each set of requirements installed once by real pip from a
wheelhouse the test writes, read-only, reused across restarts."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from service.catalog import CatalogError, build_environment
from service.layers import Layers
from service.requirements import SETTING, AllowList, Packages
from tests.wheels import make_wheel

pytestmark = [pytest.mark.timeout(300), pytest.mark.anyio]


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    make_wheel(folder, "efdemo", "1.0", {"efdemo/__init__.py": "VALUE = 'one'\n"})
    make_wheel(folder, "efdemo", "2.0", {"efdemo/__init__.py": "VALUE = 'two'\n"})
    make_wheel(folder, "efextra", "0.1", {"efextra.py": "def hello():\n    return 'hi'\n"})
    return folder


def test_allowed_requirements_are_installed_within_both_ranges() -> None:
    allowed = AllowList(["efdemo<2", "efextra"])
    assert [str(p) for p in allowed.pins(["EFDemo>=0.5", "efextra==0.1"])] == ["efdemo<2,>=0.5", "efextra==0.1"]


@pytest.mark.parametrize(("declared", "reason", "named"), [
    (["numpy"], "requirement_not_allowed", "numpy"),
    (["efdemo @ https://example.invalid/x.whl"], "invalid_requirement", "efdemo"),
    (["efdemo; python_version > '3'"], "invalid_requirement", "efdemo"),
    (["efdemo==1.0", "efdemo==2.0"], "invalid_requirement", "twice"),
    (["not a requirement!"], "invalid_requirement", "PEP 508"),
])
def test_a_refused_requirement_names_itself_and_the_setting(declared: list[str], reason: str, named: str) -> None:
    with pytest.raises(CatalogError) as caught:
        AllowList(["efdemo"]).pins(declared)
    assert caught.value.reason == reason
    assert named in caught.value.message
    if reason == "requirement_not_allowed":
        assert SETTING in caught.value.message and caught.value.field == "requirements[0]"


async def test_a_set_is_built_once_read_only_and_found_again_after_a_restart(tmp_path: Path,
                                                                          wheelhouse: Path) -> None:
    root = tmp_path / "layers"
    layers = Layers(root, wheelhouse=wheelhouse)
    pins = AllowList(["efdemo", "efextra"]).pins(["efdemo==1.0", "efextra"])
    first, second = await asyncio.gather(layers.ensure(pins), layers.ensure(pins))  # concurrent: one build
    assert first == second and layers.builds == 1
    assert first.installed == ("efdemo==1.0", "efextra==0.1")
    assert first.modules == {"efdemo", "efextra"}
    site = Path(first.site)
    assert (site / "efdemo" / "__init__.py").read_text() == "VALUE = 'one'\n"
    assert not os.stat(site / "efdemo" / "__init__.py").st_mode & 0o222
    assert not os.stat(site).st_mode & 0o222
    assert [p.name for p in root.iterdir() if p.name.startswith(".build-")] == []

    restarted = Layers(root, wheelhouse=wheelhouse)  # a new service process on the same machine
    again = await restarted.ensure(pins)
    assert again == first and restarted.builds == 0
    other = await restarted.ensure(AllowList(["efdemo"]).pins(["efdemo==2.0"]))
    assert other.key != first.key and restarted.builds == 1


async def test_two_services_on_one_machine_build_a_set_once(tmp_path: Path, wheelhouse: Path) -> None:
    root = tmp_path / "layers"
    pins = AllowList(["efdemo"]).pins(["efdemo==2.0"])
    one, two = Layers(root, wheelhouse=wheelhouse), Layers(root, wheelhouse=wheelhouse)  # no shared task
    first, second = await asyncio.gather(one.ensure(pins), two.ensure(pins))
    assert first == second and one.builds + two.builds == 1  # the file lock made the other wait, then find it
    assert len([p for p in root.iterdir() if p.name not in ("requests", "locks")]) == 1


async def test_a_failed_build_leaves_nothing_behind(tmp_path: Path, wheelhouse: Path) -> None:
    root = tmp_path / "layers"
    layers = Layers(root, wheelhouse=wheelhouse)
    with pytest.raises(CatalogError) as caught:
        await layers.ensure(AllowList(["efdemo"]).pins(["efdemo==9.9"]))
    assert caught.value.reason == "requirements_not_installable"
    assert "efdemo==9.9" in caught.value.message and str(wheelhouse) in caught.value.message
    assert sorted(p.name for p in root.iterdir()) == ["locks", "requests"]
    assert list((root / "requests").iterdir()) == []


async def test_imports_must_be_declared_and_provided(tmp_path: Path, wheelhouse: Path) -> None:
    packages = Packages(AllowList(["efdemo"]), Layers(tmp_path / "layers", wheelhouse=wheelhouse))
    code = "import json\nimport efdemo\nfrom efextra import hello\nclass Env:\n    pass\n"
    undeclared = build_environment(env_id="e", class_name="Env", code=code)
    assert undeclared.imports == ["efdemo", "efextra"]
    with pytest.raises(CatalogError) as caught:
        await packages.attach(undeclared)
    assert caught.value.reason == "undeclared_import" and "'efdemo'" in caught.value.message
    partly = build_environment(env_id="e", class_name="Env", code=code, requirements=["efdemo"])
    with pytest.raises(CatalogError) as caught:
        await packages.attach(partly)
    assert caught.value.reason == "undeclared_import" and "'efextra'" in caught.value.message
    fine = build_environment(env_id="e", class_name="Env", code="import efdemo\nclass Env:\n    pass\n",
                             requirements=["efdemo==1.0"])
    attached = await packages.attach(fine)
    assert len(attached.layers) == 1 and Path(attached.layers[0], "efdemo").is_dir()
