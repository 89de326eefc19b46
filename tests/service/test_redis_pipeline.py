"""The call path's own Redis connection: replies reach the right callers, and it recovers from a
Redis that forgot its scripts or dropped the connection."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis

from service.stores.redis import RedisStore
from service.stores.redis.pipeline import pack
from service.stores.store import SessionMeta, StoreError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_commands_are_packed_as_the_protocol_says() -> None:
    assert pack("GET", "k") == b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
    assert pack("SET", "ключ", 12) == b"*3\r\n$3\r\nSET\r\n$8\r\n\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87\r\n$2\r\n12\r\n"
    assert pack("SET", "ключ", b"\xff\r\n") == b"*3\r\n$3\r\nSET\r\n$8\r\n\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87\r\n$3\r\n\xff\r\n\r\n"


async def _session(store: RedisStore, sid: str) -> None:
    await store.create(SessionMeta(sid, "env", None, time.time()), "{}", "{}", [])


async def test_concurrent_calls_each_get_their_own_reply(redis_url: str, key_prefix: str) -> None:
    store = RedisStore(redis_url, prefix=key_prefix)
    ids = [f"ses_{i}" for i in range(40)]
    try:
        for sid in ids:
            await _session(store, sid)

        async def steps(sid: str, count: int) -> int:
            for _ in range(count):
                async with store.begin(sid, 5, 30) as held:
                    assert held.snap is not None and held.snap.meta.session_id == sid
                    assert await store.commit(sid, held.snap.meta.step, json.dumps({"sid": sid}), "{}", held=held)
            return count

        counts = await asyncio.gather(*(steps(sid, 1 + i % 5) for i, sid in enumerate(ids)))
        for sid, count in zip(ids, counts, strict=True):
            snap = await store.load(sid)
            assert snap is not None and snap.meta.step == count and json.loads(snap.state) == {"sid": sid}
    finally:
        await store.close()


async def test_commits_made_in_one_turn_of_the_event_loop_go_out_in_one_write(redis_url: str,
                                                                                 key_prefix: str) -> None:
    """Calls on many sessions commit together: one write to Redis for all the commits the event
    loop made in one turn, each still answered on its own (one refused, as its step is stale)."""
    store = RedisStore(redis_url, prefix=key_prefix)
    ids = [f"ses_{i}" for i in range(12)]
    try:
        for sid in ids:
            await _session(store, sid)
        pipeline = store.redis.pipeline
        assert pipeline is not None
        await store.commit(ids[0], 0, "{}", "{}", unlocked=True)  # (opens the connection)
        writer = pipeline._writer
        assert writer is not None
        writes: list[bytes] = []
        write = writer.write

        def counted(data: Any) -> None:
            writes.append(bytes(data))
            write(data)

        writer.write = counted  # type: ignore[method-assign]
        done = await asyncio.gather(*(store.commit(sid, 1 if sid == ids[0] else 0, json.dumps({"sid": sid}), "{}",
                                                   unlocked=True) for sid in ids))
        assert done == [True] * len(ids)
        assert len(writes) == 1 and writes[0].count(b"EVALSHA") == len(ids)
        assert await store.commit(ids[1], 0, "{}", "{}", unlocked=True) is False  # stale: refused alone
        assert len(writes) == 2
        for sid in ids:
            snap = await store.load(sid)
            assert snap is not None and json.loads(snap.state) == {"sid": sid}
    finally:
        await store.close()


async def test_a_redis_that_forgot_the_scripts_or_dropped_the_connection_is_served_again(
        redis_url: str, key_prefix: str) -> None:
    store = RedisStore(redis_url, prefix=key_prefix)
    admin = redis.Redis.from_url(redis_url)
    try:
        await _session(store, "ses_a")
        admin.script_flush()
        async with store.begin("ses_a", 5, 30) as held:
            assert held.snap is not None
            assert await store.commit("ses_a", 0, None, "{}", held=held)
        assert store.redis.pipeline is not None
        writer = store.redis.pipeline._writer
        assert writer is not None
        host, port = writer.get_extra_info("sockname")[:2]
        admin.client_kill(f"{host}:{port}")  # the lane's connection, as Redis sees it
        for _ in range(3):  # the first meets the closed connection; then the store's retry schedule
            try:
                async with store.begin("ses_a", 5, 30) as held:
                    assert await store.commit("ses_a", held.snap.meta.step, None, "{}", held=held)  # type: ignore[union-attr]
                break
            except StoreError as exc:
                await asyncio.sleep(getattr(exc, "retry_after", 0.5))
        snap = await store.load("ses_a")
        assert snap is not None and snap.meta.step >= 2
    finally:
        admin.close()
        await store.close()


async def test_a_redis_that_never_answers_fails_the_command_and_the_next_one_starts_afresh() -> None:
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from service.stores.redis.pipeline import Pipeline

    connections: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)  # reads nothing back: every command waits
        await reader.read()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pipeline = Pipeline(f"redis://127.0.0.1:{port}/0", timeout=0.3)
    try:
        for attempt in (1, 2):
            with pytest.raises(RedisTimeoutError):
                await pipeline.evalsha("0" * 40, "return 1", ["k"], [])
            assert not pipeline._pending and pipeline._writer is None  # nothing left waiting on it
            assert len(connections) == attempt  # the next command opened a connection of its own
    finally:
        await pipeline.close()
        server.close()
        for writer in connections:
            writer.close()
