"""An ASGI app served by uvicorn in a thread on a free port, for the test doubles (scripted endpoints, proxies)."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from tests.conftest import free_port


class Served:
    """``with Served(app) as served:`` serves ``app`` at ``served.url`` until the block ends."""

    def __init__(self, app: Any, name: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                ws="none", http="h11", loop="asyncio", timeout_graceful_shutdown=3)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=name, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"{self.thread.name} did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)
