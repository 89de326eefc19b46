"""A real HTTP proxy in front of an envfoundry server that answers some requests itself with an
error (429 or 503 with ``Retry-After: 0``) before forwarding the rest, and logs every request."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.conftest import free_port


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FlakyProxy:
    upstream: str
    faults: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (method, path suffix) -> statuses
    seen: list[Seen] = field(default_factory=list)
    url: str = ""  # where the proxy listens, once running

    def __post_init__(self) -> None:
        self.app = Starlette(routes=[Route("/{path:path}", self.forward,
                                           methods=["GET", "POST", "DELETE"])])
        self._lock = threading.Lock()

    def count(self, method: str, suffix: str) -> int:
        with self._lock:
            return sum(1 for s in self.seen if s.method == method and s.path.endswith(suffix))

    async def forward(self, request: Request) -> Response:
        path = request.url.path
        with self._lock:
            self.seen.append(Seen(request.method, path, {k.lower(): v for k, v in request.headers.items()}))
            fault = None
            for (method, suffix), plan in self.faults.items():
                if method == request.method and path.endswith(suffix) and plan:
                    fault = plan.pop(0)
                    break
        if fault is not None:
            slug = "quota-exceeded" if fault == 429 else "unavailable"
            return JSONResponse({"type": f"urn:envfoundry:problem:{slug}", "title": slug, "status": fault,
                                 "detail": f"injected {fault}"}, fault, media_type="application/problem+json",
                                headers={"Retry-After": "0"})
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with httpx.AsyncClient(base_url=self.upstream, timeout=60) as http:
            answer = await http.request(request.method, path, params=request.query_params,
                                        content=await request.body(), headers=headers)
        return Response(answer.content, answer.status_code,
                        headers={k: v for k, v in answer.headers.items()
                                 if k.lower() in ("content-type", "retry-after", "idempotent-replayed")})


class Running:
    def __init__(self, proxy: FlakyProxy) -> None:
        self.proxy = proxy
        port = free_port()
        self.url = proxy.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(proxy.app, host="127.0.0.1", port=port, log_level="warning",
                                                    lifespan="off", ws="none", http="h11", loop="asyncio"))
        self.thread = threading.Thread(target=self.server.run, name="flaky-proxy", daemon=True)

    def __enter__(self) -> Running:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the proxy did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)
