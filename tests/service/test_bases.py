"""Shared initial states (bases): stored once per tenant and digest, named by the sessions that use
them, on the memory store, on Redis and on a Redis Cluster (the ``make_store`` fixtures of
``test_store``), and through the API on several replicas and after a restart."""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import time
from pathlib import Path

import httpx
import pytest
import redis

from sandbox.state.deltas import field
from service.stores.memory_store import MemoryStore
from service.stores.redis.keys import Keys
from service.stores.store import SessionMeta, SessionStore, digest_of, new_session_id
from tests.conftest import Server, start_server
from tests.service.test_store import StoreFactory, make_redis, make_store, raw_redis  # noqa: F401

BIG = json.dumps({"records": {f"R{i:05d}": {"note": "x" * 60, "n": i} for i in range(4000)}},
                 separators=(",", ":"))  # about 300 KB


def _meta(tenant: str) -> SessionMeta:
    return SessionMeta(new_session_id(), "env_a", "scn_1", time.time(), tenant=tenant)


@pytest.mark.anyio
async def test_sessions_of_one_base_read_it_and_change_apart(make_store: StoreFactory) -> None:  # noqa: F811
    store: SessionStore = make_store()
    tenant = f"t-{secrets.token_hex(4)}"
    initial = '{"n":0}'
    metas = [_meta(tenant) for _ in range(3)]
    await store.create_group(metas, initial, initial, [], initial_digest=digest_of(initial))
    for meta in metas:
        snap = await store.load(meta.session_id, trajectory=True)
        assert snap is not None
        assert (snap.state, snap.initial, snap.initial_digest) == (initial, initial, digest_of(initial))
        assert await store.state(meta.session_id) == initial
    assert await store.commit(metas[0].session_id, 0, '{"n":1}', "r1", tenant=tenant) is True
    changed, other = await store.load(metas[0].session_id), await store.load(metas[1].session_id)
    assert changed is not None and other is not None
    assert (changed.state, changed.initial) == ('{"n":1}', initial)  # the base itself never changes
    assert (other.state, other.initial) == (initial, initial)
    # what a session counts for its tenant is what it reads, shared or not (as without bases)
    assert await store.usage(tenant) == 3 * 2 * len(initial) + len("r1")  # (the new state is as long)
    # a copy names the same base
    copies = [_meta(tenant)]
    assert await store.copy(other.meta, copies) is True
    copied = await store.load(copies[0].session_id)
    assert copied is not None and (copied.state, copied.initial_digest) == (initial, digest_of(initial))
    # a session made at another state shares only its initial state
    later = [_meta(tenant)]
    await store.create_group(later, '{"n":5}', initial, ["r1"], initial_digest=digest_of(initial))
    snap = await store.load(later[0].session_id)
    assert snap is not None and (snap.state, snap.initial, snap.initial_digest) == ('{"n":5}', initial,
                                                                                    digest_of(initial))


@pytest.mark.anyio
async def test_a_base_lives_while_its_sessions_are_used_however_they_are_read(
        make_store: StoreFactory) -> None:  # noqa: F811
    store = make_store(ttl=0.6)
    tenant = f"t-{secrets.token_hex(4)}"
    metas = [_meta(tenant) for _ in range(2)]
    await store.create_group(metas, BIG, BIG, [], initial_digest=digest_of(BIG))
    sid = metas[0].session_id
    # each way of touching a session keeps its base, for longer than twice the session TTL
    touches = [lambda: store.load(sid, blobs=False), lambda: store.trajectory_page(sid, 0, 10),
               lambda: store.trajectory(sid)]
    for n in range(9):
        await touches[n % len(touches)]()
        await asyncio.sleep(0.25)
    async with store.begin(sid, wait=1, lease=5) as held:
        assert held.snap is not None
        assert await store.commit(sid, 0, None, "r1", tenant=tenant, held=held) is True
    snap = await store.load(sid)
    assert snap is not None and snap.state == BIG and snap.initial == BIG
    assert await store.load(metas[1].session_id) is None  # the untouched one expired


@pytest.mark.anyio
async def test_the_memory_store_keeps_one_base_and_drops_it_with_its_last_session() -> None:
    store = MemoryStore()
    tenant = "t"
    metas = [_meta(tenant) for _ in range(5)]
    await store.create_group(metas[:2], BIG, BIG, [], initial_digest=digest_of(BIG))
    other_copy = "".join(list(BIG))  # equal text, another object
    await store.create_group(metas[2:], other_copy, other_copy, [], initial_digest=digest_of(BIG))
    snaps = [await store.load(m.session_id) for m in metas]
    assert all(s is not None and s.initial is snaps[0].initial and s.state is snaps[0].initial
               for s in snaps if s is not None)
    assert store.bases(tenant) == 1 and store.bases("other") == 0
    for meta in metas:
        assert await store.delete(meta.session_id) is True
    assert store.bases(tenant) == 0


@pytest.mark.redis
@pytest.mark.anyio
async def test_redis_holds_one_base_and_a_session_made_from_it_holds_only_its_meta(
        make_redis: StoreFactory, raw_redis: redis.Redis) -> None:  # noqa: F811
    store = make_redis()
    prefix = make_redis.prefix or ""
    tenant = f"t-{secrets.token_hex(4)}"
    metas = [_meta(tenant) for _ in range(10)]
    await store.create_group(metas[:4], BIG, BIG, [], initial_digest=digest_of(BIG))
    await store.create_group(metas[4:], BIG, BIG, [], initial_digest=digest_of(BIG))
    base = Keys(prefix).base(tenant, digest_of(BIG))
    assert list(raw_redis.scan_iter(match=f"{prefix}:base:*", count=1000)) == [base]
    assert (raw_redis.memory_usage(base) or 0) >= len(BIG)
    for meta in metas:
        mine = list(raw_redis.scan_iter(match=f"{prefix}:*{meta.session_id}*", count=1000))
        assert mine == [Keys(prefix).session(meta.session_id).meta]
        assert sum(raw_redis.memory_usage(k) or 0 for k in mine) <= 2048
        assert 0 < raw_redis.pttl(mine[0]) <= raw_redis.pttl(base)
    # another replica (a fresh process: nothing cached) reads the state through the base
    second = make_redis()
    snap = await second.load(metas[3].session_id)
    assert snap is not None and snap.state == BIG and snap.initial == BIG
    # a base gone (which only an eviction could do) makes its sessions unreadable, never wrong
    raw_redis.delete(base)
    third = make_redis()
    assert await third.load(metas[5].session_id) is None
    assert await third.state(metas[5].session_id) is None


# --- deltas ------------------------------------------------------------------------------------

def _closed(n: int) -> str:
    return field("records", f"R{n:05d}")


CLOSED = '={"note":"' + "x" * 60 + '","n":%d,"closed":true}'


@pytest.mark.anyio
async def test_a_delta_step_stores_only_its_parts_and_reads_back_composed(
        make_store: StoreFactory) -> None:  # noqa: F811
    store: SessionStore = make_store()
    tenant = f"t-{secrets.token_hex(4)}"
    metas = [_meta(tenant) for _ in range(2)]
    await store.create_group(metas, BIG, BIG, [], initial_digest=digest_of(BIG))
    sid = metas[0].session_id
    expected = json.loads(BIG)
    for n in range(5):
        change = {"set": {_closed(n): CLOSED % n}, "unset": []}
        assert await store.commit(sid, n, None, f"r{n}", tenant=tenant, delta=change) is True
        expected["records"][f"R{n:05d}"]["closed"] = True
    text = json.dumps(expected, separators=(",", ":"))
    snap = await store.load(sid, trajectory=True)
    assert snap is not None and snap.state == text and snap.initial == BIG and snap.meta.step == 5
    assert await store.state(sid) == text
    found = await store.stored(sid)
    assert found is not None and found[0] == text and found[1] == {_closed(n): CLOSED % n for n in range(5)}
    other = await store.stored(metas[1].session_id)
    assert other == (BIG, {})  # its sibling still reads the base alone
    # a copy carries the delta
    copies = [_meta(tenant)]
    assert await store.copy(snap.meta, copies) is True
    assert await store.state(copies[0].session_id) == text
    # a step back removes a part from the delta, and the state is the base's again there
    assert await store.commit(sid, 5, None, "r5", tenant=tenant,
                              delta={"set": {}, "unset": [_closed(n) for n in range(5)]}) is True
    assert await store.stored(sid) == (BIG, {})
    # a rebase makes the state a new base, shared by digest, and empties the delta
    assert await store.commit(sid, 6, text, "r6", tenant=tenant, new_base=digest_of(text)) is True
    assert await store.stored(sid) == (text, {})
    assert await store.commit(sid, 7, None, "r7", tenant=tenant,
                              delta={"set": {field("count"): "+1:3"}, "unset": []}) is True
    assert await store.state(sid) == text[:-1] + ',"count":3}'
    initial = await store.load(sid)
    assert initial is not None and initial.initial == BIG  # the initial state stays the first base
    # a whole state makes it the session's own again: a delta then is refused, nothing changes
    assert await store.commit(sid, 8, '{"n":1}', "r8", tenant=tenant) is True
    assert await store.stored(sid) == ('{"n":1}', None)
    assert await store.commit(sid, 9, None, "r9", tenant=tenant, delta={"set": {field("n"): "=2"}, "unset": []}) is False
    after = await store.load(sid, trajectory=True)
    assert after is not None and (after.state, after.meta.step, len(after.trajectory)) == ('{"n":1}', 9, 9)
    assert await store.stored(metas[1].session_id) == (BIG, {})


@pytest.mark.anyio
async def test_a_delta_that_does_not_fit_the_base_harms_only_its_own_session(
        make_store: StoreFactory) -> None:  # noqa: F811
    store: SessionStore = make_store()
    tenant = f"t-{secrets.token_hex(4)}"
    metas = [_meta(tenant) for _ in range(2)]
    await store.create_group(metas, BIG, BIG, [], initial_digest=digest_of(BIG))
    forged = {"set": {field("nowhere", "x"): "=1"}, "unset": []}  # well formed, but fits no base
    assert await store.commit(metas[0].session_id, 0, None, "r1", tenant=tenant, delta=forged) is True
    assert await store.state(metas[0].session_id) is None  # unreadable, as if gone
    assert await store.load(metas[0].session_id) is None
    assert await store.state(metas[1].session_id) == BIG


@pytest.mark.redis
@pytest.mark.anyio
async def test_redis_a_session_after_five_delta_steps_holds_kilobytes_not_its_state(
        make_redis: StoreFactory, raw_redis: redis.Redis) -> None:  # noqa: F811
    store = make_redis()
    prefix = make_redis.prefix or ""
    tenant = f"t-{secrets.token_hex(4)}"
    meta = _meta(tenant)
    await store.create(meta, "{}", "{}", [])  # (a neighbour with a state of its own)
    metas = [_meta(tenant)]
    await store.create_group(metas, BIG, BIG, [], initial_digest=digest_of(BIG))
    sid = metas[0].session_id
    for n in range(5):
        assert await store.commit(sid, n, None, "r", tenant=tenant,
                                  delta={"set": {_closed(n): CLOSED % n}, "unset": []}) is True
    keys = Keys(prefix).session(sid)
    mine = set(raw_redis.scan_iter(match=f"{prefix}:*{sid}*", count=1000))
    assert mine == {keys.meta, keys.delta, keys.trajectory}
    held = sum(raw_redis.memory_usage(k) or 0 for k in mine if k != keys.trajectory)
    assert held <= 4096 and len(BIG) > 250_000
    assert 0 < raw_redis.pttl(keys.delta) <= 3600_000
    # another replica composes the same text from the base and the delta
    assert await make_redis().state(sid) == await store.state(sid)


# --- through the API ---------------------------------------------------------------------------

WORLD = '''
class World:
    def __init__(self, config=None):
        size = (config or {}).get("size", 3)
        self.records = {f"R{i:05d}": {"status": "open", "note": "x" * 60} for i in range(size)}

    def close(self, record_id: str) -> dict:
        """Close a record.

        Args:
            record_id: its id
        """
        self.records[record_id]["status"] = "closed"
        return {"ok": True}

    def read(self, record_id: str) -> dict:
        """Read a record.

        Args:
            record_id: its id
        """
        return self.records[record_id]

    def add(self, record_id: str) -> dict:
        """Add a record at the end.

        Args:
            record_id: its id
        """
        self.records[record_id] = {"status": "new", "note": ""}
        return {"ok": True}

    def drop(self, record_id: str) -> dict:
        """Remove a record.

        Args:
            record_id: its id
        """
        del self.records[record_id]
        return {"ok": True}

    def close_all(self) -> dict:
        """Close every record (a change as large as the state)."""
        for record in self.records.values():
            record["status"] = "closed"
        return {"ok": True}
'''


def _setup(client: httpx.Client, suffix: str = "") -> None:
    added = client.post("/v1/environments", json={"env_id": f"world_bases{suffix}", "class_name": "World",
                                                  "code": WORLD})
    assert added.status_code in (200, 201), added.text
    scenario = {"scenario_id": f"world-bases{suffix}", "env_id": f"world_bases{suffix}", "task": "Close records.",
                "init_config": {"size": 3000},
                "checklist": [{"item": "R00000 closed",
                               "check": "def check_func(final_state):\n    return final_state['records']"
                                        "['R00000']['status'] == 'closed'"}]}
    answer = client.post("/v1/scenarios", json=scenario)
    assert answer.status_code in (200, 201), answer.text


def _state(client: httpx.Client, sid: str) -> dict[str, object]:
    answer = client.get(f"/v1/sessions/{sid}/state")
    assert answer.status_code == 200, answer.text
    state: dict[str, object] = answer.json()["state"]
    return state


@pytest.mark.redis
def test_sessions_from_a_scenario_share_its_initial_state_across_replicas_and_restarts(
        tmp_path: Path, redis_url: str) -> None:
    prefix = f"eftest-{secrets.token_hex(4)}"
    env = {"ENVFOUNDRY_KEY_PREFIX": prefix}
    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    first: Server = start_server(tmp_path, redis_url=redis_url, extra_env=env)
    second: Server = start_server(tmp_path, redis_url=redis_url, extra_env=env)
    try:
        with first.client() as a, second.client() as b:
            _setup(a)
            made = [a.post("/v1/sessions", json={"scenario_id": "world-bases"}).json()["session_id"]
                    for _ in range(4)]
            group = a.post("/v1/sessions", json={"scenario_id": "world-bases", "n": 3}).json()["session_ids"]
            bases = list(raw.scan_iter(match=f"{prefix}:base:*", count=1000))
            assert len(bases) == 1 and raw.strlen(bases[0]) > 200_000
            for sid in [*made, *group]:
                keys = list(raw.scan_iter(match=f"{prefix}:*{sid}*", count=1000))
                assert sum(raw.memory_usage(k) or 0 for k in keys) <= 4096, keys
            initial = _state(a, made[0])
            # the other replica serves a session it never saw: state, a call, its score
            assert _state(b, group[1]) == initial
            assert b.post(f"/v1/sessions/{group[1]}/calls",
                          json={"name": "close", "arguments": {"record_id": "R00000"}}).status_code == 200
            assert b.post(f"/v1/sessions/{group[1]}/score").json()["reward"] == 1.0
            assert a.post(f"/v1/sessions/{made[1]}/score").json()["reward"] == 0.0
            assert _state(a, group[1])["records"]["R00000"] == {"status": "closed", "note": "x" * 60}  # type: ignore[index]
            assert _state(a, group[2]) == initial  # its group siblings are as they were
            # five one-record writes: the session holds the records it changed, not its state
            for n in range(1, 6):
                _do(b if n % 2 else a, group[1], "close", record_id=f"R{n:05d}")
            keys = Keys(prefix).session(group[1])
            assert raw.exists(keys.state) == 0 and raw.hlen(keys.delta) == 6
            held = sum(raw.memory_usage(k) or 0 for k in (keys.meta, keys.delta))
            assert held <= 8192, held
            written = _state(b, group[1])
            assert [n for n, r in written["records"].items() if r["status"] == "closed"] == [  # type: ignore[attr-defined]
                f"R{n:05d}" for n in range(6)]
            forked = a.post(f"/v1/sessions/{group[1]}/fork", json={"step": 0}).json()["session_ids"][0]
            assert _state(b, forked) == initial
            # a fork at a past step shares the base too, and holds the records changed by then
            past = a.post(f"/v1/sessions/{group[1]}/fork", json={"step": 3}).json()["session_ids"][0]
            past_keys = Keys(prefix).session(past)
            assert raw.exists(past_keys.state) == 0 and raw.hlen(past_keys.delta) == 3
            at_three = _state(b, past)
            assert [n for n, r in at_three["records"].items() if r["status"] == "closed"] == [  # type: ignore[attr-defined]
                f"R{n:05d}" for n in range(3)]
            assert sum(raw.memory_usage(k) or 0 for k in (past_keys.meta, past_keys.delta)) <= 8192
            _do(b, past, "close", record_id="R00007")  # and goes on from there by deltas
            assert raw.exists(past_keys.state) == 0 and raw.hlen(past_keys.delta) == 4
    finally:
        first.stop()
        second.stop()
    third = start_server(tmp_path, redis_url=redis_url, extra_env=env)
    try:
        with third.client() as c:
            assert _state(c, made[2]) == initial
            assert _state(c, group[1]) == written  # rebuilt from the base and the delta
            answer = c.post(f"/v1/sessions/{made[2]}/calls", json={"name": "close", "arguments": {"record_id": "R00001"}})
            assert answer.status_code == 200 and answer.json()["ok"] is True, answer.text
            _do(c, group[1], "close", record_id="R00009")  # a cold session goes on from its delta
            # a change as large as the state rebases the session on a base of its own
            _do(c, group[1], "close_all")
            keys = Keys(prefix).session(group[1])
            assert raw.exists(keys.state) == 0 and raw.exists(keys.delta) == 0
            assert len(list(raw.scan_iter(match=f"{prefix}:base:*", count=1000))) == 2
            _do(c, group[1], "add", record_id="Z")
            assert raw.hlen(keys.delta) == 1
            final = _state(c, group[1])
            assert list(final["records"])[-1] == "Z" and all(  # type: ignore[call-overload]
                r["status"] == "closed" for k, r in final["records"].items() if k != "Z")  # type: ignore[attr-defined]
    finally:
        third.stop()
        keys = list(raw.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            raw.delete(*keys)
        raw.close()


def _do(client: httpx.Client, sid: str, name: str, **arguments: str) -> None:
    answer = client.post(f"/v1/sessions/{sid}/calls", json={"name": name, "arguments": arguments})
    assert answer.status_code == 200 and answer.json()["ok"] is True, answer.text


def test_writes_kept_as_deltas_read_back_exactly_and_a_large_change_rebases(client: httpx.Client) -> None:
    suffix = secrets.token_hex(3)
    _setup(client, suffix)
    sid = client.post("/v1/sessions", json={"scenario_id": f"world-bases{suffix}"}).json()["session_id"]
    other = client.post("/v1/sessions", json={"scenario_id": f"world-bases{suffix}"}).json()["session_id"]
    expected = _state(client, sid)
    records: dict[str, dict[str, str]] = expected["records"]  # type: ignore[assignment]
    rng = random.Random(7)
    for n in range(40):
        op = rng.choice(["close", "add", "drop", "read"])
        key = f"R{rng.randrange(3000):05d}"
        if op == "add":
            key = f"N{n:03d}"
            records[key] = {"status": "new", "note": ""}
        elif op == "drop":
            if key not in records:
                continue
            del records[key]
        elif key not in records:
            continue
        elif op == "close":
            records[key]["status"] = "closed"
        _do(client, sid, op, record_id=key)
        if n % 8 == 0:
            assert _state(client, sid) == expected, n  # (JSON objects compare in order too below)
    assert list(_state(client, sid)["records"]) == list(records)  # type: ignore[call-overload]
    _do(client, sid, "close_all")
    for record in records.values():
        record["status"] = "closed"
    _do(client, sid, "add", record_id="Z")
    records["Z"] = {"status": "new", "note": ""}
    assert _state(client, sid) == expected
    assert list(_state(client, sid)["records"]) == list(records)  # type: ignore[call-overload]
    assert client.post(f"/v1/sessions/{sid}/score").json()["reward"] == 1.0
    assert _state(client, other)["records"]["R00000"]["status"] == "open"  # type: ignore[index]
    back = client.get(f"/v1/sessions/{sid}/state", params={"step": 0})
    assert back.status_code == 200 and back.json()["state"] == _state(client, other)
