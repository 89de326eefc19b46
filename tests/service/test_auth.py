"""API keys, scopes and tenants, against the real app in this process (tests/in_process.py); what a tenant adds is invisible to the others."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.api.auth import KeyFileError, KeyRing, digest, new_key
from tests.conftest import ROOT, keyed_server
from tests.in_process import AppServer, start_app
from tests.service.test_api import problem

WALLET = '''
class Wallet:
    def __init__(self):
        self.balance = 0

    def deposit(self, amount: int) -> dict:
        """Add money."""
        self.balance += amount
        return {"success": True, "data": self.balance}
'''


def test_key_lines_are_parsed_and_bad_ones_named() -> None:
    key, line = new_key("acme", ["run", "admin"])
    ring = KeyRing.parse(f"# keys\n\n{line}\n")
    principal = ring.authenticate(f"Bearer {key}", "admin")
    assert principal.tenant == "acme" and principal.scopes == {"run", "admin"}
    assert line == f"sha256:{digest(key)} acme run,admin" and key not in line
    with pytest.raises(KeyFileError, match="line 2"):
        KeyRing.parse(f"{line}\nsha256:abc acme run")
    with pytest.raises(KeyFileError, match="unknown scope"):
        KeyRing.parse(f"sha256:{'0' * 64} acme run,root")
    assert not KeyRing.parse("").enabled


class Keys:
    def __init__(self) -> None:
        self.admin_a, line_a = new_key("tenant-a", ["run", "admin"])
        self.run_a, line_run = new_key("tenant-a", ["run"])
        self.admin_b, line_b = new_key("tenant-b", ["run", "admin"])
        self.lines = ";".join([line_a, line_run, line_b])


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture(scope="module", params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def keyed(request: pytest.FixtureRequest, keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    yield from keyed_server(request, tmp_path_factory.mktemp("keyed"), keys.lines.replace(";", "\n"),
                            {"ENVFOUNDRY_MAX_ENVIRONMENTS": "2"}, start=start_app)


def as_(server: AppServer, key: str) -> httpx.Client:
    return server.client(headers={"Authorization": f"Bearer {key}"})


def test_requests_without_a_valid_key_are_401(keyed: AppServer) -> None:
    with keyed.client() as anonymous:
        assert anonymous.get("/healthz").status_code == 200
        response = anonymous.get("/v1/environments")
        problem(response, 401, "unauthorized")
        assert response.headers["WWW-Authenticate"] == "Bearer"
        problem(anonymous.get("/v1/environments", headers={"Authorization": "Bearer efk_wrong"}), 401, "unauthorized")
        problem(anonymous.post("/v1/sessions", json={"scenario_id": "probe-001"},
                               headers={"Authorization": "Basic abc"}), 401, "unauthorized")


def test_registering_code_needs_the_admin_scope(keyed: AppServer, keys: Keys) -> None:
    with as_(keyed, keys.run_a) as runner:
        assert runner.post("/v1/sessions", json={"scenario_id": "probe-001"}).status_code == 201
        body = problem(runner.post("/v1/environments", json={"env_id": "w-run", "class_name": "Wallet",
                                                             "code": WALLET}), 403, "forbidden")
        assert body["scope"] == "admin"
        problem(runner.post("/v1/scenarios", json={"env_id": "probe", "task": "t"}), 403, "forbidden")
        problem(runner.delete("/v1/environments/probe"), 403, "forbidden")


def test_tenants_cannot_see_each_other(keyed: AppServer, keys: Keys) -> None:
    with as_(keyed, keys.admin_a) as a, as_(keyed, keys.admin_b) as b:
        assert a.post("/v1/environments", json={"env_id": "wallet-a", "class_name": "Wallet",
                                                "code": WALLET}).status_code == 201
        scenario = a.post("/v1/scenarios", json={"env_id": "wallet-a", "task": "Deposit 3.", "checklist": [
            {"item": "3", "check": "def check_func(s):\n    return s['balance'] == 3"}]}).json()
        sid = a.post("/v1/sessions", json={"scenario_id": scenario["scenario_id"]}).json()["session_id"]
        assert a.post(f"/v1/sessions/{sid}/calls", json={"name": "deposit", "arguments": {"amount": 3}}).json()["ok"]

        listed_b = {e["env_id"] for e in b.get("/v1/environments").json()["environments"]}
        assert "wallet-a" not in listed_b and {"probe", "library_circulation"} <= listed_b
        assert "wallet-a" in {e["env_id"] for e in a.get("/v1/environments").json()["environments"]}
        problem(b.get("/v1/environments/wallet-a"), 404, "not-found")
        problem(b.get(f"/v1/scenarios/{scenario['scenario_id']}"), 404, "not-found")
        problem(b.post("/v1/sessions", json={"env_id": "wallet-a"}), 404, "not-found")
        for method, path in [("GET", ""), ("GET", "/state"), ("GET", "/trajectory"), ("GET", "/tools"),
                             ("POST", "/score"), ("POST", "/fork"), ("DELETE", "")]:
            problem(b.request(method, f"/v1/sessions/{sid}{path}"), 404, "not-found")
        problem(b.post(f"/v1/sessions/{sid}/calls", json={"name": "deposit", "arguments": {"amount": 1}}), 404,
                "not-found")
        # tenant B may use the same id for its own, different environment
        assert b.post("/v1/environments", json={"env_id": "wallet-a", "class_name": "Wallet",
                                                "code": WALLET + "\n# b\n"}).status_code == 201
        assert a.get(f"/v1/sessions/{sid}/state").json()["state"]["balance"] == 3
        assert a.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0


def test_deleting_what_a_tenant_added(keyed: AppServer, keys: Keys) -> None:
    with as_(keyed, keys.admin_b) as b:
        assert b.post("/v1/environments", json={"env_id": "wallet-del", "class_name": "Wallet",
                                                "code": WALLET}).status_code == 201
        sid = b.post("/v1/sessions", json={"env_id": "wallet-del"}).json()["session_id"]
        problem(b.delete("/v1/environments/probe"), 403, "forbidden")  # bundled catalogs are read-only
        assert b.delete("/v1/environments/wallet-del").status_code == 204
        problem(b.delete("/v1/environments/wallet-del"), 404, "not-found")
        problem(b.get("/v1/environments/wallet-del"), 404, "not-found")
        gone = problem(b.post(f"/v1/sessions/{sid}/calls", json={"name": "deposit", "arguments": {"amount": 1}}),
                       404, "not-found")
        assert "was deleted" in gone["detail"]


def test_a_tenant_beyond_its_environment_quota_gets_429(keyed: AppServer, keys: Keys) -> None:
    with as_(keyed, keys.admin_a) as a:
        a.post("/v1/environments", json={"env_id": "wallet-q1", "class_name": "Wallet", "code": WALLET + "#1\n"})
        response = a.post("/v1/environments", json={"env_id": "wallet-q2", "class_name": "Wallet",
                                                    "code": WALLET + "#2\n"})
        body = problem(response, 429, "quota-exceeded")
        assert body["quota"] == "max_environments" and body["value"] == 2
        assert int(response.headers["Retry-After"]) > 0


def test_serve_refuses_to_listen_beyond_loopback_without_keys(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 2
    assert "refusing to listen on 0.0.0.0 without API keys" in result.stderr


def test_keys_new_prints_a_key_its_line_grants() -> None:
    result = subprocess.run([sys.executable, "-m", "service.cli", "keys", "new", "--tenant", "lab", "--scope", "run"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    key = result.stdout.split("key (give it to the client; it is not stored anywhere): ")[1].split()[0]
    line = result.stdout.split("ENVFOUNDRY_API_KEYS): ")[1].strip()
    assert KeyRing.parse(line).authenticate(f"Bearer {key}", "run").tenant == "lab"
    assert key not in line
