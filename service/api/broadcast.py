"""Telling every replica that a session's tools changed, so an MCP listen stream hears it wherever it is.

A turn that brings tools ends on whichever replica got the request, but the client's listen stream
(``subscriptions/listen``) is held by one replica, perhaps another. With a Redis store the replicas
share one pub/sub channel (``Keys.tools_changed``): the replica that ended the turn tells its own
streams directly and publishes ``<origin> <session id>``; every other replica tells its streams on
receipt, and skips its own messages, so no stream hears a change twice.

One channel for all sessions rather than one per session: a replica subscribes once at start-up
instead of once per stream, and the traffic is one short message per turn that brings tools. A
subscription is made before the replica reports ready, so a message published after that reaches
it. Delivery is best-effort, as pub/sub is: a replica cut off from Redis misses what was published
meanwhile (it resubscribes when Redis is back), and ``tools/list`` is right on every replica
regardless. A Redis Cluster is left out: its pub/sub goes through one node and redis-py's async
cluster client has none; there, as with the memory store, streams hear changes made on their own
replica only.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

from redis.exceptions import RedisError

log = logging.getLogger("envfoundry.broadcast")
RESUBSCRIBE_AFTER = 1.0  # seconds between attempts while Redis is unreachable


class Broadcast:
    """Publishes this replica's tool changes and hands other replicas' to ``tell`` (see the module doc)."""

    def __init__(self, client: Any, channel: str, tell: Callable[[str], None]) -> None:
        self.client = client
        self.channel = channel
        self.tell = tell
        self.origin = secrets.token_hex(8)
        self._sending: set[asyncio.Task[None]] = set()  # held, or the loop may drop them half-way

    def publish(self, session_id: str) -> None:
        """Tell the other replicas (a ``Turns.tools_changed`` callback: it must not block the turn's answer)."""
        task = asyncio.get_running_loop().create_task(self._send(session_id))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, session_id: str) -> None:
        try:
            await self.client.publish(self.channel, f"{self.origin} {session_id}")
        except (RedisError, OSError) as exc:
            log.warning("could not tell other replicas that session %s has new tools: %s", session_id, exc)

    def received(self, data: bytes | str) -> None:
        text = data.decode() if isinstance(data, bytes) else data
        origin, _, session_id = text.partition(" ")
        if origin != self.origin and session_id:
            self.tell(session_id)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Subscribed from entry (before the replica serves) to exit."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(self.channel)
        listening = asyncio.create_task(self._listen(pubsub))
        try:
            yield
        finally:
            listening.cancel()
            with suppress(asyncio.CancelledError):
                await listening
            for task in list(self._sending):
                task.cancel()
            with suppress(RedisError, OSError):
                await pubsub.aclose()

    async def _listen(self, pubsub: Any) -> None:
        while True:
            try:
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self.received(message["data"])
            except (RedisError, OSError) as exc:
                log.warning("lost the replicas' channel %s (%s); subscribing again", self.channel, exc)
            await asyncio.sleep(RESUBSCRIBE_AFTER)
            with suppress(RedisError, OSError):
                await pubsub.subscribe(self.channel)


def between_replicas(store: Any, tell: Callable[[str], None]) -> Broadcast | None:
    """A broadcast over ``store``'s Redis, or None for a store that is one replica's (memory) or a cluster."""
    from service.stores.redis import RedisStore

    if not isinstance(store, RedisStore) or store.redis.cluster:
        return None
    return Broadcast(store.redis.client, store.keys.tools_changed(), tell)
