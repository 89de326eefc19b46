"""The client package stands alone: importing all of it pulls in no server-side package."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import ROOT

FORBIDDEN = ["fastapi", "pydantic", "docker", "service", "sandbox", "synthesis", "starlette", "redis", "uvicorn"]


def test_importing_the_client_loads_no_server_package() -> None:
    code = (
        "import sys\n"
        "import envfoundry_client, envfoundry_client.gym, envfoundry_client.rollout, envfoundry_client.sft\n"
        "import envfoundry_client.cli, envfoundry_client.report\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    # Run from a folder without the repository on sys.path, so that `service` cannot come from cwd.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]", out.stderr


def test_the_distribution_depends_on_httpx_only() -> None:
    meta = tomllib.loads((ROOT / "clients" / "python" / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "envfoundry-client"
    assert [d.split(">")[0] for d in meta["dependencies"]] == ["httpx"]
    assert [d.split(">")[0] for d in meta["optional-dependencies"]["gym"]] == ["gymnasium"]
    assert [d.split(">")[0] for d in meta["optional-dependencies"]["verifiers"]] == ["verifiers"]
    assert Path(ROOT / "clients" / "python" / "src" / "envfoundry_client" / "py.typed").is_file()


def test_the_commands_run_from_the_client_package_alone(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}], "reward": 1.0}\n')
    out = subprocess.run([sys.executable, "-m", "envfoundry_client", "export", "sft", "in.jsonl", "--out", "o.jsonl"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == ["kept 0, dropped 1", "  dropped 1: not_ended_by_assistant"]
    assert (tmp_path / "o.jsonl").read_text() == ""
