"""Environments that need packages, served end to end by the real app on both sandbox backends:
the layer reaches only the environment that declared it, refused imports and requirements are
422, a catalog's layer is reused across restarts, and pydantic models as state round-trip."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.catalog.packages.layers import Layers
from service.catalog.requirements import AllowList
from tests.conftest import Server, start_server
from tests.in_process import AppServer, start_app
from tests.wheels import make_wheel

pytestmark = pytest.mark.timeout(600)

PYDANTIC = "pydantic==2.14.4"  # the version this project's own install resolves (one wheel set to fetch)

DEMO_ENV = '''
import efdemo


class Demo:
    """Reads a value from the package it requires."""

    def __init__(self, config=None):
        self.reads = 0

    def read(self) -> str:
        """Read the package's value."""
        self.reads += 1
        return efdemo.VALUE
'''

PLAIN_ENV = '''
import importlib
import sys


class Plain:
    """Declares nothing, and tries to import the other environment's package by name."""

    def __init__(self, config=None):
        self.tries = 0

    def sneak(self) -> str:
        """Import efdemo at call time."""
        self.tries += 1
        return importlib.import_module("efdemo").VALUE

    def peek(self, site: str) -> str:
        """Read the other environment's layer by its path, and import from it.

        Args:
            site: The layer's folder.
        """
        outcomes = []
        try:
            with open(site + "/efdemo/__init__.py") as source:
                outcomes.append(source.read())
        except OSError as exc:
            outcomes.append(type(exc).__name__)
        sys.path.insert(0, site)
        try:
            outcomes.append(importlib.import_module("efdemo").VALUE)
        except ImportError as exc:
            outcomes.append(type(exc).__name__)
        return " ".join(outcomes)
'''


def _package(folder: Path, env_id: str, class_name: str, code: str, requirements: list[str]) -> Path:
    package = folder / env_id
    package.mkdir(parents=True)
    (package / "env.py").write_text(code)
    (package / "env.json").write_text(json.dumps({"env_id": env_id, "class_name": class_name,
                                                  "requirements": requirements}))
    return package


def _env(tmp: Path, backend: str, allowed: str, wheelhouse: Path, **extra: str) -> dict[str, str]:
    return {"ENVFOUNDRY_ALLOWED_REQUIREMENTS": allowed, "ENVFOUNDRY_WHEELHOUSE": str(wheelhouse),
            "ENVFOUNDRY_LAYERS_DIR": str(tmp / "layers"), "ENVFOUNDRY_SANDBOX": backend, **extra}


def _serve(tmp: Path, backend: str, allowed: str, wheelhouse: Path, catalogs: tuple[Path, ...],
           **extra: str) -> Server:
    """A server process: for the tests that read its log or restart it."""
    return start_server(tmp, extra_env=_env(tmp, backend, allowed, wheelhouse, **extra), catalogs=catalogs, workers=1)


def _serve_here(tmp: Path, backend: str, allowed: str, wheelhouse: Path, catalogs: tuple[Path, ...],
                **extra: str) -> AppServer:
    """The app in this process (tests/in_process.py), for the others."""
    return start_app(extra_env=_env(tmp, backend, allowed, wheelhouse, **extra), catalogs=catalogs, workers=1)


def _call(http: Any, sid: str, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    answer = http.post(f"/v1/sessions/{sid}/calls", json={"name": name, "arguments": arguments or {}})
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


@pytest.fixture(params=["process", "docker"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "docker":
        request.getfixturevalue("docker_client")  # the engine and the image under test, or a skip saying why
    return str(request.param)


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    make_wheel(folder, "efdemo", "1.0", {"efdemo/__init__.py": "VALUE = 'from the layer'\n"})
    return folder


def test_a_declared_package_is_served_to_its_environment_only(tmp_path: Path, backend: str,
                                                              wheelhouse: Path) -> None:
    catalog = tmp_path / "catalog"
    _package(catalog, "demo", "Demo", DEMO_ENV, ["efdemo==1.0"])
    server = _serve(tmp_path, backend, "efdemo", wheelhouse, (catalog,))
    try:
        with server.client() as http:
            detail = http.get("/v1/environments/demo").json()
            assert detail["requirements"] == ["efdemo==1.0"]
            sid = http.post("/v1/sessions", json={"env_id": "demo", "init_config": {}}).json()["session_id"]
            step = _call(http, sid, "read")
            assert step["ok"], step
            assert step["result"] == "from the layer"

            # Another environment, in the same (only) worker, that declares nothing.
            created = http.post("/v1/environments", json={"env_id": "plain", "class_name": "Plain",
                                                           "code": PLAIN_ENV})
            assert created.status_code == 201, created.text
            other = http.post("/v1/sessions", json={"env_id": "plain", "init_config": {}}).json()["session_id"]
            step = _call(http, other, "sneak")
            assert not step["ok"]
            assert "No module named 'efdemo'" in step["error"]["message"]
            # Nor can it reach the layer by its path: the files are hidden from its processes.
            site = next(p for p in (tmp_path / "layers").iterdir() if p.name not in ("requests", "locks")) / "site"
            assert _call(http, other, "peek", {"site": str(site)})["result"] == "PermissionError ModuleNotFoundError"
            assert _call(http, sid, "read")["result"] == "from the layer"  # and the first still has it
    finally:
        server.stop()
    # Keeping the layers root readable left the worker's filesystem confinement whole.
    assert "cannot build a private mount namespace" not in server.log.read_text()
    layers = [p for p in (tmp_path / "layers").iterdir() if p.name not in ("requests", "locks")]
    assert len(layers) == 1
    built = layers[0].stat()

    restarted = _serve(tmp_path, backend, "efdemo", wheelhouse, (catalog,))
    try:
        with restarted.client() as http:
            sid = http.post("/v1/sessions", json={"env_id": "demo", "init_config": {}}).json()["session_id"]
            assert _call(http, sid, "read")["result"] == "from the layer"
    finally:
        restarted.stop()
    again = [p for p in (tmp_path / "layers").iterdir() if p.name not in ("requests", "locks")]
    assert again == layers and again[0].stat().st_ino == built.st_ino  # the same folder, not built again


def test_refused_imports_and_requirements_are_422_naming_them(tmp_path: Path, wheelhouse: Path) -> None:
    catalog = tmp_path / "catalog"
    _package(catalog, "undeclared", "Demo", DEMO_ENV, [])
    _package(catalog, "forbidden", "Demo", DEMO_ENV, ["numpy"])
    server = _serve(tmp_path, "process", "efdemo", wheelhouse, (catalog,))
    try:
        with server.client() as http:
            # catalog load skips both packages, as any broken package
            assert {e["env_id"] for e in http.get("/v1/environments").json()["environments"]}.isdisjoint(
                {"undeclared", "forbidden"})
            cases = [
                ({"code": DEMO_ENV}, "undeclared_import", "'efdemo'"),
                ({"code": DEMO_ENV, "requirements": ["numpy==2.0"]}, "requirement_not_allowed", "numpy==2.0"),
                ({"code": DEMO_ENV, "requirements": ["efdemo==7.0"]}, "requirements_not_installable", "efdemo==7.0"),
            ]
            for i, (fields, reason, named) in enumerate(cases):
                answer = http.post("/v1/environments", json={"env_id": f"refused-{i}", "class_name": "Demo",
                                                              **fields})
                assert answer.status_code == 422, answer.text
                assert answer.headers["content-type"].startswith("application/problem+json")
                problem = answer.json()
                assert problem["reason"] == reason and named in problem["detail"], problem
                if reason != "requirements_not_installable":
                    assert problem["setting"] == "ENVFOUNDRY_ALLOWED_REQUIREMENTS"
                    assert "ENVFOUNDRY_ALLOWED_REQUIREMENTS" in problem["detail"]
                assert http.get(f"/v1/environments/refused-{i}").status_code == 404  # nothing was stored
    finally:
        server.stop()
    log = server.log.read_text()
    assert "undeclared: undeclared_import" in log and "forbidden: requirement_not_allowed" in log


# Requirements that name a place or a condition: each is refused before pip runs, naming itself.
NOT_VERSIONS = [
    ["efdemo===/../../proc/1/root/tmp/p"],
    ["efdemo @ file:///tmp/x"],
    ["efdemo==1.0; python_version>'3'"],
    ["efdemo[extra]==1.0"],
    ["./efdemo"],
    ["efextra==0.1", "efdemo>=1.0,===2"],
]


def test_requirements_that_are_not_versions_are_422_before_pip_runs(tmp_path: Path, backend: str,
                                                                    wheelhouse: Path) -> None:
    # What the tenant's own code could have written for pip to build, were its path taken for one.
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "setup.py").write_text(f"open({str(tmp_path / 'built')!r}, 'w').write('ran')\n"
                                      "from setuptools import setup\nsetup(name='efdemo', version='9')\n")
    make_wheel(wheelhouse, "efextra", "0.1", {"efextra.py": "X = 1\n"})
    server = _serve_here(tmp_path, backend, "efdemo\nefextra", wheelhouse, ())
    try:
        with server.client() as http:
            for i, requirements in enumerate([*NOT_VERSIONS, [f"efdemo==={planted}"]]):
                answer = http.post("/v1/environments", json={"env_id": f"bad-{i}", "class_name": "Demo",
                                                              "code": DEMO_ENV, "requirements": requirements})
                assert answer.status_code == 422, answer.text
                assert answer.headers["content-type"].startswith("application/problem+json")
                problem = answer.json()
                at = len(requirements) - 1
                assert problem["reason"] == "invalid_requirement", problem
                assert problem["field"] == f"requirements[{at}]", problem
                assert f"requirements[{at}]" in problem["detail"] and repr(requirements[at]) in problem["detail"]
                assert http.get(f"/v1/environments/bad-{i}").status_code == 404
    finally:
        server.stop()
    assert not (tmp_path / "built").exists()
    layers = tmp_path / "layers"
    assert not layers.exists() or [p.name for p in layers.iterdir() if p.name not in ("requests", "locks")] == []


TAU_STYLE_ENV = '''
from typing import Optional

from pydantic import BaseModel, Field


class Passenger(BaseModel):
    name: str
    seat: Optional[str] = None


class Reservation(BaseModel):
    reservation_id: str
    passengers: list[Passenger] = Field(default_factory=list)
    status: str = "active"


class FlightDB(BaseModel):
    model_config = {"extra": "allow"}
    reservations: dict[str, Reservation] = Field(default_factory=dict)


class Airline:
    """A tau2-bench-style domain: its database is a pydantic model."""

    def __init__(self, config=None):
        self.db = FlightDB.model_validate((config or {}).get("seed") or {"reservations": {}})

    def cancel(self, reservation_id: str) -> dict:
        """Cancel a reservation.

        Args:
            reservation_id: Which reservation.
        """
        reservation = self.db.reservations[reservation_id]
        reservation.status = "cancelled"
        return reservation.model_dump()

    def add_passenger(self, reservation_id: str, name: str) -> int:
        """Add a passenger to a reservation.

        Args:
            reservation_id: Which reservation.
            name: The passenger's name.
        """
        passengers = self.db.reservations[reservation_id].passengers
        passengers.append(Passenger(name=name))
        return len(passengers)
'''


@pytest.fixture(scope="session")
def pydantic_wheels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """pydantic and its dependencies as wheels, fetched once through pip's configured index."""
    folder = tmp_path_factory.mktemp("pydantic-wheels")
    folder.chmod(0o755)  # (pip runs as a uid of its own: it must read the wheelhouse)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--dest",
                    str(folder), PYDANTIC], check=True, timeout=600)
    yield folder


def test_pydantic_models_as_state_round_trip_through_calls_forks_and_the_store(
        tmp_path: Path, backend: str, pydantic_wheels: Path) -> None:
    catalog = tmp_path / "catalog"
    _package(catalog, "airline", "Airline", TAU_STYLE_ENV, [PYDANTIC])
    seed = {"reservations": {"R1": {"reservation_id": "R1", "passengers": [{"name": "Ada"}]}}, "note": "x"}
    allowed = "pydantic>=2.7,<3"
    # Built ahead by another process, as a second service on the machine would (the server finds it;
    # building five distributions at start-up could outlast the test's readiness wait on a busy machine).
    asyncio.run(Layers(tmp_path / "layers", wheelhouse=pydantic_wheels).ensure(AllowList([allowed]).pins([PYDANTIC])))
    # No live sessions: every call rebuilds the instance from the stored (encoded) state.
    server = _serve_here(tmp_path, backend, allowed, pydantic_wheels, (catalog,), ENVFOUNDRY_RESIDENTS="0")
    try:
        with server.client() as http:
            sid = http.post("/v1/sessions", json={"env_id": "airline", "init_config": {"seed": seed}}).json()[
                "session_id"]
            step = _call(http, sid, "cancel", {"reservation_id": "R1"})
            assert step["ok"], step
            assert step["result"] == {"reservation_id": "R1", "passengers": [{"name": "Ada", "seat": None}],
                                      "status": "cancelled"}
            fork = http.post(f"/v1/sessions/{sid}/fork", json={}).json()["session_id"]
            assert _call(http, fork, "add_passenger", {"reservation_id": "R1", "name": "Bo"})["result"] == 2
            assert _call(http, fork, "add_passenger", {"reservation_id": "R1", "name": "Cy"})["result"] == 3
            assert _call(http, sid, "add_passenger", {"reservation_id": "R1", "name": "Di"})["result"] == 2
            state = http.get(f"/v1/sessions/{sid}/state").json()["state"]
            reservation = state["db"]["reservations"]["R1"]
            assert reservation["status"] == "cancelled"
            assert [p["name"] for p in reservation["passengers"]] == ["Ada", "Di"]
            forked = http.get(f"/v1/sessions/{fork}/state").json()["state"]
            assert [p["name"] for p in forked["db"]["reservations"]["R1"]["passengers"]] == ["Ada", "Bo", "Cy"]
            # A check sees the models themselves, with what pydantic keeps beside their fields.
            scenario = {"env_id": "airline", "task": "cancel R1", "init_config": {"seed": seed}, "checklist": [
                {"item": "cancelled, models intact", "check":
                    "def check_func(s):\n"
                    "    r = s['db'].reservations['R1']\n"
                    "    return (r.status == 'cancelled' and r.model_fields_set == {'reservation_id', 'passengers',"
                    " 'status'}\n"
                    "            and s['db'].__pydantic_extra__ == {'note': 'x'}\n"
                    "            and r.passengers[0].model_fields_set == {'name'}\n"
                    "            and type(r).model_validate(r.model_dump()) == r)\n"}]}
            created = http.post("/v1/scenarios", json=scenario)
            assert created.status_code == 201, created.text
            scored = http.post("/v1/sessions", json={"scenario_id": created.json()["scenario_id"]}).json()
            assert http.post(f"/v1/sessions/{scored['session_id']}/score").json()["passed"] == 0
            _call(http, scored["session_id"], "cancel", {"reservation_id": "R1"})
            score = http.post(f"/v1/sessions/{scored['session_id']}/score").json()
            assert score["passed"] == 1, score
    finally:
        server.stop()
