"""The Redis session store: any API process sharing the Redis can serve any session."""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import wraps
from typing import Any, ParamSpec, TypeVar
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sandbox.state import deltas
from service.stores.keys import Keys
from service.stores.redis_lane import Lane
from service.stores.store import (
    BytesQuota,
    Held,
    LockTimeout,
    RecordLimit,
    SessionMeta,
    Snapshot,
    StoreError,
    stored_bytes,
)

# While Redis is unreachable, requests fail at once and the store tries it again after a delay that
# doubles from the first to the longest; the delay left is the Retry-After clients are told.
RECONNECT_FIRST = 0.5
RECONNECT_LONGEST = 4.0
# How long one command may wait for Redis's answer before the store calls it unreachable.
COMMAND_TIMEOUT = 10.0

P = ParamSpec("P")
T = TypeVar("T")

# The bases a session reads (see ``service.stores.store``) are named in its meta; whatever refreshes the
# session's keys refreshes them too, for twice the session TTL, so a base outlives every session
# that uses it. A cluster keeps bases on the tenant's slot, out of a session script's reach: there
# the store refreshes them in a command of their own (``touch`` is then '0').
BASE_FIELDS = ("state_base", "initial_base")
TOUCH_BASES = """
local function touch_bases(meta, ttl)
  for _, name in ipairs(redis.call('HMGET', meta, 'state_base', 'initial_base')) do
    if name then redis.call('PEXPIRE', name, ttl) end
  end
end
"""

# A session's idle TTL in ms: its own (``SessionMeta.idle_ttl``, in seconds) or the store's. Every
# script that refreshes a session's keys asks it, so no refresh can stretch a short-lived session.
SESSION_TTL = """
local function session_ttl(meta, default)
  local own = redis.call('HGET', meta, 'idle_ttl')
  if own and own ~= '' then return math.floor(tonumber(own) * 1000) end
  return tonumber(default)
end
"""

# Compare-and-set on the step: a stale caller can never apply a step twice.
# The idempotency key is written in the same script, so a step and the record of which request
# made it exist together or not at all.
COMMIT = TOUCH_BASES + SESSION_TTL + """
local mode = ARGV[2]  -- '0' the state stays, '1' a new state, '2' a delta, '3' a new base (ARGV[3] names it)
local result = 1
local grown = 0
local dgrown = 0
local nset = tonumber(ARGV[17])
local ttl = session_ttl(KEYS[1], ARGV[5])
local function state_size()
  if redis.call('EXISTS', KEYS[2]) == 1 then return redis.call('STRLEN', KEYS[2]) end
  return tonumber(redis.call('HGET', KEYS[1], 'base_bytes') or '0') + tonumber(redis.call('HGET', KEYS[1], 'delta_bytes') or '0')
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  result = -1
elseif tonumber(redis.call('HGET', KEYS[1], 'step')) ~= tonumber(ARGV[1]) then
  result = 0
elseif ARGV[16] == '1' and (redis.call('EXISTS', KEYS[6]) == 1
    or (ARGV[7] ~= '' and redis.call('HEXISTS', KEYS[5], ARGV[7]) == 1)) then
  result = -4  -- a commit made without the lock: another caller holds it, or the key was used
elseif mode == '2' and (redis.call('EXISTS', KEYS[2]) == 1 or not redis.call('HGET', KEYS[1], 'state_base')) then
  result = -3  -- a delta, but the state is the session's own text
else
  grown = #ARGV[4]
  if mode == '1' then
    grown = grown + #ARGV[3] - state_size()
  elseif mode == '3' then
    grown = grown + tonumber(ARGV[15]) - state_size()
  elseif mode == '2' then
    for i = 18, 17 + 2 * nset, 2 do
      local old = -#ARGV[i]
      if redis.call('HEXISTS', KEYS[7], ARGV[i]) == 1 then old = redis.call('HSTRLEN', KEYS[7], ARGV[i]) end
      dgrown = dgrown + #ARGV[i + 1] - old
    end
    for i = 18 + 2 * nset, #ARGV do
      if redis.call('HEXISTS', KEYS[7], ARGV[i]) == 1 then
        dgrown = dgrown - #ARGV[i] - redis.call('HSTRLEN', KEYS[7], ARGV[i])
      end
    end
    grown = grown + dgrown
  end
  if #KEYS == 10 and grown > 0 and tonumber(ARGV[12]) >= 0 then
    local used = tonumber(redis.call('HGET', KEYS[9], '#total') or '0') + tonumber(redis.call('GET', KEYS[10]) or '0')
    if used + grown > tonumber(ARGV[12]) then result = -2 end
  end
end
if result == 1 then
  if mode == '1' or mode == '3' then
    redis.call('DEL', KEYS[7])
    redis.call('HDEL', KEYS[1], 'delta_bytes')
  end
  if mode == '1' then
    redis.call('SET', KEYS[2], ARGV[3])
    redis.call('HDEL', KEYS[1], 'state_base')  -- the state is the session's own from now on
  elseif mode == '3' then
    redis.call('DEL', KEYS[2])
    redis.call('HSET', KEYS[1], 'state_base', ARGV[3], 'base_bytes', ARGV[15])
  elseif mode == '2' then
    for i = 18, 17 + 2 * nset, 2 do redis.call('HSET', KEYS[7], ARGV[i], ARGV[i + 1]) end
    for i = 18 + 2 * nset, #ARGV do redis.call('HDEL', KEYS[7], ARGV[i]) end
    redis.call('HINCRBY', KEYS[1], 'delta_bytes', dgrown)
  end
  redis.call('RPUSH', KEYS[4], ARGV[4])
  redis.call('HINCRBY', KEYS[1], 'step', 1)
  if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'done', '1') end
  if ARGV[7] ~= '' then redis.call('HSET', KEYS[5], ARGV[7], ARGV[8]) end
  for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], ttl) end
  redis.call('PEXPIRE', KEYS[7], ttl)
  if ARGV[14] == '1' then touch_bases(KEYS[1], ARGV[13]) end
  if #KEYS == 10 then
    redis.call('HINCRBY', KEYS[9], ARGV[10], grown)
    redis.call('HINCRBY', KEYS[9], '#total', grown)
  end
end
if ARGV[9] ~= '' and redis.call('GET', KEYS[6]) == ARGV[9] then redis.call('DEL', KEYS[6]) end
-- (ARGV[11] is when the store's TTL would end it; a session with its own ends sooner or later)
if #KEYS >= 8 then redis.call('ZADD', KEYS[8], 'XX', tonumber(ARGV[11]) - tonumber(ARGV[5]) + ttl, ARGV[10]) end
return {result, grown, ttl}
"""

# Copy a session server-side into fresh ids (a fork): nothing crosses to the API but the ids.
FORK = TOUCH_BASES + SESSION_TTL + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
touch_bases(KEYS[1], ARGV[4])
local from = {1, 2, 3, 4, 6}  -- the source's meta, state, initial, trajectory, delta: where each goes
for i = 1, #ARGV - 4 do
  local base = 5 + (i - 1) * 6
  for j = 1, 6 do redis.call('DEL', KEYS[base + j]) end
  for j = 1, 5 do
    if redis.call('EXISTS', KEYS[j]) == 1 then redis.call('COPY', KEYS[j], KEYS[base + from[j]]) end
  end
  redis.call('HSET', KEYS[base + 1], 'session_id', ARGV[4 + i], 'created_at', ARGV[2], 'parent_id', ARGV[3])
  local ttl = session_ttl(KEYS[base + 1], ARGV[1])  -- (the copy keeps its source's idle TTL)
  for j = 1, 6 do redis.call('PEXPIRE', KEYS[base + j], ttl) end
end
return 1
"""

# Take a session's call lock and read its meta in one step; false while another caller holds it.
# A session that does not exist leaves no lock behind.
BEGIN = TOUCH_BASES + SESSION_TTL + """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
local meta = redis.call('HGETALL', KEYS[2])
if #meta == 0 then
  redis.call('DEL', KEYS[1])
  return meta
end
local ttl = session_ttl(KEYS[2], ARGV[3])
for i = 2, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl) end
if ARGV[5] == '1' then touch_bases(KEYS[2], ARGV[4]) end
return meta
"""

# A session's meta, its keys' TTL refreshed (and its bases', where ``touch`` is '1').
REFRESH = TOUCH_BASES + SESSION_TTL + """
local meta = redis.call('HGETALL', KEYS[1])
if #meta == 0 then return meta end
local ttl = session_ttl(KEYS[1], ARGV[1])
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl) end
if ARGV[3] == '1' then touch_bases(KEYS[1], ARGV[2]) end
return meta
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# A tenant's session bytes: a session no longer counted gives its bytes back.
UNCOUNT = """
local function uncount(counts, sid)
  local held = redis.call('HGET', counts, sid)
  if held then
    redis.call('HDEL', counts, sid)
    redis.call('HINCRBY', counts, '#total', -tonumber(held))
    if redis.call('HLEN', counts) == 1 then
      redis.call('DEL', counts)  -- only the total is left, and it is 0: a tenant with no sessions holds no key
    end
  end
end
"""

# A tenant's live sessions are a sorted set of ids scored by when each was last known to expire; a
# read refreshes a session's keys but not that score. So an id whose score has passed is settled:
# the store looks up when its session really expires (ARGV from 5 on: n pairs of an id and that
# time in ms, 0 when it is gone), and an id whose session lives on is scored again; the others
# leave the set with their bytes. The tenant's keys do not expire by themselves (a TTL that reads
# do not refresh would drop sessions that are alive from the count): they go when they count
# nothing. ARGV: now, limit, the new ids' expiry, n, the n pairs, the new ids.
SETTLE = UNCOUNT + """
local function settle(live, counts, now, n)
  for i = 5, 4 + 2 * n, 2 do
    local until_ = tonumber(ARGV[i + 1])
    if until_ > now then
      redis.call('ZADD', live, 'XX', until_, ARGV[i])
    elseif redis.call('ZREM', live, ARGV[i]) == 1 then
      uncount(counts, ARGV[i])
    end
  end
  redis.call('PERSIST', live)  -- (a set an older version left with a TTL)
  redis.call('PERSIST', counts)
end
settle(KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[4]))
"""

ADMIT = SETTLE + """
local live = redis.call('ZCARD', KEYS[1])
local first = 5 + 2 * tonumber(ARGV[4])
if live + #ARGV - first + 1 > tonumber(ARGV[2]) then return live end
for i = first, #ARGV do redis.call('ZADD', KEYS[1], ARGV[3], ARGV[i]) end
return -1
"""

PRUNE = SETTLE + "return 0"

FORGET = UNCOUNT + """
for _, sid in ipairs(ARGV) do
  redis.call('ZREM', KEYS[1], sid)
  uncount(KEYS[2], sid)
end
return 0
"""

# Count bytes for a tenant unless that would pass its quota (then nothing is counted and the bytes
# used are returned). ARGV: quota (-1: none), then pairs of a session id (or '#records') and its
# bytes (negative to give bytes back).
RESERVE = """
local need = 0
for i = 2, #ARGV, 2 do need = need + tonumber(ARGV[i + 1]) end
local quota = tonumber(ARGV[1])
if quota >= 0 and need > 0 then
  local used = tonumber(redis.call('HGET', KEYS[1], '#total') or '0') + tonumber(redis.call('GET', KEYS[2]) or '0')
  if used + need > quota then return used end
end
for i = 2, #ARGV, 2 do
  if ARGV[i] == '#records' then
    redis.call('INCRBY', KEYS[2], ARGV[i + 1])
  else
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
    redis.call('HINCRBY', KEYS[1], '#total', ARGV[i + 1])
  end
end
return -1
"""

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

PUT_RECORD = """
local existing = redis.call('HGET', KEYS[1], ARGV[1])
if existing then return existing end
if tonumber(ARGV[3]) >= 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return {err = 'record limit'} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return false
"""


# How long a lock outlives a holder that stopped renewing it.
HEARTBEAT = 10.0
# Bases kept read in this process (content-addressed, so never stale), least recently used first.
BASE_CACHE_BYTES = 64 << 20
PARSED_BASES = 8  # and kept parsed into parts, to compose states from their deltas
OFF_LOOP_BYTES = 256 * 1024  # bases this large are parsed and composed off the event loop


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


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


def _translated(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Redis errors become StoreError here, once, so the service sees only its own errors."""

    @wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        store = args[0]
        assert isinstance(store, RedisStore)
        store.reconnect.check()
        try:
            result = await fn(*args, **kwargs)
        except RedisError as exc:
            raise await store.translate(exc) from exc
        store.reconnect.succeeded()
        return result

    return wrapper


CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


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


def _connect(url: str | None, nodes: str | None) -> aioredis.Redis | RedisCluster:
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


@dataclass(frozen=True)
class Base:
    """A base a group of new sessions names: its key, its size, and whether it is their state too."""

    name: str
    size: int
    is_state: bool


def _base_names(fields: dict[str, Any]) -> list[str]:
    return [str(fields[name]) for name in BASE_FIELDS if fields.get(name)]


def _digest(name: str | None) -> str:
    """A base's digest, from its key (see ``Keys.base``)."""
    return name.rsplit(":", 1)[1] if name else ""


class Keeper:
    """A lock's renewal: a timer, then (for a long holder) the task that renews the lease."""

    timer: asyncio.TimerHandle | None = None
    task: asyncio.Task[None] | None = None

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


class RedisStore:
    def __init__(self, url: str | None, ttl: float = 3600.0, prefix: str = "ef", *,
                 cluster_nodes: str | None = None) -> None:
        self.ttl = ttl
        self.keys = Keys(prefix)
        self.client: Any = _connect(url, cluster_nodes)
        # A cluster keeps each session on one slot (its hash tag), but a group or a tenant's count lives
        # on other slots: those updates are made one slot at a time (see create_group and commit).
        self.cluster = isinstance(self.client, RedisCluster)
        self.reconnect = Reconnect()
        # Call locks whose release failed because Redis was down: released once it is back, so a
        # session is not blocked for a whole lease after an outage (key -> token).
        self._unreleased: dict[str, str] = {}
        # The call path's two scripts take a lane of their own (a cluster routes by slot: not there).
        self.lane = Lane(url, COMMAND_TIMEOUT) if url and not self.cluster else None
        self._commit = self.client.register_script(COMMIT)
        self._begin = self.client.register_script(BEGIN)
        self._fork = self.client.register_script(FORK)
        self._release = self.client.register_script(RELEASE)
        self._put_record = self.client.register_script(PUT_RECORD)
        self._admit = self.client.register_script(ADMIT)
        self._prune = self.client.register_script(PRUNE)
        self._forget = self.client.register_script(FORGET)
        self._reserve_script = self.client.register_script(RESERVE)
        self._renew = self.client.register_script(RENEW)
        self._refresh = self.client.register_script(REFRESH)
        self._touch = "0" if self.cluster else "1"  # whether the session scripts refresh bases themselves
        self._base_texts: OrderedDict[str, str] = OrderedDict()  # base key -> its text
        self._parsed: OrderedDict[str, deltas.Base] = OrderedDict()  # bases a delta was composed with
        self._base_bytes = 0

    async def translate(self, exc: RedisError) -> StoreError:
        """Our error for a Redis error; an unreachable Redis also drops the pool's idle connections,
        which point at a server that is gone, so the first request after it returns works."""
        if not isinstance(exc, RedisConnectionError | RedisTimeoutError):
            return StoreError(f"redis: {exc}")
        if self.lane is not None:
            self.lane.reset(exc)
        pool = getattr(self.client, "connection_pool", None)  # a cluster client manages its own nodes
        if pool is not None:
            try:
                await pool.disconnect(inuse_connections=False)
            except (RedisError, OSError):
                pass
        return self.reconnect.failed(exc)

    @property
    def _ttl_ms(self) -> int:
        return int(self.ttl * 1000)

    @property
    def _base_ttl_ms(self) -> int:
        return 2 * self._ttl_ms

    async def _shorten(self, keys: Sequence[str], idle_ttl: str | None) -> None:
        """Give a session with an idle TTL of its own its TTL back, after a read made in one
        pipeline with the store's. The pipeline cannot know it before it reads the meta, and a
        script in it cannot run on a cluster's pipelines; so such a session's reads take a second
        round trip (the common session, without one, takes none)."""
        if not idle_ttl:
            return
        async with self.client.pipeline(transaction=True) as pipe:
            for key in keys:
                pipe.pexpire(key, int(float(idle_ttl) * 1000))
            await pipe.execute()

    async def _keep_base(self, name: str, text: str) -> None:
        """Store a base unless it is there (then its TTL is refreshed: it is not sent again)."""
        if not await self.client.pexpire(name, self._base_ttl_ms):
            await self.client.set(name, text, px=self._base_ttl_ms)
        self._remember_base(name, text)

    def _remember_base(self, name: str, text: str) -> None:
        if name in self._base_texts:
            self._base_texts.move_to_end(name)
            return
        self._base_texts[name] = text
        self._base_bytes += len(text)
        while self._base_bytes > BASE_CACHE_BYTES and len(self._base_texts) > 1:
            _, dropped = self._base_texts.popitem(last=False)
            self._base_bytes -= len(dropped)

    async def _bases(self, names: Sequence[str | None], wanted: Sequence[str] = ()) -> dict[str, str] | None:
        """Refresh bases ``names`` (a cluster's session scripts cannot) and the texts of ``wanted``
        among them; None when one of them is gone (its sessions cannot be read any more)."""
        present = list(dict.fromkeys(n for n in names if n))
        if not present:
            return {}
        fetch = [n for n in dict.fromkeys(wanted) if n and n not in self._base_texts]
        async with self.client.pipeline(transaction=False) as pipe:
            for name in present:
                pipe.pexpire(name, self._base_ttl_ms)
            for name in fetch:
                pipe.get(name)
            answers: list[Any] = await pipe.execute()
        if not all(answers[:len(present)]):
            return None
        for name, text in zip(fetch, answers[len(present):], strict=True):
            if text is None:
                return None
            self._remember_base(name, str(text))
        texts = {}
        for name in wanted:
            if name:
                texts[name] = self._base_texts[name]
                self._base_texts.move_to_end(name)
        return texts

    async def create(self, meta: SessionMeta, state: str, initial: str, trajectory: list[str], *,
                     quota: int | None = None) -> None:
        await self.create_group([meta], state, initial, trajectory, quota=quota)

    async def _reserve(self, tenant: str, counts: dict[str, int], quota: int | None) -> None:
        """Count bytes for ``tenant`` (a session id or '#records' to its bytes), all or none.

        Raises:
            BytesQuota: they would take the tenant past ``quota``; nothing is counted.
        """
        pairs = [item for field, size in counts.items() for item in (field, size)]
        used = int(await self._reserve_script(keys=[self.keys.session_bytes(tenant), self.keys.record_bytes(tenant)],
                                              args=[-1 if quota is None else quota, *pairs]))
        if used >= 0:
            raise BytesQuota(used, sum(counts.values()), quota or 0)

    async def _unreserve(self, tenant: str, counts: dict[str, int]) -> None:
        """Give back bytes counted for writes that then failed (best effort: Redis may be gone)."""
        try:
            await self._reserve(tenant, {field: -size for field, size in counts.items()}, None)
        except RedisError:
            pass

    @_translated
    async def create_group(self, metas: list[SessionMeta], state: str, initial: str, trajectory: list[str], *,
                           quota: int | None = None, initial_digest: str = "",
                           delta: dict[str, str] | None = None) -> None:
        if not metas:
            return
        fields = dict(delta or {})
        if fields and not (initial_digest and (state is initial or state == initial)):
            raise ValueError("a delta is against the initial state, as a base that is the state")
        held = sum(stored_bytes(name) + stored_bytes(value) for name, value in fields.items())
        size = stored_bytes(initial)
        each = (size if state is initial else stored_bytes(state)) + size + sum(map(stored_bytes, trajectory)) + held
        counts = {meta.session_id: each for meta in metas}
        tenant = metas[0].tenant
        # Counted first, in one script on the tenant's slot, so the quota holds however many replicas write.
        await self._reserve(tenant, counts, quota)
        try:
            base = None
            if initial_digest:
                base = Base(self.keys.base(tenant, initial_digest), stored_bytes(initial),
                            state is initial or state == initial)
                await self._keep_base(base.name, initial)  # before the sessions: none reads a missing base
            await self._write_group(metas, state, initial, trajectory, base, fields)
        except BaseException:
            await self._unreserve(tenant, counts)
            raise

    async def _write_group(self, metas: list[SessionMeta], state: str, initial: str, trajectory: list[str],
                           base: Base | None, fields: dict[str, str] | None = None) -> None:
        if not self.cluster:
            # One MULTI: every session of the group exists, or none does.
            async with self.client.pipeline(transaction=True) as pipe:
                for meta in metas:
                    self._write_session(pipe, meta, state, initial, trajectory, base, fields)
                await pipe.execute()
            return
        # A cluster spreads the group's sessions over slots, so no single MULTI covers them: each session is
        # written in a MULTI of its own slot, and if any fails the ones written are deleted before the error is
        # raised. Session ids are fresh, so nobody can have seen a half-made group in between.
        async def one(meta: SessionMeta) -> None:
            async with self.client.pipeline(transaction=True) as pipe:
                self._write_session(pipe, meta, state, initial, trajectory, base, fields)
                await pipe.execute()

        outcomes = await asyncio.gather(*(one(meta) for meta in metas), return_exceptions=True)
        failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failure is not None:
            for meta in metas:
                try:
                    await self.client.delete(*self.keys.session(meta.session_id).kept())
                except RedisError:
                    pass  # unreachable now: the keys expire with the session TTL
            raise failure

    @_translated
    async def copy(self, source: SessionMeta, metas: list[SessionMeta], *, quota: int | None = None) -> bool:
        """Store ``metas`` as copies of ``source``'s state, initial state and trajectory, server-side
        where Redis allows (one script), else read and written back; False if ``source`` is gone."""
        if self.lane is not None:
            each = await self._bytes_of(source)
            counts = {meta.session_id: each for meta in metas}
            await self._reserve(source.tenant, counts, quota)
            try:
                copied = await self._copy_inside(source, metas)
            except BaseException:
                await self._unreserve(source.tenant, counts)
                raise
            if copied is not None:
                if not copied:
                    await self._unreserve(source.tenant, counts)
                return copied
            await self._unreserve(source.tenant, counts)
        snap = await self.load(source.session_id, trajectory=True)
        if snap is None:
            return False
        await self.create_group(metas, snap.state, snap.initial, snap.trajectory, quota=quota,
                                initial_digest=snap.initial_digest)
        return True

    async def _bytes_of(self, meta: SessionMeta) -> int:
        """What a session stores, as counted for its tenant (for one counted before counts
        existed: its state and initial state)."""
        counted = await self.client.hget(self.keys.session_bytes(meta.tenant), meta.session_id)
        if counted is not None:
            return int(counted)
        k = self.keys.session(meta.session_id)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.strlen(k.state)
            pipe.strlen(k.initial)
            sizes: list[int] = await pipe.execute()
        return sum(int(size) for size in sizes)

    async def _copy_inside(self, source: SessionMeta, metas: list[SessionMeta]) -> bool | None:
        """The copy as one server-side script; None when this Redis cannot (no COPY before 6.2)."""
        if self.lane is not None:
            k = self.keys.session(source.session_id)
            keys = [k.meta, k.state, k.initial, k.trajectory, k.delta]
            for meta in metas:
                keys.extend(self.keys.session(meta.session_id).kept())
            created = metas[0].to_fields()["created_at"]
            try:
                done = await self._script(self._fork, keys, [self._ttl_ms, created, source.session_id,
                                                             self._base_ttl_ms, *(m.session_id for m in metas)])
                return int(done) == 1
            except ResponseError as exc:
                if "COPY" not in str(exc).upper() and "unknown command" not in str(exc):
                    raise
        return None

    def _write_session(self, pipe: Any, meta: SessionMeta, state: str, initial: str, trajectory: list[str],
                       base: Base | None = None, delta: dict[str, str] | None = None) -> None:
        k = self.keys.session(meta.session_id)
        pipe.delete(*k.kept())  # a create never extends what an old session left
        fields = dict[Any, Any](meta.to_fields())
        if base is not None:  # the session names its base instead of holding a copy
            fields.update(initial_base=base.name, base_bytes=base.size)
            if base.is_state:
                fields["state_base"] = base.name
        if delta:
            fields["delta_bytes"] = sum(stored_bytes(name) + stored_bytes(value) for name, value in delta.items())
            pipe.hset(k.delta, mapping=delta)
            pipe.pexpire(k.delta, int(meta.ttl(self.ttl) * 1000))
        pipe.hset(k.meta, mapping=fields)
        if base is None or not base.is_state:
            pipe.set(k.state, state)
        if base is None:
            pipe.set(k.initial, initial)
        if trajectory:
            pipe.rpush(k.trajectory, *trajectory)
        for key in k.data():
            pipe.pexpire(key, int(meta.ttl(self.ttl) * 1000))

    @_translated
    async def load(self, session_id: str, *, trajectory: bool = False, blobs: bool = True,
                   current: bool = True) -> Snapshot | None:
        k = self.keys.session(session_id)
        if not blobs:
            pairs = iter(await self._script(self._refresh, list(k.kept()),
                                            [self._ttl_ms, self._base_ttl_ms, self._touch]))
            fields = dict(zip(pairs, pairs, strict=True))
            if not fields or (self.cluster and await self._bases(_base_names(fields)) is None):
                return None
            meta_only = SessionMeta.from_fields(fields)
            return Snapshot(meta_only, "", "", time.time() + meta_only.ttl(self.ttl),
                            initial_digest=_digest(fields.get("initial_base")),
                            state_digest=_digest(fields.get("state_base")))
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(k.meta)
            pipe.get(k.state)
            pipe.get(k.initial)
            pipe.hgetall(k.delta)
            if trajectory:
                pipe.lrange(k.trajectory, 0, -1)
            for key in k.kept():
                pipe.pexpire(key, self._ttl_ms)
            results: list[Any] = await pipe.execute()
        meta, state, initial, fields = results[0], results[1], results[2], results[3]
        if not meta:
            return None
        await self._shorten(k.kept(), meta.get("idle_ttl"))
        initial_base = meta.get("initial_base", "")
        texts = await self._bases(_base_names(meta), [initial_base if initial is None else ""])
        state = await self._composed(meta, state, fields, texts) if current else ""
        initial = texts.get(initial_base) if initial is None and texts is not None else initial
        if state is None or initial is None:
            return None
        read = SessionMeta.from_fields(meta)
        return Snapshot(
            meta=read,
            state=state,
            initial=initial,
            expires_at=time.time() + read.ttl(self.ttl),
            trajectory=list(results[4]) if trajectory else [],
            initial_digest=_digest(initial_base),
            state_digest=_digest(meta.get("state_base")),
        )

    async def _composed(self, meta: dict[str, str], state: str | None, fields: dict[str, str],
                        texts: dict[str, str] | None) -> str | None:
        """The session's state: its own text, or its base and its delta composed (off the event loop
        when the base is large); None when its base is gone or the delta does not fit it."""
        name = meta.get("state_base", "")
        if state is not None or not name:
            return state
        found = await self._bases([name], [name]) if texts is None or name not in texts else texts
        if found is None:
            return None
        if not fields:
            return found[name]
        parsed = self._parsed.get(name)
        try:
            if parsed is None:
                parsed = await _off_loop(deltas.Base, found[name])
                self._parsed[name] = parsed
                while len(self._parsed) > PARSED_BASES:
                    self._parsed.popitem(last=False)
            self._parsed.move_to_end(name)
            return await _off_loop(deltas.compose, parsed, fields) if parsed.size > OFF_LOOP_BYTES \
                else deltas.compose(parsed, fields)
        except ValueError:
            return None  # (a delta only its own session's forged answers could have made)

    async def _stored(self, session_id: str) -> tuple[str, dict[str, str] | None] | None:
        k = self.keys.session(session_id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.get(k.state)
            pipe.hgetall(k.meta)
            pipe.hgetall(k.delta)
            value, meta, fields = await pipe.execute()
        if not meta:
            return None
        text = await self._composed(meta, value, fields, None)
        if text is None:
            return None
        return text, None if value is not None or not meta.get("state_base") else dict(fields)

    @_translated
    async def state(self, session_id: str) -> str | None:
        found = await self._stored(session_id)
        return None if found is None else found[0]

    @_translated
    async def stored(self, session_id: str) -> tuple[str, dict[str, str] | None] | None:
        return await self._stored(session_id)

    @_translated
    async def commit(self, session_id: str, expected_step: int, state: str | None, record: str, *,
                     done: bool = False, idempotency: tuple[str, str] | None = None, tenant: str | None = None,
                     held: Held | None = None, quota: int | None = None, delta: dict[str, Any] | None = None,
                     rebase: str = "", unlocked: bool = False) -> bool:
        k = self.keys.session(session_id)
        key, value = idempotency or ("", "")
        expires = int((time.time() + self.ttl) * 1000)
        mode, text, size, changes = "0", "", 0, []
        if state is not None and rebase:
            mode, text, size = "3", self.keys.base(tenant or "", rebase), stored_bytes(state)
            await self._keep_base(text, state)  # before the session names it
        elif state is not None:
            mode, text = "1", state
        elif delta is not None:
            mode = "2"
            changes = [len(delta["set"]), *(i for pair in delta["set"].items() for i in pair), *delta["unset"]]
        args = [expected_step, mode, text, record, self._ttl_ms,
                "1" if done else "0", key, value, held.token if held else "", session_id, expires,
                -1 if quota is None else quota, self._base_ttl_ms, self._touch, size, "1" if unlocked else "0",
                *(changes or [0])]
        keys = [k.meta, k.state, k.initial, k.trajectory, k.idempotency, k.lock, k.delta]
        if tenant is not None and not self.cluster:
            # one round trip: commit, unlock, live count, bytes counted against the quota
            keys += [self.keys.live_sessions(tenant), self.keys.session_bytes(tenant), self.keys.record_bytes(tenant)]
        upper = 0
        if tenant is not None and self.cluster:
            # The tenant's counts are on another slot: the most the step can add is counted first.
            upper = stored_bytes(record) + (0 if state is None else stored_bytes(state)) + sum(
                stored_bytes(str(item)) for item in changes[1:])
            await self._reserve(tenant, {session_id: upper}, quota)
        try:
            outcome, grown, lives = await self._script(self._commit, keys, args)
        except BaseException:
            if upper:
                await self._unreserve(tenant or "", {session_id: upper})
            raise
        if held is not None:
            held.released = True
        if tenant is not None and self.cluster:
            # ...and set right after the commit (with the live count), in a second round trip.
            await self._reserve(tenant, {session_id: (int(grown) if int(outcome) == 1 else 0) - upper}, None)
            async with self.client.pipeline(transaction=True) as pipe:
                # (the script said how long the session lives: its own idle TTL, or the store's)
                pipe.zadd(self.keys.live_sessions(tenant), {session_id: expires - self._ttl_ms + int(lives)}, xx=True)
                for name in held.bases if held is not None else []:  # on the tenant's slot too
                    pipe.pexpire(name, self._base_ttl_ms)
                await pipe.execute()
        if int(outcome) == -2:
            used = await self.usage(tenant or "")
            raise BytesQuota(used, int(grown), quota or 0)
        return int(outcome) == 1

    @_translated
    async def admit(self, tenant: str, session_ids: list[str], limit: int, ttl: float | None = None) -> int | None:
        now, due = await self._due(tenant)
        lives = self._ttl_ms if ttl is None else int(ttl * 1000)
        live = await self._script(self._admit, [self.keys.live_sessions(tenant), self.keys.session_bytes(tenant)],
                                  [now, limit, now + lives, len(due) // 2, *due, *session_ids])
        return None if int(live) < 0 else int(live)

    async def _due(self, tenant: str) -> tuple[int, list[Any]]:
        """Now (ms), and the tenant's counted ids whose score has passed, each with when its session
        really expires (0: gone), for ``SETTLE``. Reads refresh a session's keys, never its score."""
        now = int(time.time() * 1000)
        due = [str(sid) for sid in await self.client.zrangebyscore(self.keys.live_sessions(tenant), "-inf", now)]
        if not due:
            return now, []
        async with self.client.pipeline(transaction=False) as pipe:  # (sessions on many slots of a cluster)
            for sid in due:
                pipe.pttl(self.keys.session(sid).meta)
            left: list[Any] = await pipe.execute()
        return now, [item for sid, ms in zip(due, left, strict=True)
                     for item in (sid, now + int(ms) if int(ms) > 0 else now + self._ttl_ms if int(ms) == -1 else 0)]

    @_translated
    async def usage(self, tenant: str) -> int:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hget(self.keys.session_bytes(tenant), "#total")
            pipe.get(self.keys.record_bytes(tenant))
            sessions, records = await pipe.execute()
        return int(sessions or 0) + int(records or 0)

    @_translated
    async def live(self, tenant: str, offset: int, limit: int) -> tuple[list[str], int]:
        now, due = await self._due(tenant)
        key = self.keys.live_sessions(tenant)
        if due:
            await self._prune(keys=[key, self.keys.session_bytes(tenant)], args=[now, -1, 0, len(due) // 2, *due])
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.zrangebyscore(key, now, "+inf", start=offset, num=limit)
            pipe.zcount(key, now, "+inf")
            ids, total = await pipe.execute()
        return [str(i) for i in ids], int(total)

    @_translated
    async def forget(self, tenant: str, session_ids: list[str]) -> None:
        if session_ids:
            await self._forget(keys=[self.keys.live_sessions(tenant), self.keys.session_bytes(tenant)],
                               args=session_ids)

    @_translated
    async def idempotent(self, session_id: str, key: str) -> str | None:
        value = await self.client.hget(self.keys.session(session_id).idempotency, key)
        return None if value is None else str(value)

    @_translated
    async def trajectory(self, session_id: str) -> list[str] | None:
        k = self.keys.session(session_id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.exists(k.meta)
            pipe.lrange(k.trajectory, 0, -1)
            pipe.hmget(k.meta, *BASE_FIELDS, "idle_ttl")
            for key in k.kept():
                pipe.pexpire(key, self._ttl_ms)
            results: list[Any] = await pipe.execute()
        await self._shorten(k.kept(), results[2].pop())
        await self._bases(list(results[2]))
        return list(results[1]) if results[0] else None

    @_translated
    async def trajectory_page(self, session_id: str, offset: int, limit: int) -> tuple[list[str], int] | None:
        k = self.keys.session(session_id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.exists(k.meta)
            pipe.lrange(k.trajectory, offset, offset + limit - 1)
            pipe.llen(k.trajectory)
            pipe.hmget(k.meta, *BASE_FIELDS, "idle_ttl")
            for key in k.kept():
                pipe.pexpire(key, self._ttl_ms)
            results: list[Any] = await pipe.execute()
        await self._shorten(k.kept(), results[3].pop())
        await self._bases(list(results[3]))
        return (list(results[1]), int(results[2])) if results[0] else None

    @_translated
    async def claim_request(self, key: str, value: str, lease: float) -> str | None:
        name = self.keys.request(key)
        if await self.client.set(name, value, nx=True, px=int(lease * 1000)):
            return None
        existing = await self.client.get(name)
        return "" if existing is None else str(existing)

    @_translated
    async def finish_request(self, key: str, value: str) -> None:
        await self.client.set(self.keys.request(key), value, px=self._ttl_ms)

    @_translated
    async def release_request(self, key: str) -> None:
        await self.client.delete(self.keys.request(key))

    @_translated
    async def delete(self, session_id: str) -> bool:
        k = self.keys.session(session_id)
        removed = await self.client.delete(*k.kept())
        return int(removed) > 0

    @asynccontextmanager
    async def lock(self, session_id: str, wait: float, lease: float) -> AsyncIterator[None]:
        """The lock is held for a short lease that the holder renews while it works, so a holder that
        dies (kill -9) blocks the session for at most ``HEARTBEAT`` seconds, not the longest request."""
        key = self.keys.session(session_id).lock
        token = secrets.token_hex(16)
        held = min(lease, HEARTBEAT)
        await self._acquire(key, token, wait, held, session_id)
        keeper = self._keep_later(key, token, held)
        try:
            yield
        finally:
            keeper.cancel()
            try:
                await self._release(keys=[key], args=[token])
            except RedisError:
                self._unreleased[key] = token  # released when Redis answers again; else the lease ends it

    @asynccontextmanager
    async def begin(self, session_id: str, wait: float, lease: float) -> AsyncIterator[Held]:
        """``lock`` and a meta-only ``load`` in one script; a commit given the result unlocks too."""
        k = self.keys.session(session_id)
        token = secrets.token_hex(16)
        lease = min(lease, HEARTBEAT)
        meta = await self._begin_locked([k.lock, *k.kept()], token, wait, lease, session_id)
        if not meta:
            yield Held(None, token, released=True)
            return
        pairs = iter(meta)
        fields = dict(zip(pairs, pairs, strict=True))
        read = SessionMeta.from_fields(fields)
        snap = Snapshot(read, "", "", time.time() + read.ttl(self.ttl),
                        initial_digest=_digest(fields.get("initial_base")),
                            state_digest=_digest(fields.get("state_base")))
        held = Held(snap, token, bases=_base_names(fields))
        if self.cluster and held.bases:
            await self._touch_bases(held.bases)
        keeper = self._keep_later(k.lock, token, lease)
        try:
            yield held
        finally:
            keeper.cancel()
            if not held.released:
                try:
                    await self._release(keys=[k.lock], args=[token])
                except RedisError:
                    self._unreleased[k.lock] = token

    @_translated
    async def _begin_locked(self, keys: list[str], token: str, wait: float, lease: float,
                            session_id: str) -> list[str]:
        async def take() -> list[str] | None:
            meta = await self._script(self._begin, keys, [token, int(lease * 1000), self._ttl_ms,
                                                          self._base_ttl_ms, self._touch])
            return None if meta is None else list(meta)

        return await self._until_free(take, wait, session_id)

    def _keep_later(self, key: str, token: str, lease: float) -> Keeper:
        """Renew the lease from a third of the way through it, only if the holder is still at work
        then (most calls end long before: no task for them)."""
        keeper = Keeper()

        def start() -> None:
            keeper.task = asyncio.get_running_loop().create_task(self._keep(key, token, lease))

        keeper.timer = asyncio.get_running_loop().call_later(lease / 3, start)
        return keeper

    async def _release_stale(self) -> None:
        for stale, stale_token in list(self._unreleased.items()):
            await self._release(keys=[stale], args=[stale_token])
            del self._unreleased[stale]

    @_translated
    async def _touch_bases(self, names: Sequence[str | None]) -> None:
        await self._bases(names)

    @_translated
    async def _acquire(self, key: str, token: str, wait: float, lease: float, session_id: str) -> None:
        async def take() -> bool | None:
            return await self.client.set(key, token, nx=True, px=int(lease * 1000)) or None

        await self._until_free(take, wait, session_id)

    async def _until_free(self, attempt: Callable[[], Coroutine[Any, Any, T | None]], wait: float,
                          session_id: str) -> T:
        """Repeat ``attempt`` (taking a session's lock) with a growing pause until it gives something.

        Raises:
            LockTimeout: the session stayed locked for ``wait`` seconds.
        """
        await self._release_stale()
        deadline = time.monotonic() + wait
        delay = 0.002
        while (taken := await attempt()) is None:
            if time.monotonic() >= deadline:
                raise LockTimeout(f"session {session_id} stayed busy for {wait:g} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        return taken

    async def _keep(self, key: str, token: str, held: float) -> None:
        while True:
            await asyncio.sleep(held / 3)
            try:
                await self._renew(keys=[key], args=[token, int(held * 1000)])
            except RedisError:
                pass  # Redis is away: the commit's compare-and-set still keeps steps exact

    async def put_record(self, kind: str, key: str, value: str, *, tenant: str = "",
                         limit: int | None = None, quota: int | None = None) -> str | None:
        size = {"#records": stored_bytes(value)}
        try:
            known = await self.client.hget(self.keys.records(kind, tenant), key)
            if known is not None:
                return str(known)  # (not counted against the quota: nothing is written)
            await self._reserve(tenant, size, quota)
            try:
                existing = await self._put_record(keys=[self.keys.records(kind, tenant)],
                                                  args=[key, value, -1 if limit is None else limit])
            except BaseException:
                await self._unreserve(tenant, size)
                raise
        except ResponseError as exc:
            if "record limit" in str(exc):
                raise RecordLimit(f"{kind}: at most {limit}") from exc
            raise StoreError(f"redis: {exc}") from exc
        except RedisError as exc:
            raise StoreError(f"redis: {exc}") from exc
        if existing is not None:
            await self._unreserve(tenant, size)  # nothing was written
        return None if existing is None else str(existing)

    @_translated
    async def set_record(self, kind: str, key: str, value: str, *, tenant: str = "", quota: int | None = None) -> None:
        name = self.keys.records(kind, tenant)
        old = int(await self.client.hstrlen(name, key))
        # (the bytes of a record replaced concurrently may be counted a little off; never a write lost)
        grown = stored_bytes(value) - old
        await self._reserve(tenant, {"#records": grown}, quota if grown > 0 else None)
        try:
            await self.client.hset(name, key, value)
        except BaseException:
            await self._unreserve(tenant, {"#records": grown})
            raise

    @_translated
    async def get_record(self, kind: str, key: str, *, tenant: str = "") -> str | None:
        value = await self.client.hget(self.keys.records(kind, tenant), key)
        return None if value is None else str(value)

    @_translated
    async def all_records(self, kind: str, *, tenant: str = "") -> dict[str, str]:
        records = await self.client.hgetall(self.keys.records(kind, tenant))
        return {str(k): str(v) for k, v in records.items()}

    @_translated
    async def delete_record(self, kind: str, key: str, *, tenant: str = "") -> bool:
        name = self.keys.records(kind, tenant)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hstrlen(name, key)
            pipe.hdel(name, key)
            size, removed = await pipe.execute()
        if int(removed) > 0:
            await self._reserve(tenant, {"#records": -int(size)}, None)
        return int(removed) > 0

    @_translated
    async def ping(self) -> None:
        await self.client.ping()

    async def close(self) -> None:
        if self.lane is not None:
            await self.lane.close()
        await self.client.aclose()

    async def _script(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """Run one of the call path's scripts, on the lane where there is one."""
        if self.lane is not None:
            return await self.lane.evalsha(script.sha, script.script, keys, args)
        return await script(keys=keys, args=args)
