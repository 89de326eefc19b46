"""One contract suite for both session stores (``service.stores.store.SessionStore``).

Every test that takes ``store`` or ``make_store`` runs against the in-process
``MemoryStore``, against ``RedisStore`` on a real Redis, and against ``RedisStore``
on a real three-master Redis Cluster (``tests/redis_cluster.py``). Tests named
``test_redis_*`` cover what only the Redis store has (leases, key layout, real
TTLs, several replicas, an unreachable server).
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from service.stores.memory_store import MemoryStore
from service.stores.redis import RedisStore, StoreUnavailable
from service.stores.redis.connection import RECONNECT_LONGEST
from service.stores.redis.keys import Keys
from service.stores.store import BytesQuota, LockTimeout, SessionMeta, SessionStore, StoreError, new_session_id

pytestmark = pytest.mark.anyio

DEAD_URL = "redis://127.0.0.1:1/0"


class StoreFactory:
    """``make(ttl=...)`` builds a store of one kind; every store made is closed at teardown."""

    def __init__(self, kind: str, url: str | None, prefix: str | None, nodes: str | None = None) -> None:
        self.kind = kind
        self.url = url
        self.nodes = nodes
        self.prefix = prefix
        self.made: list[SessionStore] = []

    def __call__(self, ttl: float = 3600.0) -> SessionStore:
        store: SessionStore
        if self.kind == "memory":
            store = MemoryStore(ttl=ttl)
        else:
            assert (self.url or self.nodes) and self.prefix is not None
            store = RedisStore(self.url, ttl=ttl, prefix=self.prefix, cluster_nodes=self.nodes)
        self.made.append(store)
        return store


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("cluster", marks=pytest.mark.redis)])
async def make_store(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[StoreFactory]:
    if request.param == "redis":
        factory = StoreFactory("redis", request.getfixturevalue("redis_url"), request.getfixturevalue("key_prefix"))
    elif request.param == "cluster":
        # a fresh prefix per test; the cluster is the test session's own and is killed at its end
        cluster = request.getfixturevalue("redis_cluster")
        factory = StoreFactory("cluster", None, f"eftest-{secrets.token_hex(4)}", nodes=cluster.nodes)
    else:
        factory = StoreFactory("memory", None, None)
    yield factory
    for store in factory.made:
        await store.close()


@pytest.fixture
def store(make_store: StoreFactory) -> SessionStore:
    return make_store()


@pytest.fixture
async def make_redis(redis_url: str, key_prefix: str, anyio_backend: str) -> AsyncIterator[StoreFactory]:
    """Redis stores only, all on the test's own key prefix."""
    factory = StoreFactory("redis", redis_url, key_prefix)
    yield factory
    for made in factory.made:
        await made.close()


@pytest.fixture
def raw_redis(redis_url: str) -> Iterator[redis.Redis]:
    """A plain synchronous client to look at what the store really wrote."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def _meta(step: int = 0, *, scenario_id: str | None = "scn_1", parent_id: str | None = None) -> SessionMeta:
    return SessionMeta(new_session_id(), "env_a", scenario_id, time.time(), step=step, parent_id=parent_id)


def _rec(step: int) -> str:
    return json.dumps({"step": step})


async def _created(store: SessionStore, trajectory: list[str] | None = None, **kw: Any) -> SessionMeta:
    meta = _meta(**kw)
    await store.create(meta, '{"n":0}', '{"n":"initial"}', list(trajectory or []))
    return meta


# --- create / load -----------------------------------------------------------


async def test_create_then_load_returns_same_meta_state_and_initial(store: SessionStore) -> None:
    meta = _meta(step=3, parent_id="ses_parent")
    before = time.time()
    await store.create(meta, '{"a":1}', '{"a":0}', ["r1", "r2", "r3"])
    snap = await store.load(meta.session_id)
    assert snap is not None
    assert snap.meta == meta
    assert snap.state == '{"a":1}'
    assert snap.initial == '{"a":0}'
    assert snap.trajectory == []  # only with trajectory=True
    assert before + store.ttl - 5 <= snap.expires_at <= time.time() + store.ttl + 5


async def test_create_then_load_keeps_none_scenario_and_parent(store: SessionStore) -> None:
    meta = _meta(scenario_id=None, parent_id=None)
    await store.create(meta, "{}", "{}", [])
    snap = await store.load(meta.session_id)
    assert snap is not None
    assert snap.meta == meta
    assert snap.meta.scenario_id is None and snap.meta.parent_id is None


async def test_load_with_trajectory_returns_the_trajectory(store: SessionStore) -> None:
    meta = await _created(store, ["r1", "r2"], step=2)
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None
    assert snap.trajectory == ["r1", "r2"]
    assert snap.meta.step == 2


async def test_load_of_unknown_session_is_none(store: SessionStore) -> None:
    assert await store.load(new_session_id()) is None
    assert await store.load(new_session_id(), trajectory=True) is None


async def test_store_keeps_its_own_copies(store: SessionStore) -> None:
    meta = _meta()
    trajectory = ["r1"]
    await store.create(meta, "{}", "{}", trajectory)
    meta.step = 99
    trajectory.append("mutated")
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None
    assert snap.meta.step == 0
    assert snap.trajectory == ["r1"]
    snap.meta.step = 42
    snap.trajectory.append("mutated")
    again = await store.load(meta.session_id, trajectory=True)
    assert again is not None
    assert again.meta.step == 0
    assert again.trajectory == ["r1"]


# --- commit ------------------------------------------------------------------


async def test_commit_at_expected_step_appends_advances_and_replaces_state(store: SessionStore) -> None:
    meta = await _created(store)
    assert await store.commit(meta.session_id, 0, '{"n":1}', _rec(1)) is True
    assert await store.commit(meta.session_id, 1, '{"n":2}', _rec(2)) is True
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None
    assert snap.meta.step == 2
    assert snap.state == '{"n":2}'
    assert snap.initial == '{"n":"initial"}'  # never touched by commits
    assert snap.trajectory == [_rec(1), _rec(2)]
    assert await store.trajectory(meta.session_id) == [_rec(1), _rec(2)]


async def test_commit_with_none_state_keeps_the_state(store: SessionStore) -> None:
    meta = await _created(store)
    assert await store.commit(meta.session_id, 0, None, _rec(1)) is True
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None
    assert snap.state == '{"n":0}'
    assert snap.meta.step == 1
    assert snap.trajectory == [_rec(1)]


async def test_commit_with_empty_string_state_replaces_the_state(store: SessionStore) -> None:
    meta = await _created(store)
    assert await store.commit(meta.session_id, 0, "", _rec(1)) is True
    snap = await store.load(meta.session_id)
    assert snap is not None
    assert snap.state == ""


async def test_commit_with_stale_step_returns_false_and_changes_nothing(store: SessionStore) -> None:
    meta = await _created(store)
    assert await store.commit(meta.session_id, 0, '{"n":1}', _rec(1)) is True
    for wrong_step in (0, 2, -1):
        assert await store.commit(meta.session_id, wrong_step, '{"n":"stale"}', "stale") is False
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None
    assert snap.meta.step == 1
    assert snap.state == '{"n":1}'
    assert snap.trajectory == [_rec(1)]


async def test_commit_on_missing_session_returns_false(store: SessionStore) -> None:
    session_id = new_session_id()
    assert await store.commit(session_id, 0, "{}", _rec(1)) is False
    assert await store.load(session_id) is None  # and the commit did not conjure it up
    assert await store.trajectory(session_id) is None


async def test_an_unlocked_commit_is_refused_while_another_caller_holds_the_lock(store: SessionStore) -> None:
    """A commit made without the lock (the replica knows the step from its own last commit) must
    not slip in while another caller works under the lock: nothing is written."""
    meta = await _created(store)
    async with store.lock(meta.session_id, 1.0, 5.0):
        assert await store.commit(meta.session_id, 0, '{"n":1}', _rec(1), unlocked=True) is False
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None and snap.meta.step == 0 and snap.state == '{"n":0}' and snap.trajectory == []
    assert await store.commit(meta.session_id, 0, '{"n":1}', _rec(1), unlocked=True) is True
    assert await store.commit(meta.session_id, 0, '{"n":2}', _rec(2), unlocked=True) is False  # stale step


async def test_an_unlocked_commit_is_refused_for_a_key_already_used(store: SessionStore) -> None:
    meta = await _created(store)
    assert await store.commit(meta.session_id, 0, None, _rec(1), idempotency=("k1", "first")) is True
    assert await store.commit(meta.session_id, 1, None, _rec(2), idempotency=("k1", "again"), unlocked=True) is False
    assert await store.idempotent(meta.session_id, "k1") == "first"
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None and snap.meta.step == 1 and snap.trajectory == [_rec(1)]
    assert await store.commit(meta.session_id, 1, None, _rec(2), idempotency=("k2", "new"), unlocked=True) is True


async def test_racing_commits_on_the_same_step_exactly_one_wins(store: SessionStore) -> None:
    meta = await _created(store)
    outcomes = await asyncio.gather(
        *(store.commit(meta.session_id, 0, json.dumps({"winner": i}), f"rec-{i}") for i in range(10))
    )
    assert sum(1 for ok in outcomes if ok) == 1
    winner = outcomes.index(True)
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None
    assert snap.meta.step == 1
    assert snap.state == json.dumps({"winner": winner})
    assert snap.trajectory == [f"rec-{winner}"]


# --- lock --------------------------------------------------------------------


async def test_lock_serializes_load_commit_cycles(store: SessionStore) -> None:
    meta = await _created(store)
    inside = 0
    most_inside = 0

    async def one_call() -> bool:
        nonlocal inside, most_inside
        async with store.lock(meta.session_id, wait=60, lease=30):
            inside += 1
            most_inside = max(most_inside, inside)
            try:
                snap = await store.load(meta.session_id)
                assert snap is not None
                await asyncio.sleep(0.001)  # give the other callers every chance to interleave
                step = snap.meta.step
                return await store.commit(meta.session_id, step, json.dumps({"n": step + 1}), _rec(step + 1))
            finally:
                inside -= 1

    outcomes = await asyncio.gather(*(one_call() for _ in range(20)))
    assert outcomes == [True] * 20
    assert most_inside == 1
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None
    assert snap.meta.step == 20
    assert snap.state == json.dumps({"n": 20})
    assert snap.trajectory == [_rec(i) for i in range(1, 21)]
    assert len(set(snap.trajectory)) == 20


async def test_lock_wait_times_out_while_another_caller_holds_it(store: SessionStore) -> None:
    meta = await _created(store)
    held = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with store.lock(meta.session_id, wait=5, lease=30):
            held.set()
            await release.wait()

    task = asyncio.create_task(holder())
    try:
        await held.wait()
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            async with store.lock(meta.session_id, wait=0.3, lease=30):
                pytest.fail("the lock was granted while another caller held it")
        waited = time.monotonic() - started
        assert 0.25 <= waited < 5
        assert issubclass(LockTimeout, StoreError)
    finally:
        release.set()
        await task
    # once the holder is done, the lock is free again
    async with store.lock(meta.session_id, wait=1, lease=30):
        pass


async def test_locks_of_different_sessions_are_independent(store: SessionStore) -> None:
    first = await _created(store)
    second = await _created(store)
    async with store.lock(first.session_id, wait=1, lease=30):
        async with store.lock(second.session_id, wait=0.3, lease=30):
            pass


async def test_lock_is_released_when_the_body_raises(store: SessionStore) -> None:
    meta = await _created(store)
    with pytest.raises(RuntimeError, match="boom"):
        async with store.lock(meta.session_id, wait=1, lease=30):
            raise RuntimeError("boom")
    started = time.monotonic()
    async with store.lock(meta.session_id, wait=0.5, lease=30):
        pass
    assert time.monotonic() - started < 0.5


async def test_redis_lock_of_a_dead_holder_expires_by_itself(make_redis: StoreFactory,
                                                             raw_redis: redis.Redis) -> None:
    store = make_redis()
    meta = await _created(store)
    lock_key = Keys(make_redis.prefix or "").session(meta.session_id).lock
    raw_redis.set(lock_key, "token-of-a-killed-replica", px=300)  # what a kill -9 leaves behind
    started = time.monotonic()
    async with store.lock(meta.session_id, wait=5, lease=30):
        assert 0.1 <= time.monotonic() - started < 2
        assert raw_redis.get(lock_key) not in (None, "token-of-a-killed-replica")
    assert raw_redis.exists(lock_key) == 0


async def test_redis_lock_is_renewed_while_its_holder_works(make_redis: StoreFactory, raw_redis: redis.Redis) -> None:
    store = make_redis()
    meta = await _created(store)
    lock_key = Keys(make_redis.prefix or "").session(meta.session_id).lock
    async with store.lock(meta.session_id, wait=1, lease=0.3):
        await asyncio.sleep(1.0)  # more than three leases
        assert raw_redis.pttl(lock_key) > 0
        with pytest.raises(LockTimeout):
            async with store.lock(meta.session_id, wait=0.3, lease=0.3):
                pass


async def test_redis_a_late_holder_never_releases_the_next_holders_lock(make_redis: StoreFactory,
                                                                        raw_redis: redis.Redis) -> None:
    store = make_redis()
    meta = await _created(store)
    lock_key = Keys(make_redis.prefix or "").session(meta.session_id).lock
    late = store.lock(meta.session_id, wait=1, lease=30)
    await late.__aenter__()
    raw_redis.delete(lock_key)  # its lease ran out (e.g. Redis was away while it worked)
    async with store.lock(meta.session_id, wait=1, lease=30):
        fresh = raw_redis.get(lock_key)
        await late.__aexit__(None, None, None)
        assert raw_redis.get(lock_key) == fresh


# --- TTL ---------------------------------------------------------------------


async def test_session_untouched_for_longer_than_ttl_is_gone(make_store: StoreFactory) -> None:
    store = make_store(ttl=1.0)
    meta = await _created(store, ["r1"])
    await asyncio.sleep(1.4)
    assert await store.load(meta.session_id) is None
    assert await store.load(meta.session_id, trajectory=True) is None
    assert await store.trajectory(meta.session_id) is None
    assert await store.commit(meta.session_id, 0, "{}", _rec(1)) is False
    assert await store.load(meta.session_id) is None


async def test_load_within_ttl_refreshes_it(make_store: StoreFactory) -> None:
    store = make_store(ttl=1.0)
    meta = await _created(store)
    for _ in range(2):  # touched at ~0.6 s and ~1.2 s: each gap is shorter than the TTL
        await asyncio.sleep(0.6)
        assert await store.load(meta.session_id) is not None
    await asyncio.sleep(0.6)  # ~1.8 s after create: alive only because it was refreshed
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None
    assert snap.meta == meta
    await asyncio.sleep(1.4)
    assert await store.load(meta.session_id) is None


async def test_commit_and_trajectory_within_ttl_refresh_it(make_store: StoreFactory) -> None:
    store = make_store(ttl=1.0)
    meta = await _created(store)
    await asyncio.sleep(0.6)
    assert await store.commit(meta.session_id, 0, '{"n":1}', _rec(1)) is True
    await asyncio.sleep(0.6)
    assert await store.trajectory(meta.session_id) == [_rec(1)]
    await asyncio.sleep(0.6)
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None
    assert snap.state == '{"n":1}'
    assert snap.trajectory == [_rec(1)]


async def _touch_every_way(store: SessionStore, meta: SessionMeta, step: int) -> None:
    """Every read and write that refreshes a session's TTL, once each."""
    assert await store.load(meta.session_id, trajectory=True) is not None
    assert await store.load(meta.session_id, blobs=False) is not None
    assert await store.trajectory(meta.session_id) is not None
    assert await store.trajectory_page(meta.session_id, 0, 5) is not None
    async with store.begin(meta.session_id, wait=1, lease=5) as held:
        assert held.snap is not None
    assert await store.commit(meta.session_id, step, None, _rec(step + 1)) is True


async def test_a_session_with_its_own_idle_ttl_is_gone_after_it_and_a_busy_one_stays(
        make_store: StoreFactory) -> None:
    store = make_store(ttl=3600.0)
    idle = SessionMeta(new_session_id(), "env_a", "scn_1", time.time(), idle_ttl=1.0)
    busy = SessionMeta(new_session_id(), "env_a", "scn_1", time.time(), idle_ttl=1.0)
    await store.create_group([idle, busy], '{"n":0}', '{"n":0}', [])
    # Every way of touching the idle one gives it its own TTL back, never the store's hour.
    await _touch_every_way(store, idle, 0)
    for step in range(5):  # ~2 s, a call every ~0.4 s: twice the idle TTL, never idle for one
        await _touch_every_way(store, busy, step)
        await asyncio.sleep(0.4)
    assert await store.load(idle.session_id) is None
    assert await store.trajectory(idle.session_id) is None
    kept = await store.load(busy.session_id)
    assert kept is not None and kept.meta.step == 5 and kept.meta.idle_ttl == 1.0
    assert kept.expires_at <= time.time() + 1.0


async def test_a_copy_keeps_its_sources_idle_ttl(make_store: StoreFactory) -> None:
    store = make_store(ttl=3600.0)
    source = SessionMeta(new_session_id(), "env_a", "scn_1", time.time(), idle_ttl=1.0)
    await store.create(source, '{"n":0}', '{"n":0}', [])
    copy = SessionMeta(new_session_id(), "env_a", "scn_1", time.time(), idle_ttl=1.0)
    assert await store.copy(source, [copy]) is True
    await asyncio.sleep(1.5)
    assert await store.load(copy.session_id) is None


async def test_a_session_with_an_idle_ttl_leaves_the_live_count_when_it_expires(make_store: StoreFactory) -> None:
    store = make_store(ttl=3600.0)
    meta = SessionMeta(new_session_id(), "env_a", "scn_1", time.time(), tenant="t-idle", idle_ttl=1.0)
    assert await store.admit("t-idle", [meta.session_id], 10, ttl=1.0) is None
    await store.create(meta, '{"n":0}', '{"n":0}', [])
    assert await store.commit(meta.session_id, 0, None, _rec(1), tenant="t-idle") is True
    assert await store.live("t-idle", 0, 10) == ([meta.session_id], 1)
    await asyncio.sleep(1.5)
    assert await store.live("t-idle", 0, 10) == ([], 0)


async def test_redis_reads_never_stretch_a_sessions_own_idle_ttl(make_redis: StoreFactory,
                                                                raw_redis: redis.Redis) -> None:
    store = make_redis(ttl=3600.0)
    meta = SessionMeta(new_session_id(), "env_a", "scn_1", time.time(), idle_ttl=5.0)
    await store.create(meta, '{"n":0}', '{"n":0}', [])
    await _touch_every_way(store, meta, 0)
    assert await store.commit(meta.session_id, 1, None, _rec(2), idempotency=("k1", "1")) is True
    assert await store.load(meta.session_id) is not None
    for key in Keys(make_redis.prefix or "").session(meta.session_id).data():
        assert 0 < raw_redis.pttl(key) <= 5_000, key


async def test_redis_every_session_key_has_a_real_ttl(make_redis: StoreFactory, raw_redis: redis.Redis) -> None:
    store = make_redis(ttl=30.0)
    prefix = make_redis.prefix or ""
    meta = _meta()
    keys = Keys(prefix).session(meta.session_id)
    await store.create(meta, "{}", "{}", ["r0"])
    for key in keys.data()[:4]:  # the idempotency hash appears with the first keyed commit
        assert raw_redis.exists(key) == 1, key
        assert 0 < raw_redis.pttl(key) <= 30_000, key

    fresh = await _created(store)  # created without trajectory: the list key appears on the first commit
    assert await store.commit(fresh.session_id, 0, '{"n":1}', _rec(1), idempotency=("k1", "1")) is True
    for key in Keys(prefix).session(fresh.session_id).data():
        assert raw_redis.exists(key) == 1, key
        assert 0 < raw_redis.pttl(key) <= 30_000, key

    # nothing under the session namespace lives forever, the held lock included
    async with store.lock(meta.session_id, wait=1, lease=5):
        session_keys = list(raw_redis.scan_iter(match=f"{prefix}:session:*", count=1000))
        assert keys.lock in session_keys
        for key in session_keys:
            assert raw_redis.pttl(key) > 0, key


async def test_redis_load_pushes_the_real_ttl_back(make_redis: StoreFactory, raw_redis: redis.Redis) -> None:
    store = make_redis(ttl=10.0)
    meta = await _created(store, ["r0"])
    keys = Keys(make_redis.prefix or "").session(meta.session_id)
    assert await store.commit(meta.session_id, 0, None, _rec(1), idempotency=("k1", "1")) is True
    await asyncio.sleep(0.5)
    assert all(raw_redis.pttl(k) <= 9_600 for k in keys.data())
    assert await store.load(meta.session_id) is not None
    assert all(raw_redis.pttl(k) > 9_600 for k in keys.data())


# --- delete / trajectory -----------------------------------------------------


async def test_delete_returns_true_then_false(store: SessionStore) -> None:
    meta = await _created(store, ["r1"])
    assert await store.delete(meta.session_id) is True
    assert await store.delete(meta.session_id) is False
    assert await store.load(meta.session_id) is None
    assert await store.trajectory(meta.session_id) is None
    assert await store.commit(meta.session_id, 0, "{}", _rec(1)) is False


async def test_delete_of_unknown_session_returns_false(store: SessionStore) -> None:
    assert await store.delete(new_session_id()) is False


async def test_delete_of_expired_session_returns_false(make_store: StoreFactory) -> None:
    store = make_store(ttl=0.5)
    meta = await _created(store)
    await asyncio.sleep(0.9)
    assert await store.delete(meta.session_id) is False


async def test_delete_leaves_other_sessions_alone(store: SessionStore) -> None:
    gone = await _created(store)
    kept = await _created(store, ["r1"])
    assert await store.delete(gone.session_id) is True
    snap = await store.load(kept.session_id, trajectory=True)
    assert snap is not None
    assert snap.trajectory == ["r1"]


async def test_trajectory_of_unknown_session_is_none(store: SessionStore) -> None:
    assert await store.trajectory(new_session_id()) is None


async def test_trajectory_of_fresh_session_is_empty(store: SessionStore) -> None:
    meta = await _created(store)
    assert await store.trajectory(meta.session_id) == []
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None
    assert snap.trajectory == []


# --- catalog records ---------------------------------------------------------


async def test_put_record_stores_once_and_returns_the_existing_value(store: SessionStore) -> None:
    assert await store.put_record("environments", "env_a", "first") is None
    assert await store.put_record("environments", "env_a", "second") == "first"
    assert await store.get_record("environments", "env_a") == "first"


async def test_get_record_and_all_records(store: SessionStore) -> None:
    assert await store.all_records("environments") == {}
    assert await store.all_records("scenarios") == {}
    assert await store.get_record("environments", "env_a") is None
    assert await store.put_record("environments", "env_a", '{"a":1}') is None
    assert await store.put_record("environments", "env_b", '{"b":2}') is None
    assert await store.put_record("scenarios", "scn_1", '{"s":1}') is None
    assert await store.get_record("environments", "env_b") == '{"b":2}'
    assert await store.get_record("scenarios", "env_a") is None  # kinds are separate namespaces
    assert await store.all_records("environments") == {"env_a": '{"a":1}', "env_b": '{"b":2}'}
    assert await store.all_records("scenarios") == {"scn_1": '{"s":1}'}


async def test_ping_succeeds_on_a_healthy_store(store: SessionStore) -> None:
    assert await store.ping() is None


# --- session ids -------------------------------------------------------------


def test_session_ids_are_unique_and_carry_128_bits() -> None:
    ids = [new_session_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for session_id in ids[:200]:
        assert session_id.startswith("ses_")
        token = session_id[len("ses_"):]
        assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        assert len(raw) >= 16


# --- Redis only --------------------------------------------------------------


async def test_redis_session_keys_share_one_hash_tag_and_the_prefix(
    make_redis: StoreFactory, raw_redis: redis.Redis
) -> None:
    store = make_redis()
    prefix = make_redis.prefix or ""
    meta = await _created(store, ["r0"])
    other = await _created(store)
    assert await store.commit(meta.session_id, 0, '{"n":1}', _rec(1)) is True
    async with store.lock(meta.session_id, wait=1, lease=30):
        present = set(raw_redis.scan_iter(match=f"{prefix}:*", count=1000))
    mine = {k for k in present if meta.session_id in k}
    expected = Keys(prefix).session(meta.session_id)
    assert mine == {expected.meta, expected.state, expected.initial, expected.trajectory, expected.lock}
    # no trajectory yet; the tenant's byte count lives on the tenant's slot
    assert present - mine == {*Keys(prefix).session(other.session_id).data()[:3], Keys(prefix).session_bytes("")}
    for key in present:
        assert key.startswith(prefix + ":"), key
    for key in mine:
        start = key.index("{")
        assert key[start + 1:key.index("}", start)] == meta.session_id, key
    slots = {key_slot(k.encode()) for k in mine}
    assert slots == {key_slot(meta.session_id.encode())}


def assert_unreachable(exc: BaseException) -> None:
    """Ours, not redis-py's, and it says when the store will try Redis again (the 503's Retry-After)."""
    assert isinstance(exc, StoreUnavailable) and not isinstance(exc, redis.RedisError | LockTimeout)
    assert 0 < exc.retry_after <= RECONNECT_LONGEST


async def test_redis_unreachable_raises_store_error(anyio_backend: str) -> None:
    store = RedisStore(DEAD_URL, ttl=60.0, prefix="eftest-dead")
    try:
        meta = _meta()
        with pytest.raises(StoreError) as excinfo:
            await store.ping()
        assert_unreachable(excinfo.value)
        with pytest.raises(StoreError) as excinfo:
            await store.load(meta.session_id)
        assert_unreachable(excinfo.value)
        with pytest.raises(StoreError) as excinfo:
            await store.load(meta.session_id, trajectory=True)
        assert_unreachable(excinfo.value)
        with pytest.raises(StoreError) as excinfo:
            await store.create(meta, "{}", "{}", ["r0"])
        assert_unreachable(excinfo.value)
        with pytest.raises(StoreError):
            await store.commit(meta.session_id, 0, "{}", _rec(1))
        with pytest.raises(StoreError):
            await store.trajectory(meta.session_id)
        with pytest.raises(StoreError):
            await store.delete(meta.session_id)
        with pytest.raises(StoreError):
            await store.put_record("environments", "env_a", "v")
        with pytest.raises(StoreError):
            await store.get_record("environments", "env_a")
        with pytest.raises(StoreError):
            await store.all_records("scenarios")
        with pytest.raises(StoreError) as excinfo:
            async with store.lock(meta.session_id, wait=0.2, lease=1):
                pytest.fail("locked a session on an unreachable Redis")
        assert not isinstance(excinfo.value, LockTimeout)
        # none of these leaked a redis-py exception type
        assert not isinstance(excinfo.value, redis.RedisError)
    finally:
        await store.close()


async def test_redis_two_replicas_see_each_others_sessions_and_commits(make_redis: StoreFactory) -> None:
    first = make_redis()
    second = make_redis()
    meta = await _created(first, ["r0"])
    seen = await second.load(meta.session_id, trajectory=True)
    assert seen is not None
    assert seen.meta == meta
    assert seen.trajectory == ["r0"]

    assert await second.commit(meta.session_id, 0, '{"n":1}', _rec(1)) is True
    assert await first.commit(meta.session_id, 0, '{"n":"stale"}', "stale") is False
    snap = await first.load(meta.session_id, trajectory=True)
    assert snap is not None
    assert snap.meta.step == 1
    assert snap.state == '{"n":1}'
    assert snap.trajectory == ["r0", _rec(1)]

    # the call lock is shared too
    async with first.lock(meta.session_id, wait=1, lease=30):
        with pytest.raises(LockTimeout):
            async with second.lock(meta.session_id, wait=0.2, lease=30):
                pytest.fail("two replicas held the same session lock")

    assert await second.put_record("environments", "env_a", "v1") is None
    assert await first.put_record("environments", "env_a", "v2") == "v1"
    assert await first.all_records("environments") == {"env_a": "v1"}

    assert await first.delete(meta.session_id) is True
    assert await second.load(meta.session_id) is None
    assert await second.delete(meta.session_id) is False


async def test_a_group_is_created_whole_with_one_state(store: SessionStore) -> None:
    metas = [_meta() for _ in range(5)]
    await store.create_group(metas, '{"n":7}', '{"n":0}', ["r0"])
    for meta in metas:
        snap = await store.load(meta.session_id, trajectory=True)
        assert snap is not None
        assert (snap.state, snap.initial, snap.trajectory) == ('{"n":7}', '{"n":0}', ["r0"])
    # the copies are independent: a step on one leaves the others alone
    assert await store.commit(metas[0].session_id, 0, '{"n":8}', _rec(1)) is True
    other = await store.load(metas[1].session_id)
    assert other is not None and other.state == '{"n":7}' and other.meta.step == 0


async def test_an_idempotency_key_is_committed_with_its_step(store: SessionStore) -> None:
    meta = await _created(store)
    assert await store.idempotent(meta.session_id, "key-1") is None
    assert await store.commit(meta.session_id, 0, '{"n":1}', _rec(1), idempotency=("key-1", '{"step":1}')) is True
    assert await store.idempotent(meta.session_id, "key-1") == '{"step":1}'
    # a refused commit (stale step) remembers nothing
    assert await store.commit(meta.session_id, 0, '{"n":2}', _rec(1), idempotency=("key-2", "x")) is False
    assert await store.idempotent(meta.session_id, "key-2") is None
    assert await store.idempotent("ses_missing", "key-1") is None


async def test_done_is_set_by_the_commit_that_ends_a_conversation(store: SessionStore) -> None:
    meta = await _created(store)
    assert await store.commit(meta.session_id, 0, None, _rec(1)) is True
    snap = await store.load(meta.session_id)
    assert snap is not None and snap.meta.done is False
    assert await store.commit(meta.session_id, 1, None, _rec(2), done=True) is True
    snap = await store.load(meta.session_id)
    assert snap is not None and snap.meta.done is True and snap.meta.step == 2


async def test_trajectory_pages(store: SessionStore) -> None:
    meta = await _created(store)
    for step in range(5):
        assert await store.commit(meta.session_id, step, None, _rec(step + 1)) is True
    assert await store.trajectory_page(meta.session_id, 1, 2) == ([_rec(2), _rec(3)], 5)
    assert await store.trajectory_page(meta.session_id, 4, 10) == ([_rec(5)], 5)
    assert await store.trajectory_page(meta.session_id, 9, 10) == ([], 5)
    assert await store.trajectory_page("ses_missing", 0, 10) is None


async def test_a_request_claim_is_taken_once_then_answered_or_released(store: SessionStore) -> None:
    assert await store.claim_request("t:create:k", "pending", 30) is None
    assert await store.claim_request("t:create:k", "again", 30) == "pending"
    await store.finish_request("t:create:k", "answer")
    assert await store.claim_request("t:create:k", "again", 30) == "answer"
    assert await store.claim_request("t:create:other", "pending", 30) is None
    await store.release_request("t:create:other")
    assert await store.claim_request("t:create:other", "second", 30) is None


async def test_live_sessions_are_admitted_within_a_limit_and_forgotten(store: SessionStore) -> None:
    first = [new_session_id() for _ in range(3)]
    assert await store.admit("t1", first, 4) is None
    assert await store.admit("t1", [new_session_id(), new_session_id()], 4) == 3  # all or none
    assert await store.admit("t2", [new_session_id() for _ in range(4)], 4) is None  # tenants apart
    await store.forget("t1", first[:2])
    assert await store.admit("t1", [new_session_id(), new_session_id()], 4) is None
    assert await store.admit("t1", [new_session_id()], 4) is None
    assert await store.admit("t1", [new_session_id()], 4) == 4


async def test_admitted_sessions_expire_from_the_count_unless_used(make_store: StoreFactory) -> None:
    store = make_store(ttl=0.5)
    meta = await _created(store)
    assert await store.admit("t", [meta.session_id, "ses_idle"], 2) is None
    await asyncio.sleep(0.3)
    assert await store.commit(meta.session_id, 0, None, _rec(1), tenant="t") is True  # refreshes its place
    await asyncio.sleep(0.35)
    assert await store.admit("t", ["ses_new"], 2) is None  # the idle one expired, the used one is counted
    assert await store.admit("t", ["ses_more"], 2) == 2


def _tenant_meta(tenant: str) -> SessionMeta:
    return SessionMeta(new_session_id(), "env_a", None, time.time(), tenant=tenant)


async def test_a_tenants_stored_bytes_are_counted_and_a_group_past_its_quota_is_refused_whole(
        store: SessionStore) -> None:
    tenant = f"t-{secrets.token_hex(4)}"
    state, initial = '{"n":' + "1" * 90 + "}", '{"n":0}'
    each = len(state) + len(initial) + len("r0")
    first = _tenant_meta(tenant)
    assert await store.admit(tenant, [first.session_id], 100) is None
    await store.create(first, state, initial, ["r0"], quota=10 * each)
    assert await store.usage(tenant) == each
    group = [_tenant_meta(tenant) for _ in range(10)]
    with pytest.raises(BytesQuota) as refused:
        await store.create_group(group, state, initial, ["r0"], quota=10 * each)
    assert (refused.value.used, refused.value.needed, refused.value.quota) == (each, 10 * each, 10 * each)
    for meta in group:
        assert await store.load(meta.session_id) is None  # nothing of the group was written
    assert await store.usage(tenant) == each
    assert await store.usage(f"other-{tenant}") == 0  # tenants apart


async def test_a_fork_past_the_quota_writes_no_copy(store: SessionStore) -> None:
    tenant = f"t-{secrets.token_hex(4)}"
    source = _tenant_meta(tenant)
    await store.create(source, "x" * 1000, "{}", [])
    copies = [_tenant_meta(tenant) for _ in range(3)]
    with pytest.raises(BytesQuota):
        await store.copy(source, copies, quota=3500)
    for meta in copies:
        assert await store.load(meta.session_id) is None
    assert await store.usage(tenant) == 1002
    assert await store.copy(source, copies[:2], quota=3500) is True
    assert await store.usage(tenant) == 3 * 1002
    assert await store.copy(_tenant_meta(tenant), [_tenant_meta(tenant)], quota=3500) is False  # gone source
    assert await store.usage(tenant) == 3 * 1002


async def test_a_step_past_the_quota_is_refused_and_leaves_the_session_as_it_was(store: SessionStore) -> None:
    tenant = f"t-{secrets.token_hex(4)}"
    meta = _tenant_meta(tenant)
    await store.create(meta, '{"n":0}', '{"n":0}', [])
    assert await store.commit(meta.session_id, 0, '{"n":1}', "r" * 100, tenant=tenant, quota=1000) is True
    used = await store.usage(tenant)
    assert used == 7 + 7 + 100
    with pytest.raises(BytesQuota):
        await store.commit(meta.session_id, 1, '{"n":2}', "r" * 900, tenant=tenant, quota=1000)
    snap = await store.load(meta.session_id, trajectory=True)
    assert snap is not None and snap.meta.step == 1 and snap.state == '{"n":1}' and len(snap.trajectory) == 1
    assert await store.usage(tenant) == used
    # a step that shrinks the state costs what it adds, less what it frees
    assert await store.commit(meta.session_id, 1, "{}", "r", tenant=tenant, quota=1000) is True
    assert await store.usage(tenant) == used + 1 - 5


async def test_forgotten_sessions_and_deleted_records_give_their_bytes_back(store: SessionStore) -> None:
    tenant = f"t-{secrets.token_hex(4)}"
    metas = [_tenant_meta(tenant) for _ in range(2)]
    assert await store.admit(tenant, [m.session_id for m in metas], 10) is None
    await store.create_group(metas, "s" * 50, "i" * 50, [])
    assert await store.put_record("environments", "env_q", "e" * 300, tenant=tenant, quota=600) is None
    assert await store.usage(tenant) == 500
    with pytest.raises(BytesQuota):
        await store.put_record("scenarios", "scn_q", "c" * 101, tenant=tenant, quota=600)
    assert await store.get_record("scenarios", "scn_q", tenant=tenant) is None
    assert await store.put_record("environments", "env_q", "e" * 300, tenant=tenant, quota=600) == "e" * 300
    assert await store.usage(tenant) == 500  # an existing record is not stored, nor counted, twice
    await store.forget(tenant, [metas[0].session_id])
    assert await store.usage(tenant) == 400
    assert await store.delete_record("environments", "env_q", tenant=tenant) is True
    assert await store.usage(tenant) == 100


async def test_expired_sessions_give_their_bytes_back(make_store: StoreFactory) -> None:
    store = make_store(ttl=0.4)
    tenant = f"t-{secrets.token_hex(4)}"
    meta = _tenant_meta(tenant)
    assert await store.admit(tenant, [meta.session_id], 10) is None
    await store.create(meta, "s" * 500, "{}", [])
    assert await store.usage(tenant) == 502
    await asyncio.sleep(0.5)
    assert await store.admit(tenant, [], 10) is None  # (finds the expired session)
    assert await store.usage(tenant) == 0


async def test_sessions_kept_alive_by_reads_alone_stay_counted_until_they_expire(make_store: StoreFactory) -> None:
    """Every read refreshes a session's TTL; the tenant's count of live sessions and of bytes
    follows it, so a tenant cannot hold more than its quota by reading sessions it never steps."""
    store = make_store(ttl=0.6)
    tenant = f"t-{secrets.token_hex(4)}"
    metas = [_tenant_meta(tenant) for _ in range(2)]
    assert await store.admit(tenant, [m.session_id for m in metas], 2) is None
    await store.create_group(metas, "s" * 500, "{}", [])
    for _ in range(5):  # twice the TTL and more, each session read in another way
        await asyncio.sleep(0.25)
        assert await store.load(metas[0].session_id, trajectory=True) is not None
        assert await store.load(metas[1].session_id, blobs=False) is not None
    assert await store.admit(tenant, [new_session_id()], 2) == 2
    assert await store.usage(tenant) == 2 * 502
    assert (await store.live(tenant, 0, 10))[1] == 2
    assert await store.trajectory_page(metas[1].session_id, 0, 1) is not None
    await asyncio.sleep(0.7)  # reads stop: both expire, and give their place and bytes back
    assert await store.admit(tenant, [new_session_id()], 2) is None
    assert await store.usage(tenant) == 0
