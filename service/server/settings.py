"""All configuration, read once from the environment (prefix ``ENVFOUNDRY_``) and CLI flags."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AliasChoices, Field, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sandbox.backends.process import UID_SPAN
from sandbox.wire import limits
from sandbox.wire.limits import Limits
from service.api.sockets import SocketLimits
from service.catalog import analysis
from service.catalog.model import CatalogError
from service.catalog.packages.layers import BUILD_UID
from service.catalog.requirements import AllowList, Packages
from service.engine.sessions import SessionLimits
from service.server.connections import ConnectionBounds
from service.stores.store import SESSION_TTL


class _Settings(BaseSettings):
    """The settings but the sandbox limits, which ``Settings`` adds from ``sandbox.wire.limits``."""

    model_config = SettingsConfigDict(env_prefix="ENVFOUNDRY_", extra="ignore")

    catalogs: list[Path] = Field(default_factory=list, description="Catalog folders; empty means the bundled one.")
    redis_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("ENVFOUNDRY_REDIS_URL", "REDIS_URL", "redis_url"),
        description="Redis URL for sessions; unset means the in-process memory store.",
    )
    redis_cluster_nodes: str | None = Field(
        default=None,
        description="Redis Cluster entry nodes 'host:port,host:port'; credentials and TLS still come from "
        "redis_url (rediss://user:pass@...). A redis+cluster:// or rediss+cluster:// URL alone also selects cluster mode.",
    )
    key_prefix: str = Field(default="ef", description="Namespace for every Redis key.")
    log_format: Literal["json", "text"] = Field(default="json", description="One JSON object per log line, or text.")
    host: str = "127.0.0.1"
    port: int = 8000
    sandbox: Literal["process", "docker"] = Field(default="process", description="Sandbox backend.")
    sandbox_image: str = Field(default="envfoundry/sandbox:dev", description="Image of docker sandbox workers.")
    service_name: str | None = Field(
        default=None, description="Stable name of this service for container labels; default host-port."
    )
    worker_cpus: float = Field(default=1.0, gt=0, description="CPUs per docker sandbox worker.")
    workers: int = Field(default=4, ge=1, le=256, description="Sandbox worker processes.")
    worker_uid_base: int = Field(default=61000, description="Workers run as uid base+slot when the service is root.")
    worker_max_requests: int = Field(default=5000, ge=1, description="Requests before a worker is recycled.")
    session_ttl: float = Field(default=SESSION_TTL, gt=0, description="Seconds an idle session lives.")
    max_body_bytes: int = Field(default=8 << 20, description="Largest accepted request body (parsing it must not "
                                "hold the event loop for long).")
    max_body_values: int = Field(default=200_000, ge=1000, description="Most JSON values one request body may hold "
                                 "(counted before parsing).")
    max_header_bytes: int = Field(default=64 * 1024, ge=4096, description="Largest request line and headers "
                                  "(431 past it; the connection is closed).")
    header_timeout: float = Field(default=10.0, gt=0, description="Seconds a connection may take to send a "
                                  "request's head, from when it opened or the previous answer ended.")
    body_timeout: float = Field(default=60.0, gt=0, description="Seconds a request's body may take to arrive "
                                "after its head.")
    keep_alive_timeout: int = Field(default=5, ge=1, description="Seconds an idle kept-alive connection "
                                      "stays open.")
    max_connections: int = Field(default=1024, ge=1, description="Open connections; past it a new one closes the "
                                 "one that has waited longest for a request (requests being answered are kept).")
    max_websockets: int | None = Field(default=None, ge=1, description="Open OpenEnv WebSockets; unset: half "
                                       "of max_connections (keep it below, so HTTP always has room). Past it an "
                                       "upgrade is refused 503, unless a tenant holding more has an idle one, "
                                       "which is closed (1013) for it.")
    max_websockets_per_tenant: int = Field(default=128, ge=1, description="Open OpenEnv WebSockets of one tenant "
                                           "(without API keys: of one client address); past it an upgrade is "
                                           "refused 429.")
    websocket_idle: float = Field(default=300.0, gt=0, description="Seconds a WebSocket may wait for a message "
                                  "before the server closes it (1001).")
    openenv_grace: float = Field(default=60.0, ge=0, description="Seconds after an OpenEnv WebSocket drops "
                                 "without a close before the episode it opened is ended, unless a client "
                                 "takes it up again (reset with its episode_id) or it takes a step.")
    websocket_close_timeout: float = Field(default=5.0, gt=0, description="Seconds the server waits for a peer "
                                           "to answer its close frame before it drops the connection.")
    lock_wait: float = Field(default=60.0, gt=0, description="How long a call waits for the session's previous call.")
    sandbox_wait: float = Field(default=60.0, gt=0, description="How long a request waits for a free sandbox worker.")
    api_keys: str | None = Field(
        default=None, description="API key lines 'sha256:<hex> <tenant> <scopes>' separated by newlines or ';'."
    )
    api_keys_file: Path | None = Field(default=None, description="A file of API key lines (see service/api/auth.py).")
    max_environments: int = Field(default=100, ge=0, description="Environments one tenant may add.")
    max_scenarios: int = Field(default=10_000, ge=0, description="Scenarios one tenant may add.")
    max_steps: int = Field(default=SessionLimits.max_steps, ge=1, description="Steps one session may take.")
    max_sessions: int = Field(default=SessionLimits.max_sessions, ge=1, description="Live sessions (forks included) one tenant may hold.")
    max_record_bytes: int = Field(default=SessionLimits.max_record_bytes, ge=1024, description="Size of one trajectory record; "
                                  "a larger state diff is summarised.")
    score_budget: float = Field(default=SessionLimits.score_budget, gt=0, description="Seconds all checks of one score request may take.")
    rewind_budget: float = Field(default=SessionLimits.rewind_budget, gt=0, description="Seconds replaying a session's steps may take, to "
                                 "show or fork the state after a past step.")
    replay_seconds: float = Field(default=SessionLimits.replay_seconds, gt=0, description="Seconds of replay (running a session's steps "
                                  "again to rebuild a past state) one tenant may use per minute in each replica; "
                                  "past it, 429 until paid back.")
    max_tenant_replays: int = Field(default=SessionLimits.max_tenant_replays, ge=1, description="Replays one tenant may run at once in each "
                                    "replica (429 beyond).")
    replay_cache_entries: int = Field(default=SessionLimits.replay_cache_entries, ge=0, description="Past states rebuilt by replay that each "
                                      "replica keeps, so asking again costs no replay.")
    replay_cache_bytes: int = Field(default=SessionLimits.replay_cache_bytes, ge=0, description="Size of the past states rebuilt by "
                                    "replay that each replica keeps, in characters of their encoded text.")
    tenant_sandbox_share: float = Field(default=SessionLimits.tenant_sandbox_share, gt=0, le=1, description="Share of the sandbox workers one "
                                        "tenant may hold at once.")
    max_tenant_bytes: int = Field(default=SessionLimits.max_tenant_bytes, ge=1 << 20, description="Bytes one tenant may store: its "
                                  "sessions' states, initial states and step records, and its added environments "
                                  "and scenarios. A write past it is refused whole (429 quota-exceeded).")
    sandbox_reserve: int = Field(default=SessionLimits.sandbox_reserve, ge=0, description="With API keys: sandbox workers kept for tenants "
                                 "that hold none, so one tenant holding the others cannot make another's first "
                                 "request wait for its calls to end (always fewer than the workers).")
    analysis_wait: float = Field(default=analysis.WAIT, gt=0, description="How long an environment submission "
                                 "waits for a code-analysis slot (slots go to the tenant holding fewest first).")
    analysis_timeout: float = Field(default=analysis.TIMEOUT, gt=0, description="Seconds one analysis of submitted "
                                    "code may take before its child process is killed.")
    analysis_memory_mb: int = Field(default=analysis.MEMORY_MB, ge=64, description="Address space of the child "
                                    "process that analyses submitted code.")
    analysis_concurrent: int = Field(default=analysis.CONCURRENT, ge=1, description="Analyses of submitted code "
                                     "running at once.")
    analysis_max_tools: int = Field(default=analysis.MAX_TOOLS, ge=1, description="Most public methods (tools) "
                                    "an environment may have.")
    analysis_max_tools_bytes: int = Field(default=analysis.MAX_TOOLS_BYTES, ge=1024, description="Largest size "
                                          "of an environment's tool schemas, as JSON.")
    max_group: int = Field(default=64, ge=1, le=1024, description="Most sessions one create or fork request makes.")
    allowed_requirements: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Packages environments may declare as requirements: PEP 508 names, "
        "optionally with versions ('mpmath==1.3.0', 'pydantic>=2.7,<3'), as a JSON list or one per line. "
        "An environment's requirement is installed within both its own and this version range. Empty: "
        "environments use the standard library only.")
    build_uid: int = Field(default=BUILD_UID, gt=0, description="The uid and gid pip runs as to install "
                           "allowed requirements when the service is root: none a sandbox worker runs as (not "
                           "65534, not worker_uid_base and the 4095 uids above it).")
    wheelhouse: Path | None = Field(default=None, description="A folder of wheels to install allowed "
                                    "requirements from, with no package index (pip --no-index --find-links); "
                                    "unset: pip's configured index.")
    layers_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "envfoundry" / "layers",
                             description="Where installed requirement sets (layers) are kept, one read-only "
                             "folder per set, reused across restarts; sandbox workers read it (docker: "
                             "mounted read-only at the same path).")
    user_llm_base_url: str | None = Field(
        default=None, description="OpenAI-compatible endpoint of the simulated user (conversation mode)."
    )
    user_llm_model: str = Field(default="gpt-4.1-mini", description="Model of the simulated user.")
    user_llm_api_key: str | None = Field(default=None, description="API key of the simulated user's endpoint.")
    user_llm_timeout: float = Field(default=60.0, gt=0, description="Seconds one simulated-user reply may take.")
    user_llm_temperature: float = Field(default=0.0, ge=0, le=2, description="Sampling temperature of the simulated user.")

    @field_validator("allowed_requirements", mode="before")
    @classmethod
    def _requirement_lines(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [line.strip() for line in text.splitlines()
                                                                   if line.strip()]
        return value

    @field_validator("allowed_requirements")
    @classmethod
    def _requirements_parse(cls, value: list[str]) -> list[str]:
        try:
            AllowList(value)
        except CatalogError as exc:
            raise ValueError(exc.message) from None
        return value

    @model_validator(mode="after")
    def _build_uid_is_no_worker_uid(self) -> _Settings:
        if self.build_uid == 65534 or self.worker_uid_base <= self.build_uid < self.worker_uid_base + UID_SPAN:
            raise ValueError(f"build_uid {self.build_uid} is a sandbox worker's uid (65534, or {self.worker_uid_base}"
                             f"..{self.worker_uid_base + UID_SPAN - 1})")
        return self

    def packages(self) -> Packages:
        """The allow-list and, when it allows anything, the layers built from it.

        Raises:
            CatalogError: an allow-list entry is not a requirement (naming the setting).
        """
        allowed = AllowList(self.allowed_requirements)
        if not allowed:
            return Packages(allowed, None)
        from service.catalog.packages.layers import Layers

        return Packages(allowed, Layers(self.layers_dir, wheelhouse=self.wheelhouse, build_uid=self.build_uid))

    def instance_name(self) -> str:
        return self.service_name or f"envfoundry-{socket.gethostname()}-{self.port}"

    def session_limits(self) -> SessionLimits:
        return SessionLimits(max_steps=self.max_steps, max_sessions=self.max_sessions, max_record_bytes=self.max_record_bytes,
                             score_budget=self.score_budget, rewind_budget=self.rewind_budget,
                             replay_seconds=self.replay_seconds, max_tenant_replays=self.max_tenant_replays,
                             replay_cache_entries=self.replay_cache_entries,
                             replay_cache_bytes=self.replay_cache_bytes,
                             tenant_sandbox_share=self.tenant_sandbox_share,
                             max_tenant_bytes=self.max_tenant_bytes, sandbox_reserve=self.sandbox_reserve)

    def connection_bounds(self) -> ConnectionBounds:
        return ConnectionBounds(max_header_bytes=self.max_header_bytes, header_timeout=self.header_timeout,
                                body_timeout=self.body_timeout, max_connections=self.max_connections)

    def socket_limits(self) -> SocketLimits:
        return SocketLimits(max_open=self.max_websockets or max(1, self.max_connections // 2),
                            per_tenant=self.max_websockets_per_tenant, idle=self.websocket_idle)

    def limits(self) -> Limits:
        """The sandbox limits: those that are settings as set, the others derived from settings."""
        given = {name: getattr(self, setting) for name, setting, *_ in limits.settings()}
        if given["rebuild_every_call"]:
            given["residents"] = 0  # (the worker keeps no instance between calls: none is asked of it)
        return Limits(
            **given,
            diff_bytes=self.max_record_bytes,
            # a live session never outlives its stored session's expiry
            resident_idle=min(limits.DEFAULTS.resident_idle, self.session_ttl),
            # (no layers to read unless something may be installed)
            layers_root=str(self.layers_dir.resolve()) if self.allowed_requirements else "",
        )


def _with_limits(base: type[_Settings]) -> type[_Settings]:
    """``base`` with a field for every sandbox limit that is a setting (``ENVFOUNDRY_<SETTING>``)."""
    fields: dict[str, Any] = {
        setting: (type(default), Field(default=default, description=help, **bounds))  # type: ignore[call-overload]
        for _, setting, default, help, bounds in limits.settings()}
    return create_model("Settings", __base__=base, __module__=__name__, **fields)


if TYPE_CHECKING:
    Settings = _Settings
else:
    Settings = _with_limits(_Settings)
