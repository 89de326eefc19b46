"""One structured access log line per request, and the HTTP metrics.

Every request gets an id (a client's ``X-Request-ID`` when it is sane, else a
new one), returned in ``X-Request-ID`` and carried by every log line written
while the request runs. Logs hold no state, arguments or keys: only the route,
tenant, session, status and duration.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.observability import ACCESS, Metrics, access_handler, request_id

log = logging.getLogger(ACCESS)
SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
SERIES_KEPT = 1024


class RequestLog:
    """ASGI middleware: request id, the access log line, and the HTTP metrics."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        # The metrics' series by method, route and status: ``labels`` costs more than the counting.
        self._series: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        # Request ids: this process's random prefix and a count (no draw from the OS per request).
        self._prefix = secrets.token_hex(4)
        self._issued = itertools.count()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        offered = next((value for name, value in scope["headers"] if name == b"x-request-id"), b"").decode("latin-1")
        rid = offered if SANE_ID.match(offered) else f"{self._prefix}{next(self._issued) & 0xFFFFFFFF:08x}"
        token = request_id.set(rid)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope["method"]
            counted, timed = self._of(method, route, status)
            counted.inc()
            timed.observe(elapsed)
            if log.isEnabledFor(logging.INFO):
                state = scope.get("state") or {}
                fields = {"route": route, "method": method, "status": status, "duration_ms": round(elapsed * 1000, 3),
                          "tenant": state.get("tenant"), "session": (scope.get("path_params") or {}).get("session_id")}
                handler = access_handler(log)
                if handler is not None:
                    handler.access(f"{method} {route} {status}", fields)
                else:
                    # The record made as ``log.info`` would, less the walk up the stack for the caller
                    # (the access line names its route, not a source line).
                    log.handle(log.makeRecord(log.name, logging.INFO, "", 0, "%s %s %d", (method, route, status),
                                              None, extra=fields))
            request_id.reset(token)

    def _of(self, method: str, route: str, status: int) -> tuple[Any, Any]:
        key = (method, route, status)
        series = self._series.get(key)
        if series is None:
            series = (self.metrics.requests.labels(method, route, str(status)),
                      self.metrics.latency.labels(method, route))
            if len(self._series) < SERIES_KEPT:  # (routes are templates; methods and statuses are few)
                self._series[key] = series
        return series
