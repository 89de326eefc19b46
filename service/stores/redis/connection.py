"""The store's way to Redis: one client (a single node or a cluster), the call path's pipeline beside it,
the Lua scripts, and the one place where Redis errors become the store's own."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Coroutine
from functools import wraps
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.stores.redis.pipeline import Pipeline
from service.stores.store import StoreError

# While Redis is unreachable, requests fail at once and the store tries it again after a delay that
# doubles from the first to the longest; the delay left is the Retry-After clients are told.
RECONNECT_FIRST = 0.5
RECONNECT_LONGEST = 4.0
# How long one command may wait for Redis's answer before the store calls it unreachable.
COMMAND_TIMEOUT = 10.0

# The Lua scripts, shipped in the package beside this module.
LUA = Path(__file__).with_name("lua")

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

P = ParamSpec("P")
T = TypeVar("T")


class StoreUnavailable(StoreError):
    """Redis cannot be reached; the store tries it again in ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Reconnect:
    """When to try an unreachable Redis again, so an outage costs each request nothing but a refusal.

    Without it every request would spend its own connect attempt on a Redis that is down, and the
    Retry-After it answers with would be a guess.
    """

    def __init__(self, first: float = RECONNECT_FIRST, longest: float = RECONNECT_LONGEST) -> None:
        self.first = first
        self.longest = longest
        self.delay = first
        self.retry_at = 0.0

    def check(self) -> None:
        """Raise StoreUnavailable while the next attempt is not due yet."""
        wait = self.retry_at - time.monotonic()
        if wait > 0:
            raise StoreUnavailable(f"redis is unreachable; trying again in {math.ceil(wait)} s", wait)

    def failed(self, exc: RedisError) -> StoreUnavailable:
        wait = self.delay
        self.retry_at = time.monotonic() + wait
        self.delay = min(self.delay * 2, self.longest)
        return StoreUnavailable(f"redis is unreachable ({exc}); trying again in {math.ceil(wait)} s", wait)

    def succeeded(self) -> None:
        self.delay = self.first
        self.retry_at = 0.0


def cluster_nodes(text: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` as pairs; a bad entry is named in the error."""
    nodes = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"redis cluster node {entry!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ValueError("redis cluster nodes: none given")
    return nodes


def connect(url: str | None, nodes: str | None) -> aioredis.Redis | RedisCluster:
    """A plain client, or a cluster client when the URL scheme ends in ``+cluster`` or entry nodes are given.

    In cluster mode the URL still carries the credentials and TLS (``rediss+cluster://user:pass@host:port``);
    a database number other than 0 is refused, because a Redis Cluster has only database 0."""
    common: dict[str, Any] = {"decode_responses": True, "socket_connect_timeout": 5}
    scheme = urlsplit(url).scheme if url else ""
    if not nodes and scheme not in CLUSTER_SCHEMES:
        assert url is not None
        return aioredis.Redis.from_url(url, health_check_interval=30, socket_timeout=COMMAND_TIMEOUT, **common)
    parts = urlsplit(url) if url else None
    if parts is not None and parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"redis cluster: database {parts.path.strip('/')} requested, a cluster has only database 0")
    entry = cluster_nodes(nodes) if nodes else [(parts.hostname or "127.0.0.1", parts.port or 6379)] if parts else []
    if parts is not None:
        if parts.username:
            common["username"] = unquote(parts.username)
        if parts.password:
            common["password"] = unquote(parts.password)
        if scheme in ("rediss", "rediss+cluster"):
            common["ssl"] = True
    # Retries ride over a failover (about 10 s of backoff): the client refreshes the slot map when a master
    # stops answering and a replica takes its slots.
    return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in entry],
                        retry=Retry(ExponentialWithJitterBackoff(base=0.1, cap=2.0), 10), **common)


def lua(*names: str) -> str:
    """The text of scripts ``lua/<name>.lua``, one after another (a script begins with the helper
    functions it calls)."""
    return "".join((LUA / f"{name}.lua").read_text(encoding="utf-8") for name in names)


class Connection:
    def __init__(self, url: str | None, nodes: str | None = None) -> None:
        self.client: Any = connect(url, nodes)
        # A cluster keeps each session on one slot (its hash tag), but a group or a tenant's count lives
        # on other slots: those updates are made one slot at a time (see ``Sessions.create_group`` and
        # ``Sessions.commit``).
        self.cluster = isinstance(self.client, RedisCluster)
        self.reconnect = Reconnect()
        # The call path's two scripts take a pipelined connection of their own (a cluster routes by slot: not there).
        self.pipeline = Pipeline(url, COMMAND_TIMEOUT) if url and not self.cluster else None

    def script(self, *names: str) -> AsyncScript:
        """Scripts ``names`` (see ``lua``) as one, registered with the client."""
        script: AsyncScript = self.client.register_script(lua(*names))
        return script

    async def run(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """Run one of the call path's scripts, on the pipeline where there is one."""
        if self.pipeline is not None:
            return await self.pipeline.evalsha(script.sha, str(script.script), keys, args)  # (registered as text)
        return await script(keys=keys, args=args)

    async def translate(self, exc: RedisError) -> StoreError:
        """Our error for a Redis error; an unreachable Redis also drops the pool's idle connections,
        which point at a server that is gone, so the first request after it returns works."""
        if not isinstance(exc, RedisConnectionError | RedisTimeoutError):
            return StoreError(f"redis: {exc}")
        if self.pipeline is not None:
            self.pipeline.reset(exc)
        pool = getattr(self.client, "connection_pool", None)  # a cluster client manages its own nodes
        if pool is not None:
            try:
                await pool.disconnect(inuse_connections=False)
            except (RedisError, OSError):
                pass
        return self.reconnect.failed(exc)

    async def close(self) -> None:
        if self.pipeline is not None:
            await self.pipeline.close()
        await self.client.aclose()


class Connected(Protocol):
    """What reaches Redis through a ``Connection`` (the store and its parts)."""

    @property
    def redis(self) -> Connection: ...


C = TypeVar("C", bound=Connected)


def translated(fn: Callable[Concatenate[C, P], Coroutine[Any, Any, T]],
               ) -> Callable[Concatenate[C, P], Coroutine[Any, Any, T]]:
    """Redis errors become StoreError here, once, so the service sees only its own errors (the
    method's object reaches Redis through its ``redis``)."""

    @wraps(fn)
    async def wrapper(owner: C, /, *args: P.args, **kwargs: P.kwargs) -> T:
        redis = owner.redis
        redis.reconnect.check()
        try:
            result = await fn(owner, *args, **kwargs)
        except RedisError as exc:
            raise await redis.translate(exc) from exc
        redis.reconnect.succeeded()
        return result

    return wrapper
