"""Fixtures: a scripted chat endpoint (agent and simulated user) and a real envfoundry server using it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from envfoundry_client import Client

from tests.conftest import Server, start_server
from tests.scripted_openai import Running
from tests.scripted_openai.tracks import USER_MODEL, ScriptedChat


@pytest.fixture(scope="module")
def chat() -> Iterator[Running]:
    with Running(ScriptedChat()) as running:
        yield running


@pytest.fixture(scope="module")
def ef_server(chat: Running, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real uvicorn envfoundry server (memory store) whose simulated user is the scripted endpoint."""
    server = start_server(tmp_path_factory.mktemp("ef"), extra_env={
        "ENVFOUNDRY_USER_LLM_BASE_URL": chat.url, "ENVFOUNDRY_USER_LLM_MODEL": USER_MODEL,
        "ENVFOUNDRY_USER_LLM_API_KEY": "user-llm-key"})
    yield server
    server.stop()


@pytest.fixture
def ef(ef_server: Server) -> Iterator[Client]:
    with Client(ef_server.url, timeout=60) as client:
        yield client
