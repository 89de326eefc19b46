"""A real HTTP proxy in front of an envfoundry server that answers some requests itself with an
error (429 or 503 with ``Retry-After: 0``) before forwarding the rest, and logs every request."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.served import Served


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


class Running(Served):
    def __init__(self, proxy: FlakyProxy) -> None:
        super().__init__(proxy.app, "flaky-proxy")
        self.proxy = proxy
        proxy.url = self.url

    def __enter__(self) -> Running:
        super().__enter__()
        return self
