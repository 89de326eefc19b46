"""One release number for the three packages, and one contract version for the wire API.

The service, the Python client and the TypeScript client are released together under one version,
below 1.0 while their interfaces may still change; the REST contract is versioned apart, by its
``/v1`` paths and the OpenAPI document's ``info.version``."""

from __future__ import annotations

import json
import tomllib

import envfoundry_client

from tests.conftest import ROOT


def test_the_service_and_both_clients_carry_one_release_version() -> None:
    service = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    python_client = tomllib.loads((ROOT / "clients/python/pyproject.toml").read_text())["project"]["version"]
    package = json.loads((ROOT / "clients/typescript/package.json").read_text())
    lock = json.loads((ROOT / "clients/typescript/package-lock.json").read_text())
    versions = {"envfoundry": service, "envfoundry-client (Python)": python_client,
                "envfoundry_client.__version__": envfoundry_client.__version__,
                "envfoundry-client (TypeScript)": package["version"], "package-lock.json": lock["version"],
                "package-lock.json packages['']": lock["packages"][""]["version"]}
    assert len(set(versions.values())) == 1, versions


def test_the_wire_contract_is_versioned_by_its_paths() -> None:
    contract = json.loads((ROOT / "openapi/openapi.json").read_text())
    assert contract["info"]["version"].split(".")[0] == "1"
    assert all(path.startswith("/v1/") or path in ("/healthz", "/readyz", "/metrics") for path in contract["paths"])
