"""Metrics in Prometheus format and structured (JSON) log lines.

Every log line written while a request runs carries its id (``request_id``, set by
``service.server.requestlog``). Logs hold no state, arguments or keys.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ACCESS = "envfoundry.access"  # the access log's logger: a line per request
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
_encode = json.JSONEncoder(ensure_ascii=False).encode  # (``json.dumps`` makes an encoder per line)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The service's metrics, in a registry of its own (one per app, so tests can run several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("envfoundry_http_requests", "HTTP requests by route and status.",
                                ["method", "route", "status"], registry=r)
        self.latency = Histogram("envfoundry_http_request_duration_seconds", "HTTP request latency by route.",
                                 ["method", "route"], buckets=LATENCY_BUCKETS, registry=r)
        self.tool_calls = Counter("envfoundry_tool_calls", "Tool calls by outcome ('ok' or the error type).",
                                  ["outcome"], registry=r)
        self._tool_calls: dict[str, Any] = {}
        self.sandbox_wait = Histogram("envfoundry_sandbox_wait_seconds", "Time a request waited for its share "
                                      "of sandbox workers.", buckets=LATENCY_BUCKETS, registry=r)
        self.sessions = Counter("envfoundry_sessions_created", "Sessions created (groups and forks count each).",
                                ["kind"], registry=r)
        self.sessions_deleted = Counter("envfoundry_sessions_deleted", "Sessions deleted.", registry=r)
        self.replays = Counter("envfoundry_replays", "Past states asked for that steps had to be run again to "
                               "rebuild, by outcome: 'replayed', 'cached' (rebuilt before), 'refused' (over the "
                               "tenant's replay budget), 'failed'.", ["outcome"], registry=r)
        self.replay_seconds = Counter("envfoundry_replay_seconds", "Seconds replays took, charged to their "
                                      "tenants.", registry=r)
        self.store_latency = Histogram("envfoundry_store_duration_seconds", "Session store operations.",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.store_errors = Counter("envfoundry_store_errors", "Session store operations that failed.", registry=r)
        self.workers = Gauge("envfoundry_sandbox_workers", "Sandbox workers by state.", ["state"], registry=r)
        self.session_calls = Gauge("envfoundry_sandbox_session_calls", "Session calls by where the instance was: "
                                   "'live' in a worker, or 'rebuilt' from the stored state ('lodged': "
                                   "of either, served by a process holding many sessions).", ["instance"],
                                   registry=r)
        self.sandbox_bounds = Gauge("envfoundry_sandbox_tenant_bounds", "Workers one tenant may hold ('cap') and "
                                    "workers kept for tenants holding none ('reserve').", ["bound"], registry=r)
        self.sandbox_reserved = Gauge("envfoundry_sandbox_reserved_grants", "Workers given from the reserve to a "
                                      "tenant that held none, since start.", registry=r)
        self.analysis_wait = Histogram("envfoundry_analysis_wait_seconds", "Time an environment submission waited "
                                       "for a code-analysis slot.", buckets=LATENCY_BUCKETS, registry=r)
        self.worker_replacements = Gauge("envfoundry_sandbox_worker_replacements",
                                         "Sandbox workers replaced (lost, hung, recycled) since start.", registry=r)
        # Per worker slot, as each worker last reported (at most a second old while it serves requests).
        self.live_sessions = Gauge("envfoundry_sandbox_live_sessions", "Sessions a sandbox worker holds live.",
                                   ["worker"], registry=r)
        self.live_session_bytes = Gauge("envfoundry_sandbox_live_session_bytes", "Memory of a worker's live "
                                        "sessions' processes (resident, not file-backed).", ["worker"], registry=r)
        self.worker_memory = Gauge("envfoundry_sandbox_worker_memory_bytes", "Memory a sandbox worker's cgroup "
                                   "holds, page cache aside.", ["worker"], registry=r)
        self.worker_memory_limit = Gauge("envfoundry_sandbox_worker_memory_limit_bytes", "Size of a sandbox "
                                         "worker's memory cgroup or container.", ["worker"], registry=r)
        self.websockets = Gauge("envfoundry_websockets_open", "OpenEnv WebSockets open (each holds a connection).",
                                registry=r)
        self.evictions = Gauge("envfoundry_sandbox_live_session_evictions", "Live sessions a worker slot ended to "
                               "keep room for a call, since start (they go cold, not lost).", ["worker"], registry=r)

    def tool_call(self, outcome: str) -> None:
        """Count a tool call by its outcome (the series kept: there are a handful of outcomes)."""
        series = self._tool_calls.get(outcome)
        if series is None:
            series = self._tool_calls[outcome] = self.tool_calls.labels(outcome)
        series.inc()

    def observe_pool(self, pool: Any) -> None:
        """Refresh the pool gauges (read at scrape time: the pool keeps its own counts)."""
        idle = pool.idle
        starting = pool.starting
        self.workers.labels("idle").set(idle)
        self.workers.labels("starting").set(starting)
        self.workers.labels("busy").set(max(0, pool.size - idle - starting))
        self.worker_replacements.set(pool.replaced)
        self.session_calls.labels("live").set(pool.live_calls)
        self.session_calls.labels("rebuilt").set(pool.rebuilt_calls)
        self.session_calls.labels("lodged").set(pool.lodged_calls)
        for slot, memory in dict(getattr(pool, "memory", {})).items():
            worker = str(slot)
            self.live_sessions.labels(worker).set(memory.live)
            self.live_session_bytes.labels(worker).set(memory.live_bytes)
            self.evictions.labels(worker).set(memory.evicted)
            if memory.used is not None:
                self.worker_memory.labels(worker).set(memory.used)
            if memory.limit is not None:
                self.worker_memory_limit.labels(worker).set(memory.limit)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: level, time, logger, message, the request id, and any ``extra`` fields."""

    FIELDS = ("route", "method", "status", "duration_ms", "tenant", "session")

    def __init__(self) -> None:
        super().__init__()
        self._second = (-1, "")  # the last whole second written, and its text

    def _time(self, created: float) -> str:
        """As ``datetime.isoformat(timespec="milliseconds")`` in UTC, the second's text made once."""
        second = int(created)
        if self._second[0] != second:
            self._second = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
        return f"{self._second[1]}.{int((created - second) * 1000):03d}+00:00"

    def format(self, record: logging.LogRecord) -> str:
        entry = self._entry(record.created, record.levelname, record.name, record.getMessage())
        for name in self.FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)

    def access_line(self, created: float, message: str, fields: dict[str, Any]) -> str:
        """What ``format`` makes of an access record (INFO, ``ACCESS``) with ``fields`` as its extras."""
        entry = self._entry(created, "INFO", ACCESS, message)
        for name, value in fields.items():
            if value is not None:
                entry[name] = value
        return _encode(entry)

    def _entry(self, created: float, level: str, logger: str, message: str) -> dict[str, Any]:
        entry = {"time": self._time(created), "level": level.lower(), "logger": logger, "message": message}
        if rid := request_id.get():
            entry["request_id"] = rid
        return entry


class LineBatches(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes the access log's lines (INFO, a line per request) logged on an event
    loop together, ``DELAY`` seconds after the first of them, or once ``BATCH`` are waiting: one write
    per request cost a tenth of a tool call's CPU. Any other line is written at once, after those
    waiting; ``flush`` (at exit, and when the app shuts down) writes them all."""

    DELAY = 0.05
    BATCH = 64

    def __init__(self) -> None:
        super().__init__()
        self._waiting: list[str] = []
        self._due: asyncio.AbstractEventLoop | None = None  # the loop a write is due on

    def emit(self, record: logging.LogRecord) -> None:  # (called holding the handler's lock)
        try:
            self._waiting.append(self.format(record) + self.terminator)
        except Exception:
            self.handleError(record)
            return
        if record.name != ACCESS or record.levelno != logging.INFO or len(self._waiting) >= self.BATCH \
                or not self._deferred():
            self._write()

    def access(self, message: str, fields: dict[str, Any]) -> None:
        """An access line, as ``emit`` of its record would write it (see ``access_handler``)."""
        formatter = self.formatter
        assert isinstance(formatter, JsonFormatter)
        with self.lock:  # type: ignore[union-attr]
            self._waiting.append(formatter.access_line(time.time(), message, fields) + self.terminator)
            if len(self._waiting) >= self.BATCH or not self._deferred():
                self._write()

    def _deferred(self) -> bool:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        if self._due is not loop:  # (none due, or due on a loop that has ended since)
            self._due = loop
            loop.call_later(self.DELAY, self._on_due, loop)
        return True

    def _on_due(self, loop: asyncio.AbstractEventLoop) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self._due is loop:
                self._due = None
            self._write()

    def _write(self) -> None:
        if not self._waiting:
            return
        text, self._waiting = "".join(self._waiting), []
        try:
            self.stream.write(text)
            self.stream.flush()
        except Exception:
            pass  # (as a StreamHandler whose stream failed: logging must not fail the request)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write()


def access_handler(access: logging.Logger) -> LineBatches | None:
    """The handler a line of the ``access`` logger would reach, when it is the only one and nothing but the service's
    own JSON lines stands between (the logging ``configure_logging`` sets up, unchanged): the
    access log then hands it the line's fields without making a record, which costs a tenth of a
    tool call's CPU on the event loop. None: the line goes the usual way, through ``logging``."""
    if access.filters or access.disabled:
        return None
    logger: logging.Logger | None = access
    while logger is not None and logger is not logging.root:
        if logger.handlers or not logger.propagate:
            return None
        logger = logger.parent
    handlers = logging.root.handlers
    if len(handlers) != 1:
        return None
    handler = handlers[0]
    if type(handler) is not LineBatches or handler.filters or handler.level > logging.INFO \
            or type(handler.formatter) is not JsonFormatter:
        return None
    return handler


def flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()


def configure_logging(fmt: str, level: int = logging.INFO) -> dict[str, Any]:
    """Set up the root logger; return a uvicorn ``log_config`` that writes through it."""
    handler = LineBatches()
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    return {"version": 1, "disable_existing_loggers": False,
            "loggers": {name: {"handlers": [], "propagate": True} for name in ("uvicorn", "uvicorn.error")}}
