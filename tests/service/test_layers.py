"""Package layers: the allow-list, and each set of requirements installed once by real pip from a
wheelhouse the test writes, read-only, reused across restarts."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.catalog.admission import build_environment
from service.catalog.model import CatalogError
from service.catalog.packages.layers import BUILD_UID, Layers
from service.catalog.requirements import SETTING, AllowList, Packages, parse
from service.server.settings import Settings
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


# Text pip would read as a place (a folder, a file, a URL) or a condition, never a version.
NOT_VERSIONS = [
    "efdemo===/../../proc/1/root/tmp/p",
    "efdemo===1.0",
    "efdemo>=1.0,===2",
    "efdemo @ file:///tmp/x",
    "efdemo==1.0; python_version>'3'",
    "efdemo[extra]==1.0",
    "./efdemo",
    "/tmp/efdemo",
    "efdemo==/tmp/x",
    "efdemo>=1.*",
    "efdemo==1.0 --index-url https://example.invalid",
]


@pytest.mark.parametrize("text", NOT_VERSIONS)
def test_a_requirement_is_a_project_and_versions_only(text: str) -> None:
    with pytest.raises(CatalogError) as caught:
        AllowList(["efdemo"]).pins(["efdemo==1.0", text])
    assert caught.value.reason == "invalid_requirement" and caught.value.field == "requirements[1]"
    assert repr(text) in caught.value.message
    with pytest.raises(CatalogError) as caught:
        AllowList([text])
    assert caught.value.field == SETTING and SETTING in caught.value.message


def test_pins_are_rendered_from_the_parsed_name_and_versions() -> None:
    assert str(parse("EF_Demo (>=01.0, ~=1.2 ,!=1.3.*)")) == "ef-demo!=1.3.*,>=1.0,~=1.2"
    assert str(parse("efdemo==1.0+cpu")) == "efdemo==1.0+cpu"  # a local label: letters, digits and dots
    pins = AllowList(["EF.Demo<3"]).pins(["ef_demo==2.00"])
    assert [str(p) for p in pins] == ["ef-demo<3,==2.0"]


def test_a_bad_allow_list_entry_fails_at_start_up_naming_the_setting() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(allowed_requirements=["efdemo", "efextra===/../../tmp/p"])
    assert SETTING in str(caught.value) and "efextra===/../../tmp/p" in str(caught.value)
    with pytest.raises(ValidationError, match="worker's uid"):
        Settings(build_uid=65534)


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


async def test_two_wheels_claiming_one_version_make_two_layers(tmp_path: Path) -> None:
    root = tmp_path / "layers"
    pins = AllowList(["efdemo"]).pins(["efdemo==1.0"])
    layers, wheels = [], []
    for value in ("first", "second"):
        folder = tmp_path / value
        wheels.append(make_wheel(folder, "efdemo", "1.0", {"efdemo/__init__.py": f"VALUE = {value!r}\n"}))
        layers.append(await Layers(root, wheelhouse=folder).ensure(pins))
    # The second build does not get the first one's files: each is the code of its own wheel.
    assert [(Path(layer.site) / "efdemo" / "__init__.py").read_text() for layer in layers] == [
        "VALUE = 'first'\n", "VALUE = 'second'\n"]
    assert layers[0].key != layers[1].key and layers[0].installed == layers[1].installed == ("efdemo==1.0",)
    for layer, wheel in zip(layers, wheels, strict=True):
        meta = json.loads((Path(layer.site).parent / "layer.json").read_text())
        assert meta["wheels"] == {"efdemo==1.0": hashlib.sha256(wheel.read_bytes()).hexdigest()}


@pytest.fixture
def record() -> Iterator[Path]:
    """A folder any uid may write to (pytest's own is closed to other users)."""
    folder = Path(tempfile.mkdtemp(prefix="envfoundry-pip-record-"))
    os.chmod(folder, 0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


async def test_pip_runs_unprivileged_with_an_environment_of_its_own(tmp_path: Path, wheelhouse: Path, record: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVFOUNDRY_TEST_SECRET", "do-not-pass-on")
    monkeypatch.setenv("PIP_INDEX_URL", "https://secret-token@example.invalid/simple")
    # What pip is started with: its uid, its environment, its folder, and whether it can enter the
    # filesystem of a process of the service's (this test's) through /proc.
    wrapper = tmp_path / "bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ]; then
    {{ echo "uid=$(id -u)"; echo "cwd=$(pwd)"; env;
       ls /proc/{os.getpid()}/root/ >/dev/null 2>&1 && echo "service-root=visible"; }} > {record}/pip.txt 2>&1
fi
exec {sys.executable} "$@"
""")
    wrapper.chmod(0o755)
    layer = await Layers(tmp_path / "layers", wheelhouse=wheelhouse, python=str(wrapper)).ensure(
        AllowList(["efdemo"]).pins(["efdemo==1.0"]))
    assert (Path(layer.site) / "efdemo" / "__init__.py").read_text() == "VALUE = 'one'\n"
    seen = (record / "pip.txt").read_text()
    lines = dict(line.partition("=")[::2] for line in seen.splitlines())
    if os.geteuid() == 0:
        assert lines["uid"] == str(BUILD_UID)
    else:
        assert lines["uid"] == str(os.getuid())
    assert "service-root" not in lines
    assert "ENVFOUNDRY_TEST_SECRET" not in lines and "do-not-pass-on" not in seen
    assert "PIP_INDEX_URL" not in lines  # (with a wheelhouse, no index at all)
    assert lines["HOME"] == lines["cwd"] != os.environ.get("HOME") and ".build-" in lines["cwd"]
    assert lines["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert not Path(lines["cwd"]).exists()  # the scratch folder went with the build


def test_pip_error_lines_name_no_host_path_but_the_wheelhouse(tmp_path: Path, wheelhouse: Path) -> None:
    layers = Layers(tmp_path / "layers", wheelhouse=wheelhouse)
    text = ("ERROR: Invalid requirement: '/proc/4242/root/tmp/p' (file:///srv/x/y.whl) ~/z "
            f"ERROR: Wheel 'efdemo' located at {wheelhouse}/efdemo-1.0-py3-none-any.whl is invalid, see https://x.invalid/a/b")
    assert layers._redact(text) == (
        "ERROR: Invalid requirement: '<path>' (<path>) ~/z "
        f"ERROR: Wheel 'efdemo' located at {wheelhouse}/efdemo-1.0-py3-none-any.whl is invalid, see https://x.invalid/a/b")


async def test_the_services_index_configuration_reaches_pip(tmp_path: Path, wheelhouse: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # No wheelhouse setting: pip takes packages from where the service's own pip configuration says,
    # here find-links in the service's environment (and an index that has nothing).
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheelhouse))
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "empty-index").as_uri())
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    layer = await Layers(tmp_path / "layers").ensure(AllowList(["efdemo"]).pins(["efdemo==2.0"]))
    assert (Path(layer.site) / "efdemo" / "__init__.py").read_text() == "VALUE = 'two'\n"
    meta = json.loads((Path(layer.site).parent / "layer.json").read_text())
    wheel = wheelhouse / "efdemo-2.0-py3-none-any.whl"
    assert meta["wheels"] == {"efdemo==2.0": hashlib.sha256(wheel.read_bytes()).hexdigest()}  # (pip's --report)
